/*
 * read_done.c - the read-done event of a group's last reduce-scatter, for the public
 * tide_group_read_done_event (core stays free of CUDA types: the event goes out as void *).
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"

tide_result_t tide_cuda_read_done_event(const struct tide_fabric_arena *arena, int rank,
                                        void **event_out) {
    cudaEvent_t ev = NULL;
    TIDE_CHECK(
        tide_cuda_arena_event(arena, TIDE_COLL_REDUCE_SCATTER, rank, TIDE_EVENT_READ_DONE, &ev));
    *event_out = (void *)ev;
    return TIDE_SUCCESS;
}
