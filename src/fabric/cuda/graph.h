/*
 * graph.h - calls of the single-process CUDA fabric captured into a CUDA graph (graph.c;
 * docs/cuda-fabric.md, "CUDA graphs").
 */
#ifndef TIDE_FABRIC_CUDA_GRAPH_H_
#define TIDE_FABRIC_CUDA_GRAPH_H_

#include "fabric/cuda/cuda.h"

#include <stdbool.h>
#include <stdint.h>

/* Rank r calls on `caller` (NULL: the legacy default stream): find whether the stream is
 * capturing and check that the call can be captured (it is not a shared arena's, it is in the
 * capture of the ranks before it, no other capture holds the fabric's streams; core checked
 * that its program ran before, api/capture.c).  Sets fam->pending_capture for the first rank
 * of a call.  Nothing is recorded on failure (TIDE_ERR_UNSUPPORTED naming what). */
tide_result_t tide_cuda_graph_arrive(tide_cuda_group_t *g, tide_cuda_family_t *fam, bool ready,
                                     int r, cudaStream_t caller);

/* The fabric's capture_check (fabric.h): the capture checks of tide_cuda_graph_arrive for a
 * call of `prog` on `arena`, without side effects. */
tide_result_t tide_cuda_capture_check(struct tide_fabric_arena *arena, const tide_program_t *prog,
                                      void *stream, uint64_t *key_out,
                                      tide_capture_verdict_t *v);

/* Whether call `call` of the family was enqueued in the pending call's capture (both 0:
 * eager).  A wait or fence on an earlier call crosses the capture boundary otherwise. */
static inline bool tide_cuda_graph_same(const tide_cuda_family_t *fam, int64_t call) {
    return fam->call_capture[call % 2] == fam->pending_capture;
}

/* The pending call is being captured: upload its per-call tables (gradient pointers, copy
 * descriptors, direct mode's landing and fused-sum tables) into device memory owned by the
 * family for the graph's life, and bind the call's ops to them. */
tide_result_t tide_cuda_graph_tables(tide_cuda_shared_t *sh, tide_cuda_family_t *fam,
                                     tide_cuda_prepared_t *pp, int parity);

/* The end of a captured call: rank 0's caller stream joins the streams the epilogue forked
 * (the fence on the aggregation stream, direct mode's read-done on the utility streams),
 * which must be joined before the capture ends.  *waits counts. */
tide_result_t tide_cuda_graph_join(tide_cuda_family_t *fam, const tide_cuda_prepared_t *pp,
                                   int ranks, int parity, cudaStream_t caller0, uint64_t *waits);

/* The pending call was enqueued as call of `parity`. */
void tide_cuda_graph_enqueued(tide_cuda_shared_t *sh, tide_cuda_family_t *fam, int parity);

void tide_cuda_graph_free(tide_cuda_family_t *fam);

/* The capture stream s is in (NULL: the legacy default stream): *key_out 0 when none, else its
 * capture id + 1; TIDE_ERR_UNSUPPORTED for the legacy stream during a capture and for an
 * invalidated capture (`what` names the stream in the message). */
tide_result_t tide_cuda_graph_key(const char *fabric, int rank, cudaStream_t s, const char *what,
                                  unsigned long long *key_out);

#endif /* TIDE_FABRIC_CUDA_GRAPH_H_ */
