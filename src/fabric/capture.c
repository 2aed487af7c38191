/*
 * capture.c - the verdict on a call inside a CUDA graph capture, formed by core's
 * bookkeeping (api/capture.c) and the fabrics' own checks (capture_check) together: every
 * blocker is a bit with the first sentence found for it, and the reason lists them in the
 * order of the bits, so that the answer does not depend on which layer looked first.
 */
#include "fabric/fabric.h"

#include "core/checks.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void tide_capture_block(tide_capture_verdict_t *v, uint32_t bit, const char *fmt, ...) {
    const int i = __builtin_ctz(bit);
    if (i >= TIDE_CAPTURE_BLOCKERS || (v->blockers & bit) != 0) {
        v->blockers |= bit;
        return;
    }
    v->blockers |= bit;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->why[i], sizeof(v->why[i]), fmt, ap);
    va_end(ap);
}

void tide_capture_reason(const tide_capture_verdict_t *v, char *buf, size_t size) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < TIDE_CAPTURE_BLOCKERS && at < size; ++i) {
        if ((v->blockers & (1u << i)) == 0) continue;
        const int n = snprintf(buf + at, size - at, "%s%s", at > 0 ? "; " : "", v->why[i]);
        if (n < 0) break;
        at += (size_t)n;
    }
}

tide_result_t tide_capture_refuse(const tide_capture_verdict_t *v, const char *prefix) {
    if (v->blockers == 0) return TIDE_SUCCESS;
    char why[TIDE_CAPTURE_REASON_MAX];
    tide_capture_reason(v, why, sizeof(why));
    return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "%s%s", prefix, why);
}
