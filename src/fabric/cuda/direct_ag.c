/*
 * direct_ag.c - the all-gather's rail puts that direct mode leaves out when sender and
 * target share a device (TIDE_CUDA_DIRECT_AG; docs/cuda-fabric.md, "Direct mode"): the
 * device half.  Which puts are elided and which copies read the sender's shard instead is
 * program analysis (program/direct_ag.c, with each rank's device as its memory domain).
 *
 * Here: each reader's source is rebound per call to the sender's shard at the put's offset
 * (tide_cuda_direct_ag_sources), and, because the targets now read r's shard during their
 * own calls, r's call-done event is recorded on r's caller stream only after the call of
 * every target of an elided put of r ended (ag_wait; enqueue epilogue, execute.c), and the
 * caller stream waits for them too, so that whatever the caller does with the shard after
 * the call, and r's next call, follow the last read.
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"

#include <stdlib.h>
#include <string.h>

void tide_cuda_direct_ag_free(tide_cuda_prepared_t *pp) {
    pp->ag_src = NULL;
    pp->ag_wait = NULL;
    pp->direct_ag = false;
}

tide_result_t tide_cuda_direct_ag_prepare(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                          const tide_program_t *prog) {
    if (prog->coll != TIDE_COLL_ALL_GATHER || !(sh->direct & TIDE_CUDA_DIRECT_AG) ||
        prog->plan->config.nodes < 2)
        return TIDE_SUCCESS;
    TIDE_CHECK(tide_cuda_direct_analyse(sh, pp, prog, TIDE_CUDA_DIRECT_AG));
    if (!pp->dir.ag) return TIDE_SUCCESS;
    pp->elide = pp->dir.elide;
    pp->ag_src = pp->dir.ag_src;
    pp->ag_wait = pp->dir.ag_wait;
    pp->direct_ag = true;
    return TIDE_SUCCESS;
}

void tide_cuda_direct_ag_sources(tide_cuda_prepared_t *pp) {
    if (!pp->direct_ag) return;
    for (int id = 0; id < pp->sched.num_ops; ++id) {
        const tide_direct_ag_src_t *a = &pp->ag_src[id];
        if (a->put < 0) continue;
        /* The put's source as bound for this call: the sender's shard at the put's offset. */
        pp->bound[id].op.src = (const uint8_t *)pp->bound[a->put].op.src + a->delta;
    }
}
