/*
 * timeout.c - the deadline of every fabric wait and handshake, from TIDE_TIMEOUT_MS, and of
 * a world's join, from TIDE_JOIN_TIMEOUT_MS.
 */
#include "core/checks.h"
#include "fabric/fabric.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;
static char warned[64]; /* the last invalid value warned about */

/* Say once per distinct invalid value what was used instead. */
static void warn_invalid(const char *name, const char *env, int64_t dflt) {
    char key[sizeof(warned)];
    snprintf(key, sizeof(key), "%s=%s", name, env);
    pthread_mutex_lock(&warn_lock);
    const bool fresh = strncmp(warned, key, sizeof(warned) - 1) != 0;
    if (fresh) snprintf(warned, sizeof(warned), "%s", key);
    pthread_mutex_unlock(&warn_lock);
    if (fresh)
        tide_log(TIDE_LOG_WARN, __FILE__, __LINE__,
                 "%s = '%s' is not a positive integer of milliseconds; using the default %lld "
                 "ms",
                 name, env, (long long)dflt);
}

/* Milliseconds of environment variable `name`, or `dflt` when unset, empty or invalid (the
 * invalid value warned about). */
static int64_t env_ms(const char *name, int64_t dflt) {
    const char *env = getenv(name);
    if (env == NULL || *env == '\0') return dflt;
    char *end = NULL;
    long long v = strtoll(env, &end, 10);
    if (end == env || *end != '\0' || v <= 0) {
        warn_invalid(name, env, dflt);
        return dflt;
    }
    /* Deadlines are formed in nanoseconds: clamp to about 24 days. */
    return v > INT32_MAX ? (int64_t)INT32_MAX : (int64_t)v;
}

int64_t tide_fabric_timeout_ms(void) {
    return env_ms("TIDE_TIMEOUT_MS", TIDE_TIMEOUT_MS_DEFAULT);
}

int64_t tide_fabric_join_timeout_ms(void) {
    const int64_t calls = tide_fabric_timeout_ms();
    return env_ms("TIDE_JOIN_TIMEOUT_MS",
                  calls > TIDE_JOIN_TIMEOUT_MS_DEFAULT ? calls : TIDE_JOIN_TIMEOUT_MS_DEFAULT);
}
