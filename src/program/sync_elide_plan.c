/*
 * sync_elide_plan.c - the elision of sync_elide.h as the fabrics run it: the schedule's
 * command lists with every wait and signal but STAGED left out, the output's padding ZEROs
 * and the EVENTs moved behind the executor's end-of-call fence, and the joins redone.
 *
 * Why this is safe is the model's argument (sync_elide.c, checked by test_sync_elide): in
 * fused direct mode at M = 1 nothing reads or writes staging or the spare across ranks and
 * each output piece is written by one rank's fused sum, so what the dropped counters ordered
 * is ordered by the end fence, except a peer's access to my gradients and output before my
 * caller reached the call, which the STAGED waits keep out.  What this file adds is the
 * mapping onto commands, and a check of the one property the model needs from them (every
 * SUM waits for a STAGED signal of every other rank of the same call) rather than trusting
 * the schedule's dropped-as-implied waits, which may have relied on a dropped chain.
 */
#include "program/sync_elide.h"

#include "core/checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_copy(const tide_op_t *op) {
    return op->kind == TIDE_OP_COPY || op->kind == TIDE_OP_COPY2D;
}

/* The all-gather at M = 1 without a cast: READY announces "my landing is free" (the caller
 * reached the call), CALLER copies the own shard into every landing with LANDED fused,
 * DONE joins them.  With the end fence, LANDED and CALLER_DONE order nothing the fence does
 * not; READY stays (a peer must not write my landing before my caller reached the call). */
static bool ag_shape(const tide_program_t *prog, const tide_schedule_t *sc, char *why,
                     size_t why_len) {
    for (int t = 0; t < sc->num_threads; ++t) {
        const int q = t % TIDE_Q_COUNT;
        for (int id = sc->op_base[t]; id < sc->op_base[t + 1]; ++id) {
            const tide_op_t *op = tide_schedule_op(prog, sc, id, t);
            const bool ok =
                (q == TIDE_Q_READY && (op->kind == TIDE_OP_WAIT || op->kind == TIDE_OP_SIGNAL)) ||
                (q == TIDE_Q_CALLER &&
                 (op->kind == TIDE_OP_WAIT || op->kind == TIDE_OP_SIGNAL ||
                  (is_copy(op) && op->dst.kind == TIDE_REF_LANDING &&
                   op->src.kind == TIDE_REF_SHARD))) ||
                (q == TIDE_Q_DONE && (op->kind == TIDE_OP_WAIT || op->kind == TIDE_OP_EVENT));
            if (!ok) {
                snprintf(why, why_len,
                         "rank %d queue %s op %d (%s) is outside the all-gather at M = 1",
                         t / TIDE_Q_COUNT, tide_queue_name((tide_queue_t)q),
                         id - sc->op_base[t], tide_op_kind_name(op->kind));
                return false;
            }
            if (op->kind == TIDE_OP_WAIT && op->ctr == TIDE_CTR_AG_READY && op->thr != op->inc) {
                snprintf(why, why_len, "rank %d waits for part of a call's READY signals",
                         t / TIDE_Q_COUNT);
                return false;
            }
        }
    }
    return true;
}

bool tide_sync_elide_shape(const tide_program_t *prog, const tide_schedule_t *sc,
                           const tide_direct_t *dir, char *why, size_t why_len) {
    char dummy[8];
    if (why == NULL) why = dummy, why_len = sizeof(dummy);
    if (prog->fence != 0 || prog->plan->topo.nodes != 1 || prog->plan->topo.gpus_per_node < 2) {
        snprintf(why, why_len, "only programs at M = 1, L >= 2 (not fences)");
        return false;
    }
    if (prog->coll == TIDE_COLL_ALL_GATHER) return ag_shape(prog, sc, why, why_len);
    if (dir == NULL || !dir->rs || !dir->sum || dir->fuse == NULL || dir->fused_land == NULL) {
        snprintf(why, why_len, "the program has no fused direct mode");
        return false;
    }
    for (int t = 0; t < sc->num_threads; ++t) {
        const int q = t % TIDE_Q_COUNT;
        for (int id = sc->op_base[t]; id < sc->op_base[t + 1]; ++id) {
            const tide_op_t *op = tide_schedule_op(prog, sc, id, t);
            const bool ok =
                (q == TIDE_Q_CE || q == TIDE_Q_READ || q == TIDE_Q_NET) &&
                (op->kind == TIDE_OP_WAIT || op->kind == TIDE_OP_SIGNAL ||
                 op->kind == TIDE_OP_EVENT || (op->kind == TIDE_OP_ZERO && q == TIDE_Q_NET) ||
                 (is_copy(op) && q == TIDE_Q_CE && dir->elide != NULL && dir->elide[id] &&
                  op->dst.kind == TIDE_REF_ARENA && op->dst.region == TIDE_REGION_STAGING &&
                  op->src.kind == TIDE_REF_GRAD) ||
                 (op->kind == TIDE_OP_SUM && q == TIDE_Q_READ && dir->fuse[id] != NULL) ||
                 (op->kind == TIDE_OP_LAND && q == TIDE_Q_NET && dir->fused_land[id]));
            if (!ok) {
                snprintf(why, why_len,
                         "rank %d queue %s op %d (%s) is outside fused direct mode at M = 1",
                         t / TIDE_Q_COUNT, tide_queue_name((tide_queue_t)q),
                         id - sc->op_base[t], tide_op_kind_name(op->kind));
                return false;
            }
            /* A STAGED wait must count every STAGED signal of its call (one pass): a
             * counting wait for part of them (several passes) names no peer, and without
             * the credits the peers' pushes of a later pass could fill its count. */
            if (op->kind == TIDE_OP_WAIT && op->ctr == TIDE_CTR_RS_STAGED && op->thr != op->inc) {
                snprintf(why, why_len,
                         "rank %d waits for %lld of its %lld STAGED signals a call (several "
                         "passes)",
                         t / TIDE_Q_COUNT, (long long)op->thr, (long long)op->inc);
                return false;
            }
        }
    }
    return true;
}

bool tide_sync_elide_issues(const tide_program_t *prog, const tide_schedule_t *sched,
                            const tide_direct_t *dir, const tide_sync_elide_t *se, int id,
                            int t) {
    const tide_op_t *op = tide_schedule_op(prog, sched, id, t);
    if (op->kind == TIDE_OP_SIGNAL || op->kind == TIDE_OP_WAIT || op->kind == TIDE_OP_EVENT)
        return false;
    if (dir != NULL && dir->elide != NULL && dir->elide[id]) return false;
    if (dir != NULL && dir->fused_land != NULL && dir->fused_land[id]) return false;
    return !(se->late != NULL && se->late[id]);
}

/* The one counter whose signals and waits stay: "the rank reached the call". */
static int kept_counter(const tide_program_t *prog) {
    return prog->coll == TIDE_COLL_ALL_GATHER ? TIDE_CTR_AG_READY : TIDE_CTR_RS_STAGED;
}

/* Per op: left out, run late. */
static void mark_ops(const tide_program_t *prog, const tide_schedule_t *sc,
                     tide_sync_elide_t *se) {
    for (int t = 0; t < sc->num_threads; ++t)
        for (int id = sc->op_base[t]; id < sc->op_base[t + 1]; ++id) {
            const tide_op_t *op = tide_schedule_op(prog, sc, id, t);
            if (tide_machine_uses_counter(op) && op->ctr != kept_counter(prog)) se->drop[id] = 1;
            if (op->kind == TIDE_OP_ZERO || op->kind == TIDE_OP_EVENT) se->late[id] = 1;
        }
}

/* The signalling op of each slot. */
static tide_result_t slot_ops(const tide_schedule_t *sc, int32_t **out) {
    int32_t *so = malloc(((size_t)sc->num_slots + 1) * sizeof(*so));
    if (so == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "sync elide: %d slots", sc->num_slots);
    for (int k = 0; k < sc->num_slots; ++k)
        so[k] = -1;
    for (int id = 0; sc->op_slot != NULL && id < sc->num_ops; ++id)
        if (sc->op_slot[id] >= 0) so[sc->op_slot[id]] = id;
    *out = so;
    return TIDE_SUCCESS;
}

static bool is_sync(int kind) {
    return kind == TIDE_SCHED_CMD_RECORD || kind == TIDE_SCHED_CMD_WAIT ||
           kind == TIDE_SCHED_CMD_WAIT_PREV;
}

/* Whether command c stays, before the threads are pruned. */
static bool kept(const tide_sync_elide_t *se, const int32_t *so, const tide_sched_cmd_t *c) {
    if (is_sync(c->kind)) return so[c->arg] >= 0 && !se->drop[so[c->arg]];
    if (c->kind == TIDE_SCHED_CMD_OP) return !se->late[c->arg];
    return c->kind != TIDE_SCHED_CMD_JOIN;
}

static tide_result_t filter_form(const tide_program_t *prog, const tide_schedule_t *sc,
                                 const tide_direct_t *dir, const int32_t *so, int f,
                                 tide_sync_elide_t *se) {
    const int nt = sc->num_threads, n = sc->num_cmds[f];
    bool *live = calloc((size_t)nt + 1, sizeof(*live));
    tide_sched_cmd_t *out = malloc(((size_t)n + (size_t)nt + 1) * sizeof(*out));
    if (live == NULL || out == NULL) {
        free(live);
        free(out);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "sync elide: %d commands", n);
    }
    const tide_sched_cmd_t *in = sc->cmds[f];
    for (int i = 0; i < n; ++i) {
        const tide_sched_cmd_t *c = &in[i];
        if (!kept(se, so, c)) continue;
        switch (c->kind) {
        case TIDE_SCHED_CMD_RECORD:
        case TIDE_SCHED_CMD_UPLOAD:
        case TIDE_SCHED_CMD_UPLOAD_WAIT:
        case TIDE_SCHED_CMD_BATCH:
            live[c->thread] = true;
            break;
        case TIDE_SCHED_CMD_OP:
            if (tide_sync_elide_issues(prog, sc, dir, se, c->arg, c->thread))
                live[c->thread] = true;
            break;
        default:
            break;
        }
    }
    int m = 0;
    for (int i = 0; i < n; ++i) {
        const tide_sched_cmd_t *c = &in[i];
        if (!kept(se, so, c)) continue;
        /* A pruned thread keeps only its no-op OP commands (the interpreter counts them). */
        if (!live[c->thread] && c->kind != TIDE_SCHED_CMD_OP) continue;
        out[m++] = *c;
    }
    for (int t = 0; t < nt; ++t)
        if (live[t]) out[m++] = (tide_sched_cmd_t){TIDE_SCHED_CMD_JOIN, t, 0};
    free(live);
    se->cmds[f] = out;
    se->num_cmds[f] = m;
    return TIDE_SUCCESS;
}

/* Every op that touches a peer's memory waits, earlier on its stream, on that peer's kept
 * signal of this call ("the peer reached the call", the property the model's STAGED waits
 * give): a reduce-scatter's SUM reads every other rank's gradients and stores their outputs;
 * an all-gather's copy writes the landing of the rank it names. */
static bool peers_reached(const tide_program_t *prog, const tide_schedule_t *sc,
                          const int32_t *so, tide_sync_elide_t *se, int f) {
    const int nranks = sc->num_ranks, keep = kept_counter(prog);
    uint8_t *seen = calloc((size_t)sc->num_threads * (size_t)nranks + 1, 1);
    if (seen == NULL) {
        snprintf(se->why, sizeof(se->why), "no memory for the check of %d threads",
                 sc->num_threads);
        return false;
    }
    bool ok = true;
    for (int i = 0; i < se->num_cmds[f] && ok; ++i) {
        const tide_sched_cmd_t *c = &se->cmds[f][i];
        const int t = c->thread, r = t / TIDE_Q_COUNT;
        uint8_t *row = &seen[(size_t)t * (size_t)nranks];
        if (c->kind == TIDE_SCHED_CMD_WAIT) {
            const int id = so[c->arg], u = sc->slot_thread[c->arg] / TIDE_Q_COUNT;
            const tide_op_t *sig = tide_schedule_op(prog, sc, id, sc->slot_thread[c->arg]);
            if (sig->ctr == keep && sig->sig_rank == r) row[u] = 1;
            continue;
        }
        if (c->kind != TIDE_SCHED_CMD_OP) continue;
        const tide_op_t *op = tide_schedule_op(prog, sc, c->arg, t);
        for (int u = 0; u < nranks; ++u) {
            const bool touches = op->kind == TIDE_OP_SUM
                                     ? u != r
                                     : is_copy(op) && op->dst.kind == TIDE_REF_LANDING &&
                                           op->dst.rank == u && u != r;
            if (touches && !row[u]) {
                snprintf(se->why, sizeof(se->why),
                         "rank %d's %s does not wait for rank %d's %s signal (form %d)", r,
                         tide_op_kind_name(op->kind), u,
                         keep == TIDE_CTR_AG_READY ? "READY" : "STAGED", f);
                ok = false;
                break;
            }
        }
    }
    free(seen);
    return ok;
}

/* One flag write per run of records.  A thread's RECORDs with nothing between them but
 * commands that issue nothing (elided pushes, fused landings: a CE thread's STAGED signals,
 * a READY thread's) all say the same thing: the thread got there, after its fork and the
 * waits before the run.  Every WAIT on a record of such a run waits on the run's first
 * record instead, and the others go: a fabric whose signals are flags (the processes
 * writing and polling them share the device) then writes one flag per rank where it wrote
 * N - 1.  Done after peers_reached, which reads the records' targets. */
static tide_result_t merge_records(const tide_program_t *prog, const tide_schedule_t *sc,
                                   const tide_direct_t *dir, tide_sync_elide_t *se, int f) {
    int32_t *rep = malloc(((size_t)sc->num_slots + 1) * sizeof(*rep));
    int32_t *run = malloc(((size_t)sc->num_threads + 1) * sizeof(*run));
    if (rep == NULL || run == NULL) {
        free(rep);
        free(run);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "sync elide: %d slots", sc->num_slots);
    }
    for (int k = 0; k < sc->num_slots; ++k)
        rep[k] = k;
    for (int t = 0; t < sc->num_threads; ++t)
        run[t] = -1;
    tide_sched_cmd_t *c = se->cmds[f];
    int m = 0;
    for (int i = 0; i < se->num_cmds[f]; ++i) {
        tide_sched_cmd_t x = c[i];
        const int t = x.thread;
        if (x.kind == TIDE_SCHED_CMD_RECORD) {
            if (run[t] >= 0) {
                rep[x.arg] = run[t]; /* the same point of the thread: left out */
                continue;
            }
            run[t] = x.arg;
        } else if (x.kind == TIDE_SCHED_CMD_WAIT) {
            x.arg = rep[x.arg]; /* its record precedes it: rep is final */
            run[t] = -1;
        } else if (!(x.kind == TIDE_SCHED_CMD_OP &&
                     !tide_sync_elide_issues(prog, sc, dir, se, x.arg, t))) {
            run[t] = -1; /* anything else of the thread ends the run */
        }
        c[m++] = x;
    }
    se->num_cmds[f] = m;
    free(rep);
    free(run);
    return TIDE_SUCCESS;
}

void tide_sync_elide_free(tide_sync_elide_t *se) {
    if (se == NULL) return;
    free(se->drop);
    free(se->late);
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f)
        free(se->cmds[f]);
    memset(se, 0, sizeof(*se));
}

tide_result_t tide_sync_elide_build(const tide_program_t *prog, const tide_schedule_t *sched,
                                    const tide_direct_t *dir, tide_sync_elide_t *out) {
    TIDE_ARG_CHECK(prog != NULL && prog->plan != NULL && sched != NULL && out != NULL,
                   "sync elide: NULL argument");
    tide_sync_elide_t se;
    memset(&se, 0, sizeof(se));
    if (!tide_sync_elide_shape(prog, sched, dir, se.why, sizeof(se.why))) {
        *out = se;
        return TIDE_SUCCESS;
    }
    se.drop = calloc((size_t)sched->num_ops + 1, 1);
    se.late = calloc((size_t)sched->num_ops + 1, 1);
    int32_t *so = NULL;
    tide_result_t res = TIDE_SUCCESS;
    if (se.drop == NULL || se.late == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "sync elide: %d ops", sched->num_ops);
        goto fail;
    }
    mark_ops(prog, sched, &se);
    se.on = true;
    /* An op numbering without commands (tide_schedule_layout: the CPU fabric runs the
     * program's own WAITs, every one whole): the per-op marks only. */
    if (sched->cmds[0] == NULL) {
        *out = se;
        return TIDE_SUCCESS;
    }
    TIDE_CHECK_GOTO(slot_ops(sched, &so), res, fail);
    for (int f = 0; f < TIDE_SCHED_FORMS && se.on; ++f) {
        TIDE_CHECK_GOTO(filter_form(prog, sched, dir, so, f, &se), res, fail);
        if (!peers_reached(prog, sched, so, &se, f)) se.on = false;
        if (se.on) TIDE_CHECK_GOTO(merge_records(prog, sched, dir, &se, f), res, fail);
    }
    free(so);
    if (!se.on) {
        char why[sizeof(se.why)];
        memcpy(why, se.why, sizeof(why));
        tide_sync_elide_free(&se);
        memcpy(se.why, why, sizeof(why));
    }
    *out = se;
    return TIDE_SUCCESS;
fail:
    free(so);
    tide_sync_elide_free(&se);
    return res;
}
