/*
 * mp_direct.c - direct mode on the one-process-per-rank CUDA fabric at M = 1 (mp.h;
 * docs/cuda-fabric.md, "Direct mode across processes"): the reduce-scatter's sums read the
 * peers' gradients where they are and store every rank's output, instead of pushing each
 * gradient piece into its owner's staging and landing the owner's spare.
 *
 * What is shared with the single-process fabric's direct mode: the analysis of the program
 * (program/direct.h, with one memory domain: every rank's memory is mapped in every process
 * at M = 1), the kernels' arguments and the fused-sum table layout (tide_cuda_fuse_t; its
 * upload is written here again because the landings it names are bound differently: this
 * process binds only its own rank's call, direct.c reads every rank's).  Only the two
 * shortcuts that exist at M = 1 are asked for: SUM (1; the program has no inbox, so ZERO and
 * ALIAS find nothing) and FUSE (8).
 *
 * What is new across processes:
 *   - a call takes the shortcuts only when every rank's gradients (and, for FUSE, outputs)
 *     are addressable from every rank (mp_export.c exchanges the addresses and decides, the
 *     same way on every rank); otherwise it runs the pushed path, bit for bit the same result
 *     (the arithmetic and its order are the same on both paths);
 *   - the fused sums bind the landings of the other ranks here, with their outputs as mapped
 *     in this process (every rank passes the same alpha and accumulate: the call check);
 *   - peers read this rank's gradients and write its output during their calls, so this
 *     rank's call ends, on its caller's stream, only once every rank's call ended (a wait on
 *     every rank's done flag of the call, after this rank wrote its own: no cycle), and its
 *     read-done is recorded there rather than in its queue.  The caller may then free or
 *     rewrite the gradients and read the output, as after a pushed call.
 * Every signal, wait and record of the program stays: an elided push still records its
 * signal where the push would have run, so a sum still starts after every rank's start.
 */
#include "core/checks.h"
#include "fabric/cuda/mp_export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tide_mp_direct {
    tide_direct_t dir;
    int l;                   /* ranks of the node: N at M = 1 */
    bool any_fuse;           /* some sum of some rank is fused (the same on every rank) */
    bool on, fuse_on;        /* this call's path */
    tide_cuda_fuse_t **fuse; /* [num_ops]: this rank's fused sums */
    tide_land_args_t *land;  /* [num_ops]: other ranks' fused landings, bound for this call */
    uint8_t *land_bound;     /* [num_ops] */
};

tide_result_t tide_cuda_mp_direct_env(bool *on_out) {
    static const char *const values[] = {"1", "0"};
    int i = 0;
    TIDE_CHECK(tide_fabric_env_choice("TIDE_CUDA_MP_DIRECT", values, 2, &i));
    *on_out = i == 0;
    return TIDE_SUCCESS;
}

void tide_cuda_mp_direct_free(tide_mp_prepared_t *pp) {
    struct tide_mp_direct *d = pp->direct;
    if (d == NULL) return;
    if (d->fuse != NULL)
        for (int id = 0; id < d->dir.num_ops; ++id)
            tide_cuda_fuse_free(d->fuse[id]);
    (void)cudaGetLastError();
    free(d->fuse);
    free(d->land);
    free(d->land_bound);
    tide_direct_free(&d->dir);
    free(d);
    pp->direct = NULL;
}

void tide_cuda_mp_direct_family_free(tide_mp_family_t *fam) {
    tide_cuda_mp_exchange_free(fam->dcall);
    fam->dcall = NULL;
}

tide_result_t tide_cuda_mp_direct_prepare(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                          tide_mp_prepared_t *pp, const tide_program_t *prog) {
    const tide_mp_world_t *w = a->w;
    const int l = prog->plan->config.gpus_per_node, np = prog->plan->geom.num_params;
    if (!w->direct || w->rails != NULL || prog->coll != TIDE_COLL_REDUCE_SCATTER ||
        prog->plan->config.nodes != 1 || l < 2 || !pp->sched.has_sum)
        return TIDE_SUCCESS;
    /* The gradient pointer tables of the family hold the L P row of a direct sum; tables made
     * smaller by an earlier program keep this one on the pushed path. */
    const int row = l * (np > 0 ? np : 1);
    if (fam->own_dev[0] != NULL && fam->row_len < row) return TIDE_SUCCESS;
    struct tide_mp_direct *d = calloc(1, sizeof(*d));
    if (d == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: direct mode");
    pp->direct = d;
    d->l = l;
    TIDE_CHECK(tide_direct_analyse(prog, &pp->sched, TIDE_DIRECT_SUM | TIDE_DIRECT_FUSE, NULL,
                                   &d->dir));
    if (!d->dir.rs || !d->dir.sum) {
        tide_cuda_mp_direct_free(pp);
        return TIDE_SUCCESS;
    }
    const int n = pp->sched.num_ops, me = w->base.rank;
    d->fuse = calloc((size_t)n + 1, sizeof(*d->fuse));
    d->land = calloc((size_t)n + 1, sizeof(*d->land));
    d->land_bound = calloc((size_t)n + 1, 1);
    if (d->fuse == NULL || d->land == NULL || d->land_bound == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: direct mode of %d ops", n);
    for (int id = 0; d->dir.fuse != NULL && id < n; ++id)
        d->any_fuse = d->any_fuse || d->dir.fuse[id] != NULL;
    if (d->dir.fuse != NULL)
        for (int id = pp->sched.op_base[me * TIDE_CUDA_Q];
             id < pp->sched.op_base[(me + 1) * TIDE_CUDA_Q]; ++id) {
            if (d->dir.fuse[id] == NULL || d->dir.fuse_segs[id] == 0) continue;
            tide_cuda_fuse_t *f = calloc(1, sizeof(*f));
            if (f == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: fused sum");
            f->segs = d->dir.fuse[id];
            f->num_segs = d->dir.fuse_segs[id];
            d->fuse[id] = f;
        }
    if (fam->row_len < row) fam->row_len = row;
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ a call */

tide_result_t tide_cuda_mp_direct_call(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                       tide_mp_prepared_t *pp, const tide_binding_t *b) {
    if (fam->grads == NULL || b->grads == NULL) return TIDE_SUCCESS;
    const int np = fam->num_params, me = a->w->base.rank;
    struct tide_mp_direct *d = pp->direct;
    if (d != NULL) {
        TIDE_CHECK(tide_cuda_mp_exchange(a, fam, b));
        d->on = fam->dcall->sums;
        d->fuse_on = d->on && d->any_fuse && fam->dcall->outs;
        memset(d->land_bound, 0, (size_t)d->dir.num_ops + 1);
        const int path = d->on ? d->fuse_on ? 2 : 1 : 0;
        if (path != fam->dcall->logged) {
            static const char *const name[] = {"the pushed path", "direct sums",
                                               "direct sums with fused outputs"};
            char why[96] = "every operand is addressable from every rank";
            if (path < 2 && (path == 0 || d->any_fuse)) {
                if (fam->dcall->blocker >= 0)
                    snprintf(why, sizeof(why), "rank %d's %s cannot be exported",
                             fam->dcall->blocker, path == 0 ? "gradients" : "output");
                else
                    snprintf(why, sizeof(why), "a rank could not open a peer's operand");
            }
            TIDE_INFO("cuda mp fabric: rank %d: reduce-scatter call %llu takes %s (%s)", me,
                      (unsigned long long)b->epoch, name[path], why);
            fam->dcall->logged = path;
        }
    }
    memset(fam->grads, 0, (size_t)fam->row_len * sizeof(*fam->grads));
    if (d == NULL || !d->on) {
        memcpy(fam->grads, b->grads, (size_t)np * sizeof(void *));
        return TIDE_SUCCESS;
    }
    /* The direct sum's row (ops.c, direct_l): the other local ranks' gradients in local-rank
     * order, then this rank's own (M = 1: the node is every rank). */
    for (int k = 0; k < d->l - 1; ++k) {
        const int u = k < me ? k : k + 1;
        memcpy(&fam->grads[(size_t)k * (size_t)np], &fam->dcall->grads[(size_t)u * (size_t)np],
               (size_t)np * sizeof(void *));
    }
    memcpy(&fam->grads[(size_t)(d->l - 1) * (size_t)np], b->grads, (size_t)np * sizeof(void *));
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_direct_pushed(tide_mp_family_t *fam, tide_mp_prepared_t *pp,
                                         const tide_binding_t *b) {
    if (pp->direct != NULL) {
        pp->direct->on = false;
        pp->direct->fuse_on = false;
    }
    if (fam->grads == NULL || b->grads == NULL) return TIDE_SUCCESS;
    memset(fam->grads, 0, (size_t)fam->row_len * sizeof(*fam->grads));
    memcpy(fam->grads, b->grads, (size_t)fam->num_params * sizeof(void *));
    return TIDE_SUCCESS;
}

bool tide_cuda_mp_direct_elided(const tide_mp_prepared_t *pp, int id) {
    const struct tide_mp_direct *d = pp->direct;
    return d != NULL && d->on && d->dir.elide != NULL && d->dir.elide[id];
}

void tide_cuda_mp_direct_skips(const tide_mp_prepared_t *pp, const uint8_t **elide_out,
                               const uint8_t **fused_out, bool *read_done_out) {
    const struct tide_mp_direct *d = pp->direct;
    const bool on = d != NULL && d->on;
    /* Elided pushes: the peers' sums read the gradient in place.  Fused landings: a fused sum
     * (this rank's or a peer's) stored them.  Read-done follows every rank's call
     * (mp_execute.c, enqueue). */
    *elide_out = on ? d->dir.elide : NULL;
    *fused_out = on && d->fuse_on ? d->dir.fused_land : NULL;
    *read_done_out = on;
}

const tide_direct_t *tide_cuda_mp_direct_analysis(const tide_mp_prepared_t *pp) {
    return pp->direct != NULL && pp->direct->any_fuse ? &pp->direct->dir : NULL;
}

bool tide_cuda_mp_direct_fused(const tide_mp_prepared_t *pp) {
    return pp->direct != NULL && pp->direct->on && pp->direct->fuse_on;
}

int tide_cuda_mp_direct_l(const tide_mp_prepared_t *pp) {
    return pp->direct != NULL && pp->direct->on ? pp->direct->l : 0;
}

/* Landing `lid` of this call: this rank's as bound, another rank's bound here with that
 * rank's output and gradients as mapped in this process. */
static tide_result_t land_of(tide_mp_arena_t *a, tide_mp_prepared_t *pp, const tide_binding_t *b,
                             int lid, const tide_table_t **table_out,
                             const tide_land_args_t **args_out) {
    struct tide_mp_direct *d = pp->direct;
    const int t = tide_direct_thread_of(&pp->sched, lid), r = t / TIDE_CUDA_Q;
    const tide_op_t *op = tide_schedule_op(pp->checked, &pp->sched, lid, t);
    *table_out = &pp->checked->ranks[r].tables[op->table];
    if (r == a->w->base.rank) {
        *args_out = &pp->bound[lid].land;
        return TIDE_SUCCESS;
    }
    if (!d->land_bound[lid]) {
        const struct tide_mp_direct_call *c = a->fam[1].dcall;
        tide_binding_t peer = *b;
        peer.rank = r;
        peer.out = c->outs_at[r];
        peer.grads = &c->grads[(size_t)r * (size_t)c->params];
        TIDE_CHECK(tide_bind_land(&peer, pp->checked, (tide_queue_t)(t % TIDE_CUDA_Q),
                                  lid - pp->sched.op_base[t], &d->land[lid]));
        d->land_bound[lid] = 1;
    }
    *args_out = &d->land[lid];
    return TIDE_SUCCESS;
}

/* Fused sum f's table of this parity: row q stores segment q as its landing would (the
 * kernel's tide_sum_fused_t), uploaded on the caller's stream when it changed.  The host
 * waited for call e - 2 (enqueue), which read this parity's pinned row. */
static tide_result_t fuse_upload(tide_mp_arena_t *a, tide_mp_prepared_t *pp,
                                 const tide_binding_t *b, tide_cuda_fuse_t *f, int parity,
                                 cudaStream_t caller, tide_cuda_stats_t *st) {
    tide_sum_fused_t *row;
    TIDE_CHECK(tide_cuda_fuse_row(f, parity, &row));
    for (int q = 0; q < f->num_segs; ++q) {
        if (f->segs[q].land < 0) continue; /* an empty segment: nothing is stored */
        const tide_table_t *tb;
        const tide_land_args_t *la;
        TIDE_CHECK(land_of(a, pp, b, f->segs[q].land, &tb, &la));
        tide_cuda_fused_entry(la, tb, f->segs[q].seg, &row[q]);
    }
    return tide_cuda_fuse_commit(f, parity, caller, &st->uploads);
}

tide_result_t tide_cuda_mp_direct_before(tide_mp_arena_t *a, tide_mp_prepared_t *pp,
                                         const tide_binding_t *b, cudaStream_t caller,
                                         tide_cuda_stats_t *st) {
    struct tide_mp_direct *d = pp->direct;
    st->direct = d == NULL || !d->on ? 0 : d->fuse_on ? 2 : 1;
    if (d == NULL || !d->fuse_on) return TIDE_SUCCESS;
    const int parity = (int)(b->epoch % 2), me = a->w->base.rank;
    for (int id = pp->sched.op_base[me * TIDE_CUDA_Q];
         id < pp->sched.op_base[(me + 1) * TIDE_CUDA_Q]; ++id) {
        tide_cuda_fuse_t *f = d->fuse[id];
        if (f == NULL) continue;
        TIDE_CHECK(fuse_upload(a, pp, b, f, parity, caller, st));
        pp->bound[id].sum.fused = f->dev[parity];
    }
    return TIDE_SUCCESS;
}
