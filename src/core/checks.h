/*
 * checks.h - error handling and logging, in the spirit of NCCL's checks.h.
 *
 * A failure is reported once, where it is detected (TIDE_ERR), and then only propagated
 * (TIDE_CHECK / TIDE_CHECK_GOTO), so that a user sees one line naming file:line and the
 * reason, never a cascade.
 */
#ifndef TIDE_CORE_CHECKS_H_
#define TIDE_CORE_CHECKS_H_

#include "tide.h"

#include <stdarg.h>

typedef enum {
    TIDE_LOG_NONE = 0,
    TIDE_LOG_WARN = 1,
    TIDE_LOG_INFO = 2,
    TIDE_LOG_TRACE = 3
} tide_log_level_t;

/* Log a line at a level (TIDE_DEBUG=NONE|WARN|INFO|TRACE, default WARN). */
void tide_log(tide_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Record the thread's last error message, log it at WARN, and return the code. */
tide_result_t tide_error_set(tide_result_t code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Clear the thread's last error (called on entry of public calls). */
void tide_error_clear(void);

/* The size of the thread's last-error message, terminator included. */
#define TIDE_ERROR_BYTES 512

/* Put back a last-error message saved from tide_get_last_error(), without logging it again:
 * for a failure held while later steps, which may report errors of their own, still run. */
void tide_error_restore(const char *msg);

/* Report a new error here: logs once and evaluates to the code. */
#define TIDE_ERR(code, ...) tide_error_set((code), __FILE__, __LINE__, __VA_ARGS__)

#define TIDE_WARN(...) tide_log(TIDE_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define TIDE_INFO(...) tide_log(TIDE_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define TIDE_TRACE(...) tide_log(TIDE_LOG_TRACE, __FILE__, __LINE__, __VA_ARGS__)

/* Propagate an already-reported error. */
#define TIDE_CHECK(call)                                                                        \
    do {                                                                                        \
        tide_result_t tide_res_ = (call);                                                       \
        if (tide_res_ != TIDE_SUCCESS) return tide_res_;                                        \
    } while (0)

/* Propagate into a cleanup ladder: sets res and jumps to label. */
#define TIDE_CHECK_GOTO(call, res, label)                                                       \
    do {                                                                                        \
        (res) = (call);                                                                         \
        if ((res) != TIDE_SUCCESS) goto label;                                                  \
    } while (0)

/* Validate an argument; report TIDE_ERR_INVALID_ARGUMENT with a message when false. */
#define TIDE_ARG_CHECK(cond, ...)                                                               \
    do {                                                                                        \
        if (!(cond)) return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, __VA_ARGS__);                   \
    } while (0)

/* Overflow-checked 64-bit arithmetic: false on overflow. */
static inline int tide_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline int tide_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
static inline uint64_t tide_div_ceil_u64(uint64_t a, uint64_t b) {
    return a / b + (a % b != 0);
}
static inline uint64_t tide_align_up_u64(uint64_t a, uint64_t align) {
    return tide_div_ceil_u64(a, align) * align;
}

#endif /* TIDE_CORE_CHECKS_H_ */
