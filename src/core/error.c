/* error.c - result strings, the per-thread last error, and the logger. */
#include "core/checks.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static _Thread_local char last_error[TIDE_ERROR_BYTES];

static const char *const result_strings[TIDE_RESULT_COUNT] = {
    [TIDE_SUCCESS] = "success",
    [TIDE_ERR_INVALID_ARGUMENT] = "invalid argument",
    [TIDE_ERR_UNSUPPORTED] = "unsupported configuration (fall back to stock collectives)",
    [TIDE_ERR_NO_MEMORY] = "out of host memory",
    [TIDE_ERR_OVERFLOW] = "size overflows 64 bits",
    [TIDE_ERR_PLAN_REJECTED] = "plan rejected: schedule collides or leaves stale blocks",
    [TIDE_ERR_INTERNAL] = "internal error",
    [TIDE_ERR_TIMEOUT] = "wait deadline missed (fail-stop)",
    [TIDE_ERR_FABRIC] = "fabric error",
    [TIDE_ERR_CHECK_FAILED] = "program check failed",
    [TIDE_ERR_DATA_MISMATCH] = "data mismatch",
};

const char *tide_get_error_string(tide_result_t result) {
    if ((int)result < 0 || result >= TIDE_RESULT_COUNT) return "unknown result code";
    return result_strings[result];
}

const char *tide_get_last_error(void) { return last_error; }

tide_result_t tide_get_version(int *version_out) {
    if (version_out == NULL) return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "version_out is NULL");
    *version_out = TIDE_VERSION_CODE;
    return TIDE_SUCCESS;
}

void tide_error_clear(void) { last_error[0] = '\0'; }

void tide_error_restore(const char *msg) {
    if (msg != last_error) snprintf(last_error, sizeof(last_error), "%s", msg);
}

/* TIDE_DEBUG is read once per process; a race on first use stores the same value twice
 * (atomically, so that concurrent first errors of several rank threads are well defined). */
static tide_log_level_t log_level(void) {
    static _Atomic int cached = -1;
    int level = atomic_load_explicit(&cached, memory_order_relaxed);
    if (level < 0) {
        const char *env = getenv("TIDE_DEBUG");
        int l = TIDE_LOG_WARN;
        if (env != NULL) {
            if (strcasecmp(env, "NONE") == 0) l = TIDE_LOG_NONE;
            else if (strcasecmp(env, "INFO") == 0) l = TIDE_LOG_INFO;
            else if (strcasecmp(env, "TRACE") == 0) l = TIDE_LOG_TRACE;
        }
        level = l;
        atomic_store_explicit(&cached, level, memory_order_relaxed);
    }
    return (tide_log_level_t)level;
}

static const char *basename_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

void tide_log(tide_log_level_t level, const char *file, int line, const char *fmt, ...) {
    if (level > log_level()) return;
    static const char *const names[] = {"NONE", "WARN", "INFO", "TRACE"};
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "TIDE %s %s:%d %s\n", names[level], basename_of(file), line, msg);
}

tide_result_t tide_error_set(tide_result_t code, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    tide_log(TIDE_LOG_WARN, file, line, "%s: %s", tide_get_error_string(code), last_error);
    return code;
}
