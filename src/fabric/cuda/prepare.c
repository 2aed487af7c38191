/*
 * prepare.c - a program's device-side state, built on its first call: the schedule
 * (program/schedule.c, schedule_commands.c), one event per signal that some wait names and per call parity,
 * and the segment tables of its SUM and LAND ops copied once to the device of their rank (the
 * kernels read them from device memory).  RS programs also get the gradient pointer tables:
 * P device pointers per rank and call parity, refreshed per call from pinned host memory
 * (execute.c), because the gradients a call reads change from call to call.
 */
#include "core/checks.h"
#include "fabric/cuda/transport.h"

#include <stdlib.h>
#include <string.h>

void tide_cuda_prepared_free(tide_cuda_prepared_t *pp, int ranks) {
    for (int p = 0; p < 2; ++p) {
        if (pp->events[p] != NULL)
            for (int k = 0; k < pp->sched.num_slots; ++k)
                if (pp->events[p][k] != NULL) cudaEventDestroy(pp->events[p][k]);
        free(pp->events[p]);
    }
    for (int r = 0; r < ranks; ++r) {
        if (pp->table_mem != NULL && pp->table_mem[r] != NULL) cudaFree(pp->table_mem[r]);
        if (pp->table_dev != NULL) free(pp->table_dev[r]);
    }
    (void)cudaGetLastError();
    free(pp->table_mem);
    free(pp->table_dev);
    free(pp->checked);
    free(pp->bound);
    tide_cuda_direct_free(pp);
    tide_cuda_batch_free(pp, ranks);
    tide_schedule_free(&pp->sched);
    memset(pp, 0, sizeof(*pp));
}

static tide_result_t events_create(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp) {
    const int slots = pp->sched.num_slots;
    for (int p = 0; p < 2; ++p) {
        pp->events[p] = calloc((size_t)slots + 1, sizeof(*pp->events[p]));
        if (pp->events[p] == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %d signal events", slots);
        for (int k = 0; k < slots; ++k) {
            const int rank = pp->sched.slot_thread[k] / TIDE_CUDA_Q;
            TIDE_CUDA_CALL(cudaSetDevice(tide_cuda_device_of(sh, rank)), "cudaSetDevice");
            TIDE_CUDA_CALL(cudaEventCreateWithFlags(&pp->events[p][k], cudaEventDisableTiming),
                           "cudaEventCreateWithFlags(signal)");
        }
    }
    return TIDE_SUCCESS;
}

/* Rank r's segment tables on its device (ops.c). */
static tide_result_t tables_upload(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                   const tide_rank_program_t *rp, int r) {
    const int d = tide_cuda_device_of(sh, r);
    TIDE_CUDA_CALL(cudaSetDevice(d), "cudaSetDevice");
    return tide_cuda_tables_upload(rp, r, sh->util[d], &pp->table_mem[r], &pp->table_dev[r]);
}

void tide_cuda_own_tables_free(tide_cuda_family_t *fam, int ranks) {
    for (int p = 0; p < 2; ++p) {
        tide_cuda_rows_release(ranks, fam->own_host[p], fam->own_dev[p], fam->own_done[p]);
        free(fam->own_dev[p]);
        free(fam->own_done[p]);
        free(fam->own_last[p]);
        free(fam->own_valid[p]);
        free(fam->own_inflight[p]);
        fam->own_dev[p] = NULL;
        fam->own_done[p] = NULL;
        fam->own_host[p] = NULL;
        fam->own_last[p] = NULL;
        fam->own_valid[p] = NULL;
        fam->own_inflight[p] = NULL;
    }
    free(fam->grads);
    free(fam->own_row_tmp);
    fam->grads = NULL;
    fam->own_row_tmp = NULL;
    fam->num_params = 0;
    fam->own_row = 0;
    (void)cudaGetLastError();
}

/* RS: the per-call gradient pointer tables, double-buffered by call parity: P pointers per
 * rank, or in direct mode L P (the node's other ranks' gradients, then the rank's own). */
static tide_result_t own_tables_build(tide_cuda_shared_t *sh, tide_cuda_family_t *fam, int params,
                                      int row_ptrs) {
    const int n = sh->ranks;
    const size_t row = (size_t)row_ptrs * sizeof(void *);
    fam->num_params = params;
    fam->own_row = row_ptrs;
    fam->grads = calloc((size_t)n * (size_t)params, sizeof(*fam->grads));
    fam->own_row_tmp = calloc((size_t)row_ptrs, sizeof(*fam->own_row_tmp));
    if (fam->grads == NULL || fam->own_row_tmp == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: gradient tables");
    for (int p = 0; p < 2; ++p) {
        fam->own_dev[p] = calloc((size_t)n, sizeof(*fam->own_dev[p]));
        fam->own_done[p] = calloc((size_t)n, sizeof(*fam->own_done[p]));
        fam->own_last[p] = calloc((size_t)n * (size_t)row_ptrs, sizeof(*fam->own_last[p]));
        fam->own_valid[p] = calloc((size_t)n, sizeof(*fam->own_valid[p]));
        fam->own_inflight[p] = calloc((size_t)n, sizeof(*fam->own_inflight[p]));
        if (fam->own_dev[p] == NULL || fam->own_done[p] == NULL || fam->own_last[p] == NULL ||
            fam->own_valid[p] == NULL || fam->own_inflight[p] == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: gradient tables");
        /* Rank r on device r % num_devices: tide_cuda_device_of. */
        TIDE_CHECK(tide_cuda_rows_alloc(n, sh->num_devices, row, &fam->own_host[p],
                                        fam->own_dev[p], fam->own_done[p]));
    }
    return TIDE_SUCCESS;
}

static tide_result_t own_tables_alloc(tide_cuda_shared_t *sh, tide_cuda_family_t *fam, int params,
                                      int row_ptrs) {
    tide_result_t res = own_tables_build(sh, fam, params, row_ptrs);
    if (res != TIDE_SUCCESS) tide_cuda_own_tables_free(fam, sh->ranks);
    return res;
}

tide_result_t tide_cuda_prepare(tide_cuda_group_t *g, tide_cuda_family_t *fam,
                                tide_cuda_prepared_t *pp, const tide_program_t *prog) {
    tide_cuda_shared_t *sh = g->shared;
    const int n = sh->ranks;
    if (prog->num_ranks != n)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "cuda fabric: program of %d ranks in a world of %d",
                        prog->num_ranks, n);
    tide_result_t res;
    TIDE_CHECK(tide_schedule_build(prog, &pp->sched));
    pp->table_mem = calloc((size_t)n, sizeof(*pp->table_mem));
    pp->table_dev = calloc((size_t)n, sizeof(*pp->table_dev));
    pp->checked = calloc((size_t)n, sizeof(*pp->checked));
    pp->bound = calloc((size_t)pp->sched.num_ops + 1, sizeof(*pp->bound));
    if (pp->table_mem == NULL || pp->table_dev == NULL || pp->checked == NULL ||
        pp->bound == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: state of a %d-op program",
                       pp->sched.num_ops);
        goto fail;
    }
    TIDE_CHECK_GOTO(events_create(sh, pp), res, fail);
    for (int r = 0; r < n; ++r)
        TIDE_CHECK_GOTO(tables_upload(sh, pp, &prog->ranks[r], r), res, fail);
    /* Before the batches: elided copies join no batch.  A fence has no copies to elide
     * (it is compiled as an all-gather, which direct_ag would otherwise inspect). */
    if (prog->fence == 0) {
        TIDE_CHECK_GOTO(tide_cuda_direct_prepare(sh, pp, prog), res, fail);
        TIDE_CHECK_GOTO(tide_cuda_direct_ag_prepare(sh, pp, prog), res, fail);
    }
    if (sh->batch) TIDE_CHECK_GOTO(tide_cuda_batch_prepare(sh, pp, prog), res, fail);
    if (pp->sched.has_sum) {
        const int np = prog->plan->geom.num_params;
        const int row = pp->direct_sum ? pp->direct_l * np : np;
        if (fam->own_dev[0] == NULL)
            TIDE_CHECK_GOTO(own_tables_alloc(sh, fam, np, row), res, fail);
        if (fam->own_row != row) {
            res = TIDE_ERR(TIDE_ERR_INTERNAL,
                           "cuda fabric: gradient tables of %d pointers, the program needs %d",
                           fam->own_row, row);
            goto fail;
        }
    }
    pp->ready = true;
    return TIDE_SUCCESS;
fail:
    tide_cuda_prepared_free(pp, n);
    return res;
}
