/*
 * timeout.c - the deadline of every fabric wait and handshake, from TIDE_TIMEOUT_MS.
 */
#include "core/checks.h"
#include "fabric/fabric.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;
static char warned[64]; /* the last invalid value warned about */

/* Say once per distinct invalid value what was used instead. */
static void warn_invalid(const char *env) {
    pthread_mutex_lock(&warn_lock);
    const bool fresh = strncmp(warned, env, sizeof(warned) - 1) != 0;
    if (fresh) snprintf(warned, sizeof(warned), "%s", env);
    pthread_mutex_unlock(&warn_lock);
    if (fresh)
        tide_log(TIDE_LOG_WARN, __FILE__, __LINE__,
                 "TIDE_TIMEOUT_MS = '%s' is not a positive integer of milliseconds; using the "
                 "default %d ms",
                 env, TIDE_TIMEOUT_MS_DEFAULT);
}

int64_t tide_fabric_timeout_ms(void) {
    const char *env = getenv("TIDE_TIMEOUT_MS");
    if (env == NULL || *env == '\0') return TIDE_TIMEOUT_MS_DEFAULT;
    char *end = NULL;
    long long v = strtoll(env, &end, 10);
    if (end == env || *end != '\0' || v <= 0) {
        warn_invalid(env);
        return TIDE_TIMEOUT_MS_DEFAULT;
    }
    /* Deadlines are formed in nanoseconds: clamp to about 24 days. */
    return v > INT32_MAX ? (int64_t)INT32_MAX : (int64_t)v;
}
