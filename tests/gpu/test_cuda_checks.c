/*
 * test_cuda_checks.c - the single-process CUDA fabric compares every call's arguments across
 * ranks without waiting (src/fabric/cuda/call_compare.c, fabric/call_table.h) and refuses a
 * disagreement on every rank.
 *
 * One thread drives four ranks (M = 2, L = 2, ranks on the visible GPUs round-robin), rank 0
 * to 3 per call, two groups:
 *   AG: calls 0 and 1 agree and succeed; in call 2 rank 1 passes slot 1 where the others pass
 *       slot 0.  Rank 0 (which called first) is told nothing yet; ranks 1, 2, 3 get
 *       TIDE_ERR_INVALID_ARGUMENT naming a slot and another rank; at the next call every rank
 *       is refused (rank 0 names both values), and nothing of call 2 ran: rank 0's landing
 *       slot 0 still holds call 0's gather, although the shards changed before call 2.
 *   RS: call 0 agrees; in call 1 rank 3 passes alpha 0.5 where the others pass 1: rank 3 is
 *       refused naming alpha, and ranks 0-2 at their next call, naming alpha too.
 *
 * Exit status: 0 passed, 1 a rank saw something else (printed), 2 a setup failure.
 */
#include "api/comm.h"
#include "call_checks.h"
#include "plan/plan.h"
#include "tide.h"

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RANKS 4

static bool ok = true;

static void expect(bool good, int r, const char *what) {
    printf("%s rank %d: %s%s%s\n", good ? "ok  " : "FAIL", r, what, good ? "" : ": ",
           good ? "" : tide_get_last_error());
    ok = ok && good;
}

int main(void) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) return 2;
    tide_comm_t comm[RANKS];
    if (tide_comm_init_all(TIDE_FABRIC_CUDA, 2, 2, comm) != TIDE_SUCCESS) return 2;
    const tide_group_desc_t desc = checks_desc();
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = 2;
    cfg.gpus_per_node = 2;
    tide_group_t ag[RANKS], rs[RANKS];
    for (int r = 0; r < RANKS; ++r)
        if (tide_group_register(comm[r], &cfg, &desc, &ag[r]) != TIDE_SUCCESS) return 2;
    for (int r = 0; r < RANKS; ++r)
        if (tide_group_register(comm[r], &cfg, &desc, &rs[r]) != TIDE_SUCCESS) return 2;
    const size_t shard_bytes = ag[0]->plan->geom.shard_bytes;
    const size_t group_bytes = ag[0]->plan->geom.group_bytes;
    checks_bufs_t bufs[RANKS];
    void *shard[RANKS], *out[RANKS], *const *grads[RANKS];
    for (int r = 0; r < RANKS; ++r) {
        if (cudaSetDevice(r % devices) != cudaSuccess ||
            !checks_alloc(&bufs[r], ag[r], rs[r], 0x10 + r))
            return 2;
        shard[r] = bufs[r].shard;
        out[r] = bufs[r].out;
        grads[r] = bufs[r].grads;
    }
    for (int d = 0; d < devices; ++d)
        if (cudaSetDevice(d) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 2;

    /* All-gather: calls 0 and 1 agree. */
    for (int e = 0; e < 2; ++e)
        for (int r = 0; r < RANKS; ++r)
            if (tide_all_gather(ag[r], shard[r], e % 2, NULL) != TIDE_SUCCESS) {
                expect(false, r, "agreeing all-gather");
                return 1;
            }
    uint8_t *before = malloc(group_bytes), *after = malloc(group_bytes);
    if (before == NULL || after == NULL) return 2;
    void *landing0 = NULL;
    if (tide_group_landing(ag[0], 0, &landing0) != TIDE_SUCCESS) return 2;
    cudaSetDevice(0);
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(before, landing0, group_bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 2;
    /* New shards: a call 2 that ran would change slot 0. */
    for (int r = 0; r < RANKS; ++r) {
        cudaSetDevice(r % devices);
        cudaMemset(shard[r], 0x50 + r, shard_bytes);
    }
    for (int d = 0; d < devices; ++d)
        if (cudaSetDevice(d) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 2;
    /* Call 2: rank 1 disagrees. */
    expect(tide_all_gather(ag[0], shard[0], 0, NULL) == TIDE_SUCCESS, 0,
           "all-gather call 2 recorded before the disagreement");
    expect(checks_refused(tide_all_gather(ag[1], shard[1], 1, NULL), "slot"), 1,
           "all-gather call 2 refused (slot)");
    for (int r = 2; r < RANKS; ++r)
        expect(checks_refused(tide_all_gather(ag[r], shard[r], 0, NULL), "slot"), r,
               "all-gather call 2 refused after the disagreement (slot)");
    expect(checks_refused(tide_all_gather(ag[0], shard[0], 1, NULL), "slot 1"), 0,
           "next all-gather refused, naming both values");
    for (int r = 1; r < RANKS; ++r)
        expect(tide_all_gather(ag[r], shard[r], 1, NULL) != TIDE_SUCCESS, r,
               "next all-gather refused (group unusable)");
    for (int d = 0; d < devices; ++d)
        if (cudaSetDevice(d) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 2;
    cudaSetDevice(0);
    if (cudaMemcpy(after, landing0, group_bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return 2;
    expect(memcmp(before, after, group_bytes) == 0, 0,
           "nothing of the refused call ran (landing slot 0 unchanged)");

    /* Reduce-scatter: call 0 agrees, in call 1 rank 3 passes another alpha. */
    for (int r = 0; r < RANKS; ++r)
        if (tide_reduce_scatter(rs[r], (const void *const *)grads[r], out[r], 1.0f, 0,
                                TIDE_RS_IN_PLACE, NULL) != TIDE_SUCCESS) {
            expect(false, r, "agreeing reduce-scatter");
            return 1;
        }
    for (int r = 0; r < RANKS; ++r) {
        const tide_result_t res =
            tide_reduce_scatter(rs[r], (const void *const *)grads[r], out[r], r == 3 ? 0.5f : 1.0f,
                                0, TIDE_RS_IN_PLACE, NULL);
        if (r < 3)
            expect(res == TIDE_SUCCESS, r, "reduce-scatter call 1 recorded before rank 3");
        else
            expect(checks_refused(res, "alpha"), r, "reduce-scatter call 1 refused (alpha)");
    }
    for (int r = 0; r < 3; ++r)
        expect(checks_refused(tide_reduce_scatter(rs[r], (const void *const *)grads[r], out[r],
                                                  1.0f, 0, TIDE_RS_IN_PLACE, NULL),
                              "alpha 0.5"),
               r, "next reduce-scatter refused, naming alpha 0.5");
    for (int d = 0; d < devices; ++d)
        if (cudaSetDevice(d) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
            expect(false, d, "device synchronisation after the refusals");
            return 1;
        }

    for (int r = 0; r < RANKS; ++r) {
        tide_group_deregister(ag[r]);
        tide_group_deregister(rs[r]);
    }
    for (int r = 0; r < RANKS; ++r) {
        cudaSetDevice(r % devices);
        checks_free(&bufs[r]);
        tide_comm_destroy(comm[r]);
    }
    free(before);
    free(after);
    printf("%s: argument checks of the single-process CUDA fabric\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
