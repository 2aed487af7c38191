/*
 * direct.c - what the CUDA fabric leaves out when every rank of a node lives on one device
 * (the emulated topologies: docs/cuda-fabric.md, "Direct mode"): the device half.
 *
 * On one device a copy is an SM kernel that reads and writes HBM, not a copy engine or a
 * link: a staging push, the own-node spare copy and an emulated rail put each cost their
 * bytes twice on the same memory the sums and landings need.  With TIDE_CUDA_DIRECT unset
 * or not 0, and every node's ranks on one device, a prepared program takes the shortcuts
 * that program/direct.h finds (which copies are elided, where each landing input is read,
 * which sums are fused with their landings, which all-gather puts are elided; the rules and
 * why they are safe are there).  This file binds that analysis to the device: the landing
 * tables (in_table) and fused-sum tables, uploaded per call parity when they change, and the
 * gradient pointer rows the direct sums read.
 *
 * What the fabric adds for safety: a SUM that reads gradients in place moves the read-done
 * event of every rank of the node to after the call of the whole node, and call e + 2 starts
 * after the fence of call e, which every rank's landing of call e precedes (enqueue
 * epilogue, execute.c).  FUSE is in the default mask since the GPU matrix passed with it
 * (701 configurations, 0 failed, bench/results/h200-2026-12-03b).
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"

#include <stdlib.h>
#include <string.h>

bool tide_cuda_direct_world(const tide_cuda_shared_t *sh, int gpus_per_node) {
    if (sh->direct == 0 || gpus_per_node < 1 || sh->ranks % gpus_per_node != 0) return false;
    for (int r = 0; r < sh->ranks; ++r)
        if (tide_cuda_device_of(sh, r) != tide_cuda_device_of(sh, r - r % gpus_per_node))
            return false;
    return true;
}

void tide_cuda_fuse_free(tide_cuda_fuse_t *f) {
    if (f == NULL) return;
    for (int p = 0; p < 2; ++p) {
        if (f->dev[p] != NULL) cudaFree(f->dev[p]);
        if (f->host[p] != NULL) cudaFreeHost(f->host[p]);
        if (f->done[p] != NULL) cudaEventDestroy(f->done[p]);
        free(f->last[p]);
    }
    free(f);
}

void tide_cuda_direct_free(tide_cuda_prepared_t *pp) {
    if (pp->fuse != NULL)
        for (int id = 0; id < pp->sched.num_ops; ++id)
            tide_cuda_fuse_free(pp->fuse[id]);
    free(pp->fuse);
    pp->fuse = NULL;
    for (int p = 0; p < 2; ++p) {
        if (pp->land_dev[p] != NULL)
            for (int id = 0; id < pp->sched.num_ops; ++id)
                if (pp->land_dev[p][id] != NULL) cudaFree(pp->land_dev[p][id]);
        if (pp->land_last[p] != NULL)
            for (int id = 0; id < pp->sched.num_ops; ++id)
                free(pp->land_last[p][id]);
        free(pp->land_dev[p]);
        free(pp->land_last[p]);
        pp->land_dev[p] = NULL;
        pp->land_last[p] = NULL;
    }
    pp->land_src = NULL;
    pp->elide = NULL;
    pp->fused_land = NULL;
    pp->direct = pp->direct_sum = false;
    tide_cuda_direct_ag_free(pp);
    tide_direct_free(&pp->dir);
    (void)cudaGetLastError();
}

/* Each rank's device, the analysis's memory domains. */
static tide_result_t domains(const tide_cuda_shared_t *sh, int **out) {
    int *d = malloc((size_t)sh->ranks * sizeof(*d));
    if (d == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %d ranks", sh->ranks);
    for (int r = 0; r < sh->ranks; ++r)
        d[r] = tide_cuda_device_of(sh, r);
    *out = d;
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_direct_analyse(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                       const tide_program_t *prog, int mask) {
    int *dom = NULL;
    TIDE_CHECK(domains(sh, &dom));
    tide_result_t res = tide_direct_analyse(prog, &pp->sched, mask, dom, &pp->dir);
    free(dom);
    return res;
}

tide_result_t tide_cuda_direct_prepare(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                       const tide_program_t *prog) {
    const int L = prog->plan->config.gpus_per_node;
    if (prog->coll != TIDE_COLL_REDUCE_SCATTER || !tide_cuda_direct_world(sh, L))
        return TIDE_SUCCESS;
    TIDE_CHECK(tide_cuda_direct_analyse(sh, pp, prog, sh->direct & ~TIDE_CUDA_DIRECT_AG));
    tide_direct_t *d = &pp->dir;
    if (!d->rs) return TIDE_SUCCESS;
    tide_result_t res = TIDE_SUCCESS;
    const int n = pp->sched.num_ops;
    pp->elide = d->elide;
    pp->land_src = d->land_src;
    pp->fused_land = d->fused_land;
    if (d->fuse != NULL) {
        pp->fuse = calloc((size_t)n + 1, sizeof(*pp->fuse));
        if (pp->fuse == NULL) goto oom;
        for (int id = 0; id < n; ++id) {
            if (d->fuse[id] == NULL) continue;
            tide_cuda_fuse_t *f = calloc(1, sizeof(*f));
            if (f == NULL) goto oom;
            f->segs = d->fuse[id];
            f->num_segs = d->fuse_segs[id];
            pp->fuse[id] = f;
        }
    }
    /* Device tables of the landings with a source other than their inbox. */
    for (int p = 0; p < 2; ++p) {
        pp->land_dev[p] = calloc((size_t)n + 1, sizeof(*pp->land_dev[p]));
        pp->land_last[p] = calloc((size_t)n + 1, sizeof(*pp->land_last[p]));
        if (pp->land_dev[p] == NULL || pp->land_last[p] == NULL) goto oom;
    }
    pp->direct = true;
    pp->direct_sum = d->sum;
    pp->direct_l = L;
    return TIDE_SUCCESS;
oom:
    res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: direct state");
    tide_cuda_direct_free(pp);
    return res;
}

void tide_cuda_direct_row(const tide_cuda_family_t *fam, int L, int r, const void **row) {
    const int np = fam->num_params, j = r % L, node0 = r - j;
    for (int k = 0; k < L - 1; ++k) {
        const int u = node0 + (k < j ? k : k + 1);
        memcpy(row + (size_t)k * (size_t)np, &fam->grads[(size_t)u * (size_t)np],
               (size_t)np * sizeof(void *));
    }
    memcpy(row + (size_t)(L - 1) * (size_t)np, &fam->grads[(size_t)r * (size_t)np],
           (size_t)np * sizeof(void *));
}

size_t tide_cuda_direct_land_entries(const tide_cuda_prepared_t *pp, int id, int t) {
    if (!pp->direct || pp->land_src[id] == NULL || (pp->fused_land != NULL && pp->fused_land[id]))
        return 0;
    const int rank = t / TIDE_CUDA_Q;
    const tide_op_t *op = tide_schedule_op(pp->checked[rank], &pp->sched, id, t);
    const tide_table_t *tb = &pp->checked[rank]->ranks[rank].tables[op->table];
    return (size_t)tb->num_segs * (size_t)tb->num_in;
}

void tide_cuda_direct_land_fill(const tide_cuda_prepared_t *pp, int id, int t, const float **host) {
    const int rank = t / TIDE_CUDA_Q;
    const tide_op_t *op = tide_schedule_op(pp->checked[rank], &pp->sched, id, t);
    const tide_table_t *tb = &pp->checked[rank]->ranks[rank].tables[op->table];
    const tide_land_args_t *la = &pp->bound[id].land;
    for (int g = 0; g < tb->num_segs; ++g)
        for (int k = 0; k < tb->num_in; ++k) {
            const tide_direct_land_src_t *o = &pp->land_src[id][(size_t)g * tb->num_in + k];
            const float **e = &host[(size_t)g * tb->num_in + k];
            if (o->kind == TIDE_DIRECT_LAND_ZERO)
                *e = NULL;
            else if (o->kind == TIDE_DIRECT_LAND_ALIAS)
                *e = (const float *)((const uint8_t *)pp->bound[o->copy].op.src + o->delta);
            else
                *e = la->in[k] + tb->land_segs[g].in_off;
        }
}

tide_result_t tide_cuda_direct_lands(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp, int parity) {
    if (!pp->direct) return TIDE_SUCCESS;
    const tide_schedule_t *s = &pp->sched;
    for (int t = 0; t < s->num_threads; ++t) {
        const int rank = t / TIDE_CUDA_Q;
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id) {
            const size_t n = tide_cuda_direct_land_entries(pp, id, t);
            if (n == 0) continue;
            const float **host = malloc(n * sizeof(*host));
            if (host == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: landing table");
            tide_cuda_direct_land_fill(pp, id, t, host);
            const float **last = pp->land_last[parity][id];
            if (last != NULL && memcmp(last, host, n * sizeof(*host)) == 0) {
                free(host);
                pp->bound[id].land.in_table = (const float *const *)pp->land_dev[parity][id];
                continue;
            }
            /* First call of this parity (the addresses are the arena's, fixed after it): an
             * earlier table of this parity may still be read, so wait for the device. */
            tide_result_t res = TIDE_SUCCESS;
            TIDE_CUDA_CALL_GOTO(cudaSetDevice(tide_cuda_device_of(sh, rank)), "cudaSetDevice", res,
                                fail);
            if (pp->land_dev[parity][id] == NULL)
                TIDE_CUDA_CALL_GOTO(cudaMalloc(&pp->land_dev[parity][id], n * sizeof(*host)),
                                    "cudaMalloc(landing table)", res, fail);
            else
                TIDE_CUDA_CALL_GOTO(cudaDeviceSynchronize(), "cudaDeviceSynchronize", res, fail);
            TIDE_CUDA_CALL_GOTO(cudaMemcpy(pp->land_dev[parity][id], host, n * sizeof(*host),
                                           cudaMemcpyHostToDevice),
                                "cudaMemcpy(landing table)", res, fail);
            free(last);
            pp->land_last[parity][id] = host;
            pp->bound[id].land.in_table = (const float *const *)pp->land_dev[parity][id];
            continue;
        fail:
            free(host);
            return res;
        }
    }
    return TIDE_SUCCESS;
}

void tide_cuda_fused_entry(const tide_land_args_t *la, const tide_table_t *tb, int seg,
                           tide_sum_fused_t *entry) {
    /* Field by field into the cleared row: its padding stays zero for fuse_commit's memcmp. */
    entry->dst = la->out + tb->land_segs[seg].out_off;
    entry->alpha = la->alpha;
    entry->overwrite = la->init && !la->accumulate;
    entry->plus_zero = la->num_in > 1 || la->plus_zero;
}

tide_result_t tide_cuda_fuse_row(tide_cuda_fuse_t *f, int parity, tide_sum_fused_t **row_out) {
    const size_t bytes = (size_t)f->num_segs * sizeof(tide_sum_fused_t);
    if (f->dev[parity] == NULL) {
        TIDE_CUDA_CALL(cudaMalloc((void **)&f->dev[parity], bytes), "cudaMalloc(fused sum table)");
        TIDE_CUDA_CALL(cudaMallocHost((void **)&f->host[parity], bytes),
                       "cudaMallocHost(fused sum table)");
        TIDE_CUDA_CALL(cudaEventCreateWithFlags(&f->done[parity], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags(fused sum table)");
        f->last[parity] = calloc(1, bytes);
        if (f->last[parity] == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: fused sum table");
    }
    /* The pinned row may still feed the upload of call e - 2. */
    if (f->inflight[parity])
        TIDE_CUDA_CALL(cudaEventSynchronize(f->done[parity]),
                       "cudaEventSynchronize(fused sum table)");
    f->inflight[parity] = false;
    memset(f->host[parity], 0, bytes);
    *row_out = f->host[parity];
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_fuse_commit(tide_cuda_fuse_t *f, int parity, cudaStream_t stream,
                                    uint64_t *uploads) {
    const size_t bytes = (size_t)f->num_segs * sizeof(tide_sum_fused_t);
    const tide_sum_fused_t *row = f->host[parity];
    if (f->valid[parity] && memcmp(f->last[parity], row, bytes) == 0) return TIDE_SUCCESS;
    TIDE_CUDA_CALL(cudaMemcpyAsync(f->dev[parity], row, bytes, cudaMemcpyHostToDevice, stream),
                   "cudaMemcpyAsync(fused sum table)");
    TIDE_CUDA_CALL(cudaEventRecord(f->done[parity], stream), "cudaEventRecord(fused sum table)");
    f->inflight[parity] = true;
    memcpy(f->last[parity], row, bytes);
    f->valid[parity] = true;
    ++*uploads;
    return TIDE_SUCCESS;
}

void tide_cuda_direct_fuse_fill(const tide_cuda_prepared_t *pp, const tide_cuda_fuse_t *f,
                                tide_sum_fused_t *row) {
    const tide_schedule_t *s = &pp->sched;
    memset(row, 0, (size_t)f->num_segs * sizeof(*row));
    for (int q = 0; q < f->num_segs; ++q) {
        if (f->segs[q].land < 0) continue; /* an empty segment: nothing is stored */
        const int lid = f->segs[q].land;
        const int lt = tide_direct_thread_of(s, lid);
        const tide_op_t *lop = tide_schedule_op(pp->checked[lt / TIDE_CUDA_Q], s, lid, lt);
        const tide_table_t *tb =
            &pp->checked[lt / TIDE_CUDA_Q]->ranks[lt / TIDE_CUDA_Q].tables[lop->table];
        tide_cuda_fused_entry(&pp->bound[lid].land, tb, f->segs[q].seg, &row[q]);
    }
}

tide_result_t tide_cuda_direct_fuse_upload(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                           int parity, int r, cudaStream_t stream,
                                           uint64_t *uploads) {
    (void)sh;
    if (pp->fuse == NULL) return TIDE_SUCCESS;
    const tide_schedule_t *s = &pp->sched;
    for (int t = r * TIDE_CUDA_Q; t < (r + 1) * TIDE_CUDA_Q; ++t)
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id) {
            tide_cuda_fuse_t *f = pp->fuse[id];
            if (f == NULL || f->num_segs == 0) continue;
            tide_sum_fused_t *row;
            TIDE_CHECK(tide_cuda_fuse_row(f, parity, &row));
            tide_cuda_direct_fuse_fill(pp, f, row);
            TIDE_CHECK(tide_cuda_fuse_commit(f, parity, stream, uploads));
            pp->bound[id].sum.fused = f->dev[parity];
        }
    return TIDE_SUCCESS;
}
