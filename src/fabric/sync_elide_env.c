/*
 * sync_elide_env.c - TIDE_SYNC_ELIDE, the switch of the synchronisation elision in fused
 * direct mode (program/sync_elide.h; docs/sync-elide.md), read by every fabric that runs it.
 */
#include "core/checks.h"
#include "fabric/fabric.h"

#include <stdlib.h>
#include <string.h>

tide_result_t tide_fabric_sync_elide_env(bool *on_out) {
    const char *e = getenv("TIDE_SYNC_ELIDE");
    if (e == NULL || e[0] == '\0' || strcmp(e, "1") == 0) {
        *on_out = true;
        return TIDE_SUCCESS;
    }
    if (strcmp(e, "0") == 0) {
        *on_out = false;
        return TIDE_SUCCESS;
    }
    return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "TIDE_SYNC_ELIDE is \"%s\" (0 or 1)", e);
}
