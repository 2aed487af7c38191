/*
 * env.c - the fabrics' switches read from the environment: one value of a fixed list, the
 * first the default when the variable is unset or empty, anything else refused with the
 * list named (a typo must not silently run another path).
 */
#include "core/checks.h"
#include "fabric/fabric.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tide_result_t tide_fabric_env_choice(const char *name, const char *const *values, int count,
                                     int *index_out) {
    const char *e = getenv(name);
    if (e == NULL || e[0] == '\0') {
        *index_out = 0;
        return TIDE_SUCCESS;
    }
    char list[128] = "";
    size_t used = 0;
    for (int i = 0; i < count; ++i) {
        if (strcmp(e, values[i]) == 0) {
            *index_out = i;
            return TIDE_SUCCESS;
        }
        const int k = snprintf(list + used, sizeof(list) - used, "%s%s", i ? ", " : "", values[i]);
        if (k > 0 && (size_t)k < sizeof(list) - used) used += (size_t)k;
    }
    return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "%s is \"%s\" (one of: %s)", name, e, list);
}

tide_result_t tide_fabric_sync_elide_env(bool default_on, bool *on_out) {
    static const char *const values[] = {"default", "1", "0"};
    int i = 0;
    TIDE_CHECK(tide_fabric_env_choice("TIDE_SYNC_ELIDE", values, 3, &i));
    *on_out = i == 0 ? default_on : i == 1;
    return TIDE_SUCCESS;
}

tide_result_t tide_fabric_batch_kernel_env(int default_unroll, int default_streaming,
                                           int *unroll_out, int *streaming_out) {
    static const char *const values[] = {"default", "4", "8", "16", "4cs", "8cs", "16cs"};
    static const int unroll[] = {0, 4, 8, 16, 4, 8, 16};
    int i = 0;
    TIDE_CHECK(tide_fabric_env_choice("TIDE_CUDA_BATCH_KERNEL", values, 7, &i));
    *unroll_out = i == 0 ? default_unroll : unroll[i];
    *streaming_out = i == 0 ? default_streaming : i >= 4;
    return TIDE_SUCCESS;
}

tide_result_t tide_fabric_wait_runs_env(bool *on_out) {
    static const char *const values[] = {"1", "0"};
    int i = 0;
    TIDE_CHECK(tide_fabric_env_choice("TIDE_CUDA_MP_WAIT_RUNS", values, 2, &i));
    *on_out = i == 0;
    return TIDE_SUCCESS;
}
