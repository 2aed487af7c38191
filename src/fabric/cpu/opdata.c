/*
 * opdata.c - the data effect of one bound op on host memory: the bytes a COPY, COPY2D, ZERO,
 * CAST, SUM or LAND moves or computes.  Waits, signals and events are the caller's: the
 * interpreter (interp.c) orders them, and a test that drives ops under another schedule
 * (tests/unit/test_rails_data.c) moves the same bytes through this one path.
 *
 * Direct mode's argument rewrites are applied here, from an optional direct context, rather
 * than in the interpreter: each of them belongs to one op kind, so inside the switch they cost
 * one NULL test each, whereas kept in the interpreter they would need a second switch on the
 * kind (and a second binding of the SUM and LAND tables) around this call.  Whether direct mode
 * skips an op altogether stays the interpreter's decision: a skipped op still signals.
 */
#include "core/checks.h"
#include "fabric/cpu/cpu.h"

#include <string.h>

static void copy_2d(const tide_op_t *op, const tide_bound_op_t *bo) {
    uint8_t *dst = bo->dst;
    const uint8_t *src = bo->src;
    for (uint64_t r = 0; r < op->rows; ++r)
        memcpy(dst + r * op->dst_pitch, src + r * op->src_pitch, op->bytes);
}

tide_result_t tide_cpu_op_data(tide_cpu_direct_prog_t *dp, const tide_binding_t *b,
                               const tide_program_t *prog, tide_queue_t q, int index,
                               const tide_bound_op_t *bo) {
    const tide_op_t *op = &prog->ranks[b->rank].queues[q].ops[index];
    switch (op->kind) {
    case TIDE_OP_COPY:
    case TIDE_OP_COPY2D: {
        tide_bound_op_t c = *bo; /* direct mode may read the copy from elsewhere */
        if (dp != NULL) TIDE_CHECK(tide_cpu_direct_copy(dp, b, q, index, &c));
        if (op->kind == TIDE_OP_COPY2D)
            copy_2d(op, &c);
        else if (op->bytes > 0)
            memcpy(c.dst, c.src, op->bytes);
        return TIDE_SUCCESS;
    }
    case TIDE_OP_ZERO:
        if (op->bytes > 0) memset(bo->dst, 0, op->bytes);
        return TIDE_SUCCESS;
    case TIDE_OP_CAST:
        tide_cpu_cast_bf16(bo->src, bo->dst, op->bytes / 2);
        return TIDE_SUCCESS;
    case TIDE_OP_SUM: {
        tide_sum_args_t a;
        TIDE_CHECK(tide_bind_sum(b, prog, q, index, &a));
        if (dp != NULL) TIDE_CHECK(tide_cpu_direct_sum(dp, b, q, index, &a));
        tide_cpu_sum(&a);
        return TIDE_SUCCESS;
    }
    case TIDE_OP_LAND: {
        tide_land_args_t a;
        TIDE_CHECK(tide_bind_land(b, prog, q, index, &a));
        if (dp != NULL) TIDE_CHECK(tide_cpu_direct_land(dp, b, q, index, &a));
        tide_cpu_land(&a);
        return TIDE_SUCCESS;
    }
    case TIDE_OP_SIGNAL:
    case TIDE_OP_WAIT:
    case TIDE_OP_EVENT:
        return TIDE_SUCCESS; /* no data */
    default:
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cpu fabric: rank %d queue %s op %d: kind %d has no data path", b->rank,
                        tide_queue_name(q), index, (int)op->kind);
    }
}
