/*
 * direct.c - the CPU fabric's direct mode: in a threads world every rank's memory is the
 * process's, so the copies that only move bytes between emulated memories are left out
 * (docs/cpu-fabric.md, "Direct mode"; the analysis is program/direct.h's).
 *
 * Why: on a machine with few cores the CPU fabric is limited by the bytes it touches, not by
 * its waits.  The emulation pushes every Level-1 piece into the owner's STAGING, copies spare
 * to inbox, puts rail bytes into receive stages and then reads all of them again, and that
 * footprint does not stay in cache.  Direct mode reads the gradients, spares and shards
 * where they are instead; the sums and landings do the same arithmetic in the same order, so
 * the outputs are bit-identical (tests/unit/test_fabric_cpu_direct.c).
 *
 * How a call binds the shortcuts:
 *   - every rank publishes its binding (gradients, output, shard, alpha) in the
 *     registration's shared state before its first op; a peer reads it only after a wait
 *     that follows one of the rank's signals of the same call (an elided push, an elided
 *     put), so the release/acquire pair of that signal orders the publication before the
 *     read, as it ordered the copy's bytes before;
 *   - an elided copy still fires its signal (interp.c);
 *   - a SUM reads the other local ranks' gradients through tide_sum_args_t.peers, a fused SUM
 *     stores into the landing rank's output through .fused, a landing reads through
 *     .in_table (built once per bank parity: its addresses are the arena's), an all-gather
 *     reader copies from the sender's shard;
 *   - at the end of the call every rank waits until all ranks of the world ended it (one
 *     cumulative counter): a peer may read this rank's gradients or shard, or store into its
 *     output, until its own call ends; and the source of an aliased inbox copy is rewritten
 *     two calls later only (program/direct.c), after everyone's join of the call between.
 *     This is what the CUDA fabric does by moving read-done and call-done after the node's
 *     or the readers' calls, and by its per-call fence.
 */
#include "core/checks.h"
#include "fabric/cpu/cpu.h"
#include "plan/plan.h"
#include "program/direct.h"
#include "program/sync_elide.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* One program's analysis, made by the first rank that runs it and shared by all: every
 * rank's copy of a group's program is compiled from the same plan (the registration compared
 * the group signatures), so the analysis and the op numbering are the same; the ranks differ
 * only in the program copy they bind against.  A program is known by its collective, mode,
 * fence kind and its group's arena regions. */
struct tide_cpu_direct_plan {
    struct tide_cpu_direct_plan *next;
    int coll, mode, fence; /* which program of the group */
    /* Which group: the groups of a shared arena (docs/arena.md) run on one fabric arena, each
     * with its own regions in it (its signals and resident blocks at least). */
    tide_region_info_t regions[TIDE_REGION_COUNT];
    tide_schedule_t sched; /* the op numbering of the analysis */
    tide_direct_t dir;
    tide_sync_elide_t se; /* the synchronisation elision (program/sync_elide.h) */
};

struct tide_cpu_direct_prog {
    struct tide_cpu_direct_prog *next;
    const tide_program_t *prog;   /* this rank's copy */
    const tide_schedule_t *sched; /* the shared plan's */
    const tide_direct_t *dir;
    const tide_sync_elide_t *se; /* on: WAITs dropped, late ops after the end join */
    int coll;                  /* 0 AG, 1 RS */
    const float **land_tab[2]; /* [parity] every in_table of this rank's landings */
    size_t *land_at;           /* [num_ops]: offset of an op's in_table in land_tab */
    bool land_ready[2];
    tide_sum_fused_t *fused; /* scratch: a fused SUM's rows */
    int max_fused;
    const void **row; /* (L - 1) P peer gradient pointers of the current call */
    bool row_ready;
};

int tide_cpu_direct_env(void) {
    const char *env = getenv("TIDE_CPU_DIRECT");
    if (env == NULL || env[0] == '\0') return TIDE_DIRECT_ALL;
    char *end;
    const long v = strtol(env, &end, 10);
    if (*end != '\0' || v < 0 || v > TIDE_DIRECT_ALL) {
        tide_log(TIDE_LOG_WARN, __FILE__, __LINE__,
                 "TIDE_CPU_DIRECT = '%s' is not a mask in [0, %d]; using %d (all shortcuts)", env,
                 TIDE_DIRECT_ALL, TIDE_DIRECT_ALL);
        return TIDE_DIRECT_ALL;
    }
    return (int)v;
}

tide_result_t tide_cpu_direct_group_new(int ranks, tide_cpu_direct_group_t **out) {
    tide_cpu_direct_group_t *g = calloc(1, sizeof(*g) + 2 * (size_t)ranks * sizeof(g->bound[0]));
    if (g == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cpu fabric: direct state of %d ranks", ranks);
    if (pthread_mutex_init(&g->lock, NULL) != 0) {
        free(g);
        return TIDE_ERR(TIDE_ERR_FABRIC, "cpu fabric: pthread_mutex_init failed");
    }
    *out = g;
    return TIDE_SUCCESS;
}

void tide_cpu_direct_group_free(tide_cpu_direct_group_t *g) {
    if (g == NULL) return;
    while (g->plans != NULL) {
        struct tide_cpu_direct_plan *p = g->plans;
        g->plans = p->next;
        tide_sync_elide_free(&p->se);
        tide_direct_free(&p->dir);
        tide_schedule_free(&p->sched);
        free(p);
    }
    pthread_mutex_destroy(&g->lock);
    free(g);
}

/* The shared analysis of `prog` (made here if no rank made it yet). */
static tide_result_t plan_of(tide_cpu_direct_group_t *g, int mask, const tide_program_t *prog,
                             struct tide_cpu_direct_plan **out) {
    const int coll = prog->coll == TIDE_COLL_REDUCE_SCATTER ? 1 : 0;
    const int mode = coll ? (int)prog->mode : 0;
    tide_result_t res = TIDE_SUCCESS;
    pthread_mutex_lock(&g->lock);
    struct tide_cpu_direct_plan *p = g->plans;
    const tide_region_info_t *regions = prog->plan->arena.regions;
    while (p != NULL && (p->coll != coll || p->mode != mode || p->fence != prog->fence ||
                         memcmp(p->regions, regions, sizeof(p->regions)) != 0))
        p = p->next;
    if (p == NULL) {
        p = calloc(1, sizeof(*p));
        if (p == NULL) {
            res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cpu fabric: direct analysis");
            goto done;
        }
        p->coll = coll;
        p->mode = mode;
        p->fence = prog->fence;
        memcpy(p->regions, regions, sizeof(p->regions));
        res = tide_schedule_layout(prog, &p->sched);
        /* One memory for all ranks: no domains. */
        if (res == TIDE_SUCCESS) res = tide_direct_analyse(prog, &p->sched, mask, NULL, &p->dir);
        bool elide = false;
        if (res == TIDE_SUCCESS) res = tide_fabric_sync_elide_env(true, &elide);
        if (res == TIDE_SUCCESS && elide &&
            ((mask & TIDE_DIRECT_FUSE && prog->coll == TIDE_COLL_REDUCE_SCATTER && p->dir.rs) ||
             prog->coll == TIDE_COLL_ALL_GATHER)) {
            res = tide_sync_elide_build(prog, &p->sched, &p->dir, &p->se);
            if (res == TIDE_SUCCESS && !p->se.on)
                TIDE_INFO("cpu fabric: %s (mode %d) keeps every wait (%s)",
                          coll ? "reduce-scatter" : "all-gather", mode, p->se.why);
        }
        if (res != TIDE_SUCCESS) {
            tide_direct_free(&p->dir);
            tide_schedule_free(&p->sched);
            free(p);
            goto done;
        }
        p->next = g->plans;
        g->plans = p;
    }
    *out = p;
done:
    pthread_mutex_unlock(&g->lock);
    return res;
}

static void prog_free(tide_cpu_direct_prog_t *dp) {
    free(dp->land_tab[0]);
    free(dp->land_tab[1]);
    free(dp->land_at);
    free(dp->fused);
    free(dp->row);
    free(dp);
}

void tide_cpu_direct_free_all(tide_cpu_arena_t *a) {
    while (a->direct_progs != NULL) {
        tide_cpu_direct_prog_t *dp = a->direct_progs;
        a->direct_progs = dp->next;
        prog_free(dp);
    }
}

static int op_id(const tide_cpu_direct_prog_t *dp, int rank, tide_queue_t q, int index) {
    return dp->sched->op_base[rank * TIDE_Q_COUNT + (int)q] + index;
}

/* The analysis of `prog` and this rank's table space (first call of the program here). */
static tide_result_t prog_new(tide_cpu_arena_t *a, const tide_program_t *prog,
                              tide_cpu_direct_prog_t **out) {
    const int me = a->base.world->rank;
    tide_cpu_direct_prog_t *dp = calloc(1, sizeof(*dp));
    if (dp == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cpu fabric: direct state");
    dp->prog = prog;
    dp->coll = prog->coll == TIDE_COLL_REDUCE_SCATTER ? 1 : 0;
    tide_result_t res;
    struct tide_cpu_direct_plan *plan = NULL;
    TIDE_CHECK_GOTO(
        plan_of(a->map->direct, ((tide_cpu_world_t *)a->base.world)->shared->direct, prog, &plan),
        res, fail);
    dp->sched = &plan->sched;
    dp->dir = &plan->dir;
    dp->se = &plan->se;
    const int n = dp->sched->num_ops;
    const tide_rank_program_t *rp = &prog->ranks[me];
    size_t tab = 0;
    if (dp->dir->land_src != NULL) {
        dp->land_at = calloc((size_t)n + 1, sizeof(*dp->land_at));
        if (dp->land_at == NULL) goto oom;
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < rp->queues[q].num_ops; ++i) {
                const int id = op_id(dp, me, (tide_queue_t)q, i);
                if (dp->dir->land_src[id] == NULL ||
                    (dp->dir->fused_land != NULL && dp->dir->fused_land[id]))
                    continue;
                const tide_table_t *t = &rp->tables[rp->queues[q].ops[i].table];
                dp->land_at[id] = tab;
                tab += (size_t)t->num_segs * (size_t)t->num_in;
            }
        for (int p = 0; p < 2; ++p) {
            dp->land_tab[p] = calloc(tab + 1, sizeof(*dp->land_tab[p]));
            if (dp->land_tab[p] == NULL) goto oom;
        }
    }
    if (dp->dir->fuse != NULL) {
        for (int id = 0; id < n; ++id)
            if (dp->dir->fuse_segs[id] > dp->max_fused) dp->max_fused = dp->dir->fuse_segs[id];
        /* A fused landing's stores are the SUM's: check their extents once here, since the
         * landing rank's own binding of the skipped LAND is not what writes them. */
        for (int id = 0; id < n; ++id) {
            if (!dp->dir->fused_land[id]) continue;
            const int t = tide_direct_thread_of(dp->sched, id);
            const tide_op_t *op = tide_schedule_op(prog, dp->sched, id, t);
            const tide_table_t *lt = &prog->ranks[t / TIDE_Q_COUNT].tables[op->table];
            for (int g = 0; g < lt->num_segs; ++g)
                if ((lt->land_segs[g].out_off + lt->land_segs[g].len) * 4u >
                    prog->plan->geom.fp32_shard_bytes) {
                    res = TIDE_ERR(TIDE_ERR_INTERNAL,
                                   "cpu fabric: a fused landing of rank %d writes past the "
                                   "output shard",
                                   t / TIDE_Q_COUNT);
                    goto fail;
                }
        }
        dp->fused = calloc((size_t)dp->max_fused + 1, sizeof(*dp->fused));
        if (dp->fused == NULL) goto oom;
    }
    if (dp->dir->sum) {
        const int np = prog->plan->geom.num_params, l = dp->dir->l;
        dp->row = calloc((size_t)(l > 1 ? l - 1 : 1) * (size_t)np + 1, sizeof(*dp->row));
        if (dp->row == NULL) goto oom;
    }
    *out = dp;
    return TIDE_SUCCESS;
oom:
    res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cpu fabric: direct tables");
fail:
    prog_free(dp);
    return res;
}

tide_result_t tide_cpu_direct_begin(tide_cpu_arena_t *a, const tide_program_t *prog,
                                    const tide_binding_t *b, tide_cpu_direct_prog_t **dp_out) {
    *dp_out = NULL;
    tide_cpu_direct_group_t *g = a->map->direct;
    if (g == NULL) return TIDE_SUCCESS;
    tide_cpu_direct_prog_t *dp = a->direct_progs;
    while (dp != NULL && dp->prog != prog)
        dp = dp->next;
    if (dp == NULL) {
        TIDE_CHECK(prog_new(a, prog, &dp));
        dp->next = a->direct_progs;
        a->direct_progs = dp;
    }
    /* The synchronisation elision needs the end-of-call join even without a shortcut (the
     * all-gather at M = 1). */
    if (!dp->dir->rs && !dp->dir->ag && !dp->se->on) return TIDE_SUCCESS;
    dp->row_ready = false;
    atomic_store_explicit(
        &g->bound[(size_t)dp->coll * (size_t)a->base.world->ranks + (size_t)b->rank], b,
        memory_order_release);
    if (dp->se->on) ++a->elided_calls;
    *dp_out = dp;
    return TIDE_SUCCESS;
}

bool tide_cpu_direct_skips(const tide_cpu_direct_prog_t *dp, int rank, tide_queue_t q, int index) {
    const int id = op_id(dp, rank, q, index);
    return (dp->dir->elide != NULL && dp->dir->elide[id]) ||
           (dp->dir->fused_land != NULL && dp->dir->fused_land[id]);
}

bool tide_cpu_direct_drops(const tide_cpu_direct_prog_t *dp, int rank, tide_queue_t q,
                           int index) {
    return dp->se->on && dp->se->drop[op_id(dp, rank, q, index)] &&
           dp->prog->ranks[rank].queues[q].ops[index].kind == TIDE_OP_WAIT;
}

bool tide_cpu_direct_late(const tide_cpu_direct_prog_t *dp, int rank, tide_queue_t q,
                          int index) {
    return dp->se->on && dp->se->late[op_id(dp, rank, q, index)];
}

/* The late ops of rank b->rank (the output's padding ZEROs; EVENTs have no data here), in
 * program order, once every rank ended the call. */
static tide_result_t run_late(tide_cpu_direct_prog_t *dp, const tide_binding_t *b) {
    const tide_rank_program_t *rp = &dp->prog->ranks[b->rank];
    for (int q = 0; q < TIDE_Q_COUNT; ++q)
        for (int i = 0; i < rp->queues[q].num_ops; ++i) {
            if (!tide_cpu_direct_late(dp, b->rank, (tide_queue_t)q, i) ||
                rp->queues[q].ops[i].kind == TIDE_OP_EVENT)
                continue;
            tide_bound_op_t bo;
            TIDE_CHECK(tide_bind_op(b, dp->prog, (tide_queue_t)q, i, &bo));
            TIDE_CHECK(tide_cpu_op_data(dp, b, dp->prog, (tide_queue_t)q, i, &bo));
        }
    return TIDE_SUCCESS;
}

/* Rank u's binding of this call (b's call): published before any signal of u that the
 * caller's waits followed. */
static tide_result_t peer(const tide_binding_t *b, int coll, int u, const tide_binding_t **out) {
    if (u == b->rank) {
        *out = b;
        return TIDE_SUCCESS;
    }
    const tide_cpu_arena_t *a = (const tide_cpu_arena_t *)b->arena;
    const tide_binding_t *ub = atomic_load_explicit(
        &a->map->direct->bound[(size_t)coll * (size_t)b->arena->world->ranks + (size_t)u],
        memory_order_acquire);
    if (ub == NULL || ub->epoch != b->epoch)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cpu fabric: rank %d, call %" PRIu64 ": rank %d's binding of this call "
                        "is not published where direct mode reads it (call %" PRId64 ")",
                        b->rank, b->epoch, u, ub == NULL ? (int64_t)-1 : (int64_t)ub->epoch);
    *out = ub;
    return TIDE_SUCCESS;
}

tide_result_t tide_cpu_direct_copy(tide_cpu_direct_prog_t *dp, const tide_binding_t *b,
                                   tide_queue_t q, int index, tide_bound_op_t *bo) {
    if (dp->dir->ag_src == NULL) return TIDE_SUCCESS;
    const tide_direct_ag_src_t *src = &dp->dir->ag_src[op_id(dp, b->rank, q, index)];
    if (src->put < 0) return TIDE_SUCCESS;
    /* The put's source as the sender binds it for this call: its shard. */
    const int t = tide_direct_thread_of(dp->sched, src->put);
    const tide_binding_t *sb = NULL;
    TIDE_CHECK(peer(b, dp->coll, t / TIDE_Q_COUNT, &sb));
    tide_bound_op_t put;
    TIDE_CHECK(tide_bind_op(sb, dp->prog, (tide_queue_t)(t % TIDE_Q_COUNT),
                            src->put - dp->sched->op_base[t], &put));
    bo->src = (const uint8_t *)put.src + src->delta;
    return TIDE_SUCCESS;
}

/* The L - 1 other local ranks' gradient tables in local-rank order (program/direct.h). */
static tide_result_t peer_row(tide_cpu_direct_prog_t *dp, const tide_binding_t *b) {
    const int l = dp->dir->l, j = b->rank % l, node0 = b->rank - j;
    const int np = dp->prog->plan->geom.num_params;
    for (int k = 0; k < l - 1; ++k) {
        const tide_binding_t *ub = NULL;
        TIDE_CHECK(peer(b, dp->coll, node0 + (k < j ? k : k + 1), &ub));
        if (ub->grads == NULL)
            return TIDE_ERR(TIDE_ERR_INTERNAL, "cpu fabric: rank %d has no gradients",
                            node0 + (k < j ? k : k + 1));
        memcpy(dp->row + (size_t)k * (size_t)np, ub->grads, (size_t)np * sizeof(*dp->row));
    }
    dp->row_ready = true;
    return TIDE_SUCCESS;
}

tide_result_t tide_cpu_direct_sum(tide_cpu_direct_prog_t *dp, const tide_binding_t *b,
                                  tide_queue_t q, int index, tide_sum_args_t *a) {
    if (!dp->dir->rs) return TIDE_SUCCESS;
    const int id = op_id(dp, b->rank, q, index);
    if (dp->dir->sum && a->num_staged > 0) {
        if (a->num_staged != dp->dir->l - 1)
            return TIDE_ERR(TIDE_ERR_INTERNAL,
                            "cpu fabric: rank %d: a sum of %d staged contributions on a node "
                            "of %d ranks",
                            b->rank, a->num_staged, dp->dir->l);
        /* Built at the first such SUM of the call: it waited for every local rank's push. */
        if (!dp->row_ready) TIDE_CHECK(peer_row(dp, b));
        a->peers = dp->row;
        a->peer_stride = dp->prog->plan->geom.num_params;
    }
    if (dp->dir->fuse == NULL || dp->dir->fuse[id] == NULL) return TIDE_SUCCESS;
    const tide_direct_fuse_seg_t *f = dp->dir->fuse[id];
    for (int s = 0; s < dp->dir->fuse_segs[id]; ++s) {
        tide_sum_fused_t *row = &dp->fused[s];
        memset(row, 0, sizeof(*row));
        if (f[s].land < 0) continue; /* an empty segment: nothing is stored */
        const int lt = tide_direct_thread_of(dp->sched, f[s].land);
        const int lrank = lt / TIDE_Q_COUNT;
        const tide_op_t *lop = tide_schedule_op(dp->prog, dp->sched, f[s].land, lt);
        const tide_table_t *tb = &dp->prog->ranks[lrank].tables[lop->table];
        const tide_binding_t *lb = NULL;
        TIDE_CHECK(peer(b, dp->coll, lrank, &lb));
        row->dst = lb->out + tb->land_segs[f[s].seg].out_off;
        row->alpha = lb->alpha;
        row->overwrite = lop->init && !lb->accumulate;
        row->plus_zero = tb->num_in > 1 || tb->plus_zero;
    }
    a->fused = dp->fused;
    return TIDE_SUCCESS;
}

tide_result_t tide_cpu_direct_land(tide_cpu_direct_prog_t *dp, const tide_binding_t *b,
                                   tide_queue_t q, int index, tide_land_args_t *a) {
    if (dp->dir->land_src == NULL) return TIDE_SUCCESS;
    const int id = op_id(dp, b->rank, q, index);
    const tide_direct_land_src_t *src = dp->dir->land_src[id];
    if (src == NULL) return TIDE_SUCCESS;
    const int parity = (int)(b->epoch % 2);
    const float **tab = dp->land_tab[parity] + dp->land_at[id];
    a->in_table = tab;
    if (dp->land_ready[parity]) return TIDE_SUCCESS;
    /* First call of this parity: every landing's table of it (arena addresses only). */
    const tide_rank_program_t *rp = &dp->prog->ranks[b->rank];
    for (int qq = 0; qq < TIDE_Q_COUNT; ++qq)
        for (int i = 0; i < rp->queues[qq].num_ops; ++i) {
            const int lid = op_id(dp, b->rank, (tide_queue_t)qq, i);
            const tide_direct_land_src_t *ls = dp->dir->land_src[lid];
            if (ls == NULL || (dp->dir->fused_land != NULL && dp->dir->fused_land[lid])) continue;
            tide_land_args_t la;
            TIDE_CHECK(tide_bind_land(b, dp->prog, (tide_queue_t)qq, i, &la));
            const float **out = dp->land_tab[parity] + dp->land_at[lid];
            for (int g = 0; g < la.num_segs; ++g)
                for (int k = 0; k < la.num_in; ++k) {
                    const tide_direct_land_src_t *o = &ls[(size_t)g * (size_t)la.num_in + k];
                    const float **e = &out[(size_t)g * (size_t)la.num_in + k];
                    if (o->kind == TIDE_DIRECT_LAND_ZERO) {
                        *e = NULL;
                    } else if (o->kind == TIDE_DIRECT_LAND_ALIAS) {
                        /* The elided copy's source: an arena address of its rank, bound with
                         * this call's bank (a copy of this binding as that rank's). */
                        const int t = tide_direct_thread_of(dp->sched, o->copy);
                        tide_binding_t cb = *b;
                        cb.rank = t / TIDE_Q_COUNT;
                        tide_bound_op_t bo;
                        TIDE_CHECK(tide_bind_op(&cb, dp->prog, (tide_queue_t)(t % TIDE_Q_COUNT),
                                                o->copy - dp->sched->op_base[t], &bo));
                        *e = (const float *)((const uint8_t *)bo.src + o->delta);
                    } else {
                        *e = la.in[k] + la.segs[g].in_off;
                    }
                }
        }
    dp->land_ready[parity] = true;
    return TIDE_SUCCESS;
}

tide_result_t tide_cpu_direct_end(tide_cpu_arena_t *a, tide_cpu_direct_prog_t *dp,
                                  const tide_binding_t *b, bool failed) {
    tide_cpu_direct_group_t *g = a->map->direct;
    const int n = a->base.world->ranks;
    const uint64_t target = ++a->joins[dp->coll] * (uint64_t)n;
    tide_cpu_counter_t *ctr = &g->joined[dp->coll];
    /* A failed call arrives without waiting: the group is unusable from here on (fail-stop),
     * and the ranks that ended their call need not wait out a deadline for it. */
    const bool last = atomic_fetch_add_explicit(ctr, 1, memory_order_acq_rel) + 1 == target;
    if (last || failed) {
        for (int r = 0; r < n; ++r)
            tide_cpu_doorbell_ring(&a->calls[r].doorbell);
        return failed ? TIDE_SUCCESS : run_late(dp, b);
    }
    const uint64_t deadline = tide_cpu_deadline_ns();
    tide_cpu_waiter_t wt = {.d = &a->calls[b->rank].doorbell};
    uint64_t v;
    while ((v = atomic_load_explicit(ctr, memory_order_acquire)) < target) {
        if (tide_cpu_now_ns() > deadline) {
            tide_cpu_waiter_done(&wt);
            char hint[256];
            return TIDE_ERR(
                TIDE_ERR_TIMEOUT,
                "rank %d: %s call %" PRIu64 ": only %" PRIu64 " of %d ranks ended "
                "the call within TIDE_TIMEOUT_MS = %lld ms (direct mode's end-of-"
                "call join); %s",
                b->rank, dp->coll ? "reduce_scatter" : "all_gather", b->epoch,
                v - (target - (uint64_t)n), n, (long long)tide_fabric_timeout_ms(),
                tide_cpu_timeout_hint((const tide_cpu_world_t *)a->base.world, hint, sizeof(hint)));
        }
        tide_cpu_waiter_idle(&wt);
    }
    tide_cpu_waiter_done(&wt);
    return run_late(dp, b);
}
