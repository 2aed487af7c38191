/*
 * mp_elide.c - the synchronisation elision on the one-process-per-rank CUDA fabric
 * (program/sync_elide.h; docs/sync-elide.md): where a program has the elision's shape, an
 * eager call replays the elided command list instead of the schedule's, and the epilogue
 * (mp_execute.c) issues the late ops after its end-of-call fence.
 *
 * Why here: on N processes sharing one GPU every stream memory operation of every rank goes
 * through the one device, and the per-call cost grows with their number (docs/performance.md,
 * "The gap is per call, not per byte").  The elision keeps one counter's signals and waits
 * ("the rank reached the call": STAGED for the fused reduce-scatter, READY for the
 * all-gather) and lets the end fence order the rest.
 *
 * On by default (TIDE_SYNC_ELIDE=0 keeps every signal): on one H200 it took the N = 8
 * reduce-scatter from 1.57x to 1.22x the single-process fabric's time and the all-gather from
 * 1.16x to 1.11x, bit for bit (bench/results/h200-2026-12-07).
 *
 * When a call runs it: an eager call (a captured call keeps every signal: its replays depend
 * on the call before them only through their fences, mp_graph.c), over the ipc transport
 * (not yet the NCCL fabric's) on a world without rails,
 * TIDE_SYNC_ELIDE not 0, and for a reduce-scatter only when the call took fused outputs
 * (mp_direct.c decides that per call, the same on every rank).  mp_execute.c starts a call
 * FRESH when the previous one ran the other command list, and fences call e - 1 at the start
 * of an elided call.
 */
#include "core/checks.h"
#include "fabric/cuda/mp.h"
#include "fabric/cuda/transport.h"

#include <stdlib.h>
#include <string.h>

void tide_cuda_mp_elide_free(tide_mp_prepared_t *pp) {
    tide_sync_elide_free(&pp->se);
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        free(pp->se_cmds[f]);
        free(pp->se_defer[f]);
        pp->se_cmds[f] = NULL;
        pp->se_defer[f] = NULL;
        pp->se_num_cmds[f] = 0;
    }
}

tide_result_t tide_cuda_mp_elide_prepare(tide_mp_arena_t *a, tide_mp_prepared_t *pp,
                                         const tide_program_t *prog) {
    const int me = a->w->base.rank;
    /* TIDE_SYNC_ELIDE as every rank of the world agreed (mp_agree.c): a rank that elides
     * drops signals that a rank keeping every signal would wait for.  The ipc transport only:
     * the NCCL fabric's fences and signals have not run it (and no second node here could). */
    if (!a->w->elide || a->w->rails != NULL || a->w->transport != &tide_transport_ipc ||
        prog->fence != 0)
        return TIDE_SUCCESS;
    const tide_direct_t *dir = NULL;
    if (prog->coll == TIDE_COLL_REDUCE_SCATTER) {
        dir = tide_cuda_mp_direct_analysis(pp);
        if (dir == NULL) return TIDE_SUCCESS; /* no fused sums: every signal stays */
    }
    TIDE_CHECK(tide_sync_elide_build(prog, &pp->sched, dir, &pp->se));
    if (!pp->se.on) {
        TIDE_INFO("cuda mp fabric: rank %d: the %s keeps every signal (%s)", me,
                  prog->coll == TIDE_COLL_ALL_GATHER ? "all-gather" : "reduce-scatter",
                  pp->se.why);
        return TIDE_SUCCESS;
    }
    /* This rank's part, in the global order (as prepare keeps the schedule's). */
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        pp->se_cmds[f] = malloc(((size_t)pp->se.num_cmds[f] + 1) * sizeof(*pp->se_cmds[f]));
        if (pp->se_cmds[f] == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: %d commands",
                            pp->se.num_cmds[f]);
        for (int i = 0; i < pp->se.num_cmds[f]; ++i)
            if (pp->se.cmds[f][i].thread / TIDE_CUDA_Q == me)
                pp->se_cmds[f][pp->se_num_cmds[f]++] = pp->se.cmds[f][i];
        TIDE_CHECK(
            tide_cuda_mp_wait_runs(pp, pp->se_cmds[f], pp->se_num_cmds[f], &pp->se_defer[f]));
    }
    TIDE_INFO("cuda mp fabric: rank %d: the %s runs the synchronisation elision", me,
              prog->coll == TIDE_COLL_ALL_GATHER ? "all-gather" : "reduce-scatter");
    return TIDE_SUCCESS;
}

bool tide_cuda_mp_elide_on(const tide_mp_prepared_t *pp, bool captured) {
    if (captured || !pp->se.on) return false;
    return pp->checked->coll == TIDE_COLL_ALL_GATHER || tide_cuda_mp_direct_fused(pp);
}

void tide_cuda_mp_elide_cmds(const tide_mp_prepared_t *pp, int form,
                             const tide_sched_cmd_t **cmds_out, const uint8_t **defer_out,
                             int *num_out, const uint8_t **late_out) {
    *cmds_out = pp->se_cmds[form];
    *defer_out = pp->se_defer[form];
    *num_out = pp->se_num_cmds[form];
    *late_out = pp->se.late;
}
