/*
 * capture.c - the verdict on a call inside a CUDA graph capture (tide_capture_readiness_t),
 * shared by core's bookkeeping (api/capture.c) and the fabrics' own checks (capture_check):
 * every blocker is a bit, and the reason is the sentence of the first one in bit order, so
 * that the answer does not depend on which layer looked first.
 */
#include "fabric/fabric.h"

#include <stdarg.h>
#include <stdio.h>

void tide_capture_block(tide_capture_readiness_t *v, uint32_t bit, const char *fmt, ...) {
    /* No blocker of this bit or a lower one yet: an equal bit keeps its first sentence. */
    const bool first = (v->blockers & (bit | (bit - 1))) == 0;
    v->blockers |= bit;
    if (!first) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->reason, sizeof(v->reason), fmt, ap);
    va_end(ap);
}
