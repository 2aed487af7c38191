/*
 * read_done.c - the read-done event of a group's last reduce-scatter, for the public
 * tide_group_read_done_event (core stays free of CUDA types: the event goes out as void *).
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"
#include "fabric/cuda/mp.h"

tide_result_t tide_cuda_read_done_event(const struct tide_fabric_arena *arena, int rank,
                                        void **event_out) {
    cudaEvent_t ev = NULL;
    TIDE_CHECK(
        tide_cuda_arena_event(arena, TIDE_COLL_REDUCE_SCATTER, rank, TIDE_EVENT_READ_DONE, &ev));
    *event_out = (void *)ev;
    return TIDE_SUCCESS;
}

/* One process per rank (and NCCL): the rank's own event of its last reduce-scatter; a view of a
 * shared arena has its own families, so the event is the group's (mp_view.c). */
tide_result_t tide_cuda_mp_read_done_event(const struct tide_fabric_arena *arena,
                                           void **event_out) {
    TIDE_ARG_CHECK(tide_cuda_mp_is(arena), "read-done event: not a one-process-per-rank arena");
    const tide_mp_arena_t *a = (const tide_mp_arena_t *)arena;
    *event_out = (void *)a->fam[1].user[TIDE_EVENT_READ_DONE];
    return TIDE_SUCCESS;
}
