/*
 * rails.c - the rail schedule of a program (rails.h): classify the cross-node ops, number the
 * puts, group them into steps, match the receives, and place the credits.
 */
#include "program/rails.h"

#include "core/checks.h"
#include "program/machine.h"

#include <stdlib.h>
#include <string.h>

/* Where a put sits: its op in the rank's put queue, and the rank it goes to. */
typedef struct {
    int32_t op;
    int32_t target;
} put_pos_t;

typedef struct {
    int32_t rank, queue, op, call;
} sig_inst_t;

typedef struct {
    const tide_program_t *prog;
    int n, l;
    int ctrs;
    int max_puts;      /* P: the most puts a rank has per call */
    int steps;         /* steps per call, the same on every rank */
    uint8_t *arrival;  /* [ctrs]: counter indices that some cross-node copy signals */
    put_pos_t *puts;   /* [n * P] */
    int32_t *recv_of;  /* [n * P]: index of put (a, k) among its receiver's recvs */
    int *first;        /* [n * (steps + 1)]: a rank's first put of each step, then its count */
    uint8_t *feed;     /* [n * ctrs]: 1 local, 2 put, 4 credit */
    int64_t *count;    /* [n * ctrs]: signals per call */
    int64_t *log_base; /* [n * ctrs + 1] */
    sig_inst_t *log;   /* two calls of signal instances per counter, in machine order */
} build_t;

enum { FEED_LOCAL = 1, FEED_PUT = 2, FEED_CREDIT = 4 };

static bool ref_remote(const build_t *b, int rank, const tide_ref_t *r) {
    return (r->kind == TIDE_REF_ARENA || r->kind == TIDE_REF_LANDING) &&
           tide_rails_remote(b->l, rank, r->rank);
}

/* A bare SIGNAL on another node's rank, on a counter index that cross-node copies signal
 * too: an arrival that moves no bytes (rails.h, "empty put"). */
static bool empty_put(const build_t *b, int rank, const tide_op_t *op) {
    return op->kind == TIDE_OP_SIGNAL && tide_rails_remote(b->l, rank, op->sig_rank) &&
           op->ctr >= 0 && op->ctr < b->ctrs && b->arrival[op->ctr];
}

/* Whether op of `rank` is a put: a copy to another node's memory, or an empty put. */
static bool is_put(const build_t *b, int rank, const tide_op_t *op) {
    return (op->kind == TIDE_OP_COPY && ref_remote(b, rank, &op->dst)) || empty_put(b, rank, op);
}

static tide_result_t unsupported(int rank, int q, int i, const char *why) {
    return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "rails: rank %d %s[%d]: %s", rank,
                    tide_queue_name((tide_queue_t)q), i, why);
}

/* The counter indices that cross-node copies signal (on their destination). */
static void find_arrivals(build_t *b) {
    const tide_program_t *prog = b->prog;
    for (int r = 0; r < b->n; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const tide_queue_ops_t *qo = &prog->ranks[r].queues[q];
            for (int i = 0; i < qo->num_ops; ++i) {
                const tide_op_t *op = &qo->ops[i];
                if (op->kind == TIDE_OP_COPY && ref_remote(b, r, &op->dst) &&
                    op->sig_rank == op->dst.rank && op->ctr >= 0 && op->ctr < b->ctrs)
                    b->arrival[op->ctr] = 1;
            }
        }
}

/* Every op that crosses nodes is a put (a flat COPY to a remote destination that signals
 * nothing or its destination; or an empty put) or a credit; at most one queue per rank holds
 * puts.  Fills the per-rank tables. */
static tide_result_t classify(build_t *b, tide_rails_t *out) {
    const tide_program_t *prog = b->prog;
    int most = 0;
    for (int r = 0; r < b->n; ++r) {
        tide_rails_rank_t *rr = &out->ranks[r];
        rr->queue = -1;
        int mine = 0;
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const tide_queue_ops_t *qo = &prog->ranks[r].queues[q];
            rr->dropped[q] = calloc((size_t)qo->num_ops + 1, 1);
            rr->credit[q] = calloc((size_t)qo->num_ops + 1, 1);
            if (rr->dropped[q] == NULL || rr->credit[q] == NULL)
                return TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: op tables");
            for (int i = 0; i < qo->num_ops; ++i) {
                const tide_op_t *op = &qo->ops[i];
                if (ref_remote(b, r, &op->src))
                    return unsupported(r, q, i, "reads memory of another node");
                const bool put = is_put(b, r, op);
                if (!put && op->kind == TIDE_OP_SIGNAL &&
                    tide_rails_remote(b->l, r, op->sig_rank)) {
                    rr->credit[q][i] = 1;
                    b->feed[(size_t)op->sig_rank * (size_t)b->ctrs + (size_t)op->ctr] |= FEED_CREDIT;
                    continue;
                }
                if (!put) {
                    if (ref_remote(b, r, &op->dst))
                        return unsupported(r, q, i,
                                           "writes another node without being a flat copy");
                    if (tide_machine_signals(op)) {
                        if (tide_rails_remote(b->l, r, op->sig_rank))
                            return unsupported(r, q, i, "a local copy signals another node");
                        b->feed[(size_t)op->sig_rank * (size_t)b->ctrs + (size_t)op->ctr] |=
                            FEED_LOCAL;
                    }
                    continue;
                }
                if (op->kind == TIDE_OP_COPY && op->sig_rank >= 0 && op->sig_rank != op->dst.rank)
                    return unsupported(r, q, i,
                                       "a copy to another node signals another rank than its "
                                       "destination");
                if (rr->queue >= 0 && rr->queue != q)
                    return unsupported(r, q, i, "puts in two queues of one rank");
                rr->queue = q;
                ++mine;
                if (op->sig_rank >= 0)
                    b->feed[(size_t)op->sig_rank * (size_t)b->ctrs + (size_t)op->ctr] |= FEED_PUT;
            }
        }
        rr->num_puts = mine;
        if (mine > most) most = mine;
    }
    b->max_puts = most;
    out->puts = most;
    return TIDE_SUCCESS;
}

/* The puts of every rank in queue order, and the put-step table of its queue. */
static tide_result_t number_puts(build_t *b, tide_rails_t *out) {
    const int p = b->max_puts > 0 ? b->max_puts : 1;
    b->puts = calloc((size_t)b->n * (size_t)p, sizeof(*b->puts));
    b->recv_of = calloc((size_t)b->n * (size_t)p, sizeof(*b->recv_of));
    if (b->puts == NULL || b->recv_of == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: puts");
    for (int r = 0; r < b->n; ++r) {
        tide_rails_rank_t *rr = &out->ranks[r];
        if (rr->queue < 0) continue;
        const tide_queue_ops_t *qo = &b->prog->ranks[r].queues[rr->queue];
        rr->put_step = malloc(((size_t)qo->num_ops + 1) * sizeof(*rr->put_step));
        if (rr->put_step == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: put steps");
        int k = 0;
        for (int i = 0; i < qo->num_ops; ++i) {
            rr->put_step[i] = -1;
            const tide_op_t *op = &qo->ops[i];
            if (!is_put(b, r, op)) continue;
            const int target = op->kind == TIDE_OP_COPY ? op->dst.rank : op->sig_rank;
            b->puts[(size_t)r * (size_t)p + (size_t)k++] = (put_pos_t){i, target};
        }
    }
    return TIDE_SUCCESS;
}

static const put_pos_t *put_at(const build_t *b, int rank, int k) {
    return &b->puts[(size_t)rank * (size_t)(b->max_puts > 0 ? b->max_puts : 1) + (size_t)k];
}

static int32_t *recv_of(const build_t *b, int rank, int k) {
    return &b->recv_of[(size_t)rank * (size_t)(b->max_puts > 0 ? b->max_puts : 1) + (size_t)k];
}

static int *first_of(const build_t *b, int rank) {
    return &b->first[(size_t)rank * (size_t)(b->steps + 1)];
}

/* Steps: each rank's maximal runs of puts adjacent in their queue (rails.h); every rank must
 * have the same number of them. */
static tide_result_t make_steps(build_t *b, tide_rails_t *out) {
    int steps = -1;
    for (int r = 0; r < b->n; ++r) {
        int mine = 0;
        for (int k = 0; k < out->ranks[r].num_puts; ++k)
            mine += k == 0 || put_at(b, r, k)->op != put_at(b, r, k - 1)->op + 1;
        if (steps >= 0 && mine != steps)
            return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                            "rails: rank %d has %d rail steps per call (runs of adjacent "
                            "cross-node puts), rank 0 has %d",
                            r, mine, steps);
        steps = mine;
    }
    b->steps = steps > 0 ? steps : 0;
    out->num_steps = b->steps;
    const size_t per_rank = (size_t)b->steps + 1, ranks = b->n > 0 ? (size_t)b->n : 1;
    b->first = calloc(ranks * per_rank, sizeof(*b->first));
    if (b->first == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: steps");
    for (int r = 0; r < b->n; ++r) {
        int *first = first_of(b, r), s = 0;
        for (int k = 0; k < out->ranks[r].num_puts; ++k)
            if (k == 0 || put_at(b, r, k)->op != put_at(b, r, k - 1)->op + 1) first[s++] = k;
        first[s] = out->ranks[r].num_puts;
    }
    return TIDE_SUCCESS;
}

static tide_rail_xfer_t put_xfer(const build_t *b, const tide_rails_t *out, int a, int k) {
    const put_pos_t *pp = put_at(b, a, k);
    const int q = out->ranks[a].queue;
    const tide_op_t *op = &b->prog->ranks[a].queues[q].ops[pp->op];
    const bool copy = op->kind == TIDE_OP_COPY;
    const tide_ref_t none = {TIDE_REF_NONE, 0, 0, -1, 0};
    return (tide_rail_xfer_t){.src_rank = a,
                              .dst_rank = pp->target,
                              .put = k,
                              .queue = q,
                              .op = pp->op,
                              .src = copy ? op->src : none,
                              .dst = copy ? op->dst : none,
                              .bytes = copy ? op->bytes : 0,
                              .bank_dep = copy ? op->bank_dep : 0,
                              .ctr = op->sig_rank >= 0 ? op->ctr : -1};
}

/* Sends and receives of every rank, step by step. */
static tide_result_t match(build_t *b, tide_rails_t *out) {
    const int s_n = out->num_steps;
    for (int r = 0; r < b->n; ++r) {
        tide_rails_rank_t *rr = &out->ranks[r];
        rr->steps = calloc((size_t)s_n + 1, sizeof(*rr->steps));
        rr->sends = calloc((size_t)rr->num_puts + 1, sizeof(*rr->sends));
        rr->recvs = calloc((size_t)b->n * (size_t)(b->max_puts + 1), sizeof(*rr->recvs));
        if (rr->steps == NULL || rr->sends == NULL || rr->recvs == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: steps of rank %d", r);
    }
    for (int s = 0; s < s_n; ++s) {
        for (int r = 0; r < b->n; ++r) {
            tide_rails_rank_t *rr = &out->ranks[r];
            tide_rail_step_t *st = &rr->steps[s];
            const int *first = first_of(b, r);
            st->first_put = first[s];
            st->num_puts = first[s + 1] - first[s];
            st->first_send = rr->num_sends;
            st->first_recv = rr->num_recvs;
            st->queue = rr->queue;
            st->first_op = put_at(b, r, first[s])->op;
            for (int k = first[s]; k < first[s + 1]; ++k) {
                rr->sends[rr->num_sends++] = put_xfer(b, out, r, k);
                rr->put_step[put_at(b, r, k)->op] = s;
            }
            st->num_sends = rr->num_sends - st->first_send;
        }
        for (int a = 0; a < b->n; ++a) {
            const int *first = first_of(b, a);
            for (int k = first[s]; k < first[s + 1]; ++k) {
                const int t = put_at(b, a, k)->target;
                tide_rails_rank_t *rt = &out->ranks[t];
                *recv_of(b, a, k) = rt->num_recvs;
                rt->recvs[rt->num_recvs++] = put_xfer(b, out, a, k);
            }
        }
        for (int r = 0; r < b->n; ++r) {
            tide_rail_step_t *st = &out->ranks[r].steps[s];
            st->num_recvs = out->ranks[r].num_recvs - st->first_recv;
        }
    }
    return TIDE_SUCCESS;
}

/* A put that signals nothing is covered by a later put of its step to the same rank that
 * does: the receiver raises that one's counter once the whole step is in, so whoever waits on
 * it sees the unsignalled bytes too.  Any other unsignalled put would go unseen. */
static tide_result_t check_covered(const build_t *b, const tide_rails_t *out) {
    for (int a = 0; a < b->n; ++a) {
        const tide_rails_rank_t *ra = &out->ranks[a];
        for (int s = 0; s < out->num_steps; ++s) {
            const tide_rail_step_t *st = &ra->steps[s];
            for (int k = st->first_send; k < st->first_send + st->num_sends; ++k) {
                if (ra->sends[k].ctr >= 0) continue;
                bool covered = false;
                for (int j = k + 1; j < st->first_send + st->num_sends && !covered; ++j)
                    covered =
                        ra->sends[j].dst_rank == ra->sends[k].dst_rank && ra->sends[j].ctr >= 0;
                if (!covered)
                    return unsupported(a, ra->queue, ra->sends[k].op,
                                       "a copy to another node signals nothing and no later "
                                       "put of its rail step signals that rank");
            }
        }
    }
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ credits */

/* Two calls of the abstract machine, logging every signal instance per counter. */
static tide_result_t run_log(build_t *b) {
    const tide_program_t *prog = b->prog;
    const size_t slots = (size_t)b->n * (size_t)b->ctrs;
    b->log_base = calloc(slots + 1, sizeof(*b->log_base));
    if (b->log_base == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: signal log");
    for (size_t c = 0; c < slots; ++c)
        b->log_base[c + 1] = b->log_base[c] + 2 * b->count[c];
    b->log = calloc((size_t)b->log_base[slots] + 1, sizeof(*b->log));
    if (b->log == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: signal log");
    tide_machine_t m;
    TIDE_CHECK(tide_machine_init(&m, prog, b->ctrs, 2));
    for (bool progress = true; progress;) {
        progress = false;
        for (int t = 0; t < m.threads; ++t)
            while (tide_machine_enabled(&m, t)) {
                const tide_op_t *op = tide_machine_head(&m, t);
                if (tide_machine_signals(op)) {
                    const size_t c = (size_t)op->sig_rank * (size_t)b->ctrs + (size_t)op->ctr;
                    const int64_t k = *tide_machine_counter(&m, op->sig_rank, op->ctr);
                    if (k < 2 * b->count[c])
                        b->log[b->log_base[c] + k] =
                            (sig_inst_t){t / TIDE_Q_COUNT, t % TIDE_Q_COUNT,
                                         m.pc[t], m.epoch[t / TIDE_Q_COUNT]};
                }
                tide_machine_fire(&m, t);
                progress = true;
            }
    }
    const bool done = tide_machine_done(&m);
    tide_machine_free(&m);
    return done ? TIDE_SUCCESS
                : TIDE_ERR(TIDE_ERR_INTERNAL, "rails: the program deadlocks in two calls");
}

static tide_result_t add_credit(tide_rails_rank_t *rb, const tide_rail_credit_t *c, int *cap) {
    for (int i = 0; i < rb->num_credits; ++i)
        if (memcmp(&rb->credits[i], c, sizeof(*c)) == 0) return TIDE_SUCCESS;
    if (rb->num_credits == *cap) {
        const int ncap = *cap ? 2 * *cap : 16;
        tide_rail_credit_t *n = realloc(rb->credits, (size_t)ncap * sizeof(*n));
        if (n == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: credits");
        rb->credits = n;
        *cap = ncap;
    }
    rb->credits[rb->num_credits++] = *c;
    return TIDE_SUCCESS;
}

static int by_recv(const void *x, const void *y) {
    const tide_rail_credit_t *a = x, *b = y;
    if (a->recv != b->recv) return a->recv < b->recv ? -1 : 1;
    if (a->delta != b->delta) return a->delta < b->delta ? -1 : 1;
    if (a->queue != b->queue) return a->queue < b->queue ? -1 : 1;
    return (a->op > b->op) - (a->op < b->op);
}

/* Each WAIT on a credit counter, in both calls, names the credit instances it counts; each
 * becomes a precondition of the receive, on the credit's rank, of the first later put of
 * the waiter aimed at that rank. */
static tide_result_t place_credits(build_t *b, tide_rails_t *out) {
    int *cap = calloc((size_t)b->n, sizeof(*cap));
    if (cap == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: credits");
    tide_result_t res = TIDE_SUCCESS;
    for (int a = 0; a < b->n && res == TIDE_SUCCESS; ++a)
        for (int q = 0; q < TIDE_Q_COUNT && res == TIDE_SUCCESS; ++q) {
            const tide_queue_ops_t *qo = &b->prog->ranks[a].queues[q];
            for (int i = 0; i < qo->num_ops && res == TIDE_SUCCESS; ++i) {
                const tide_op_t *op = &qo->ops[i];
                if (op->kind != TIDE_OP_WAIT) continue;
                const size_t c = (size_t)a * (size_t)b->ctrs + (size_t)op->ctr;
                const uint8_t f = b->feed[c];
                if (!(f & FEED_CREDIT)) continue;
                if (f != FEED_CREDIT) {
                    res = unsupported(a, q, i, "waits on credits mixed with other signals");
                    break;
                }
                if (q != out->ranks[a].queue) {
                    res = unsupported(a, q, i, "waits on a credit outside its put queue");
                    break;
                }
                out->ranks[a].dropped[q][i] = 1;
                for (int e = 0; e < 2 && res == TIDE_SUCCESS; ++e) {
                    int64_t target;
                    if (!tide_machine_wait_target((uint64_t)e, op, &target)) {
                        res = TIDE_ERR(TIDE_ERR_OVERFLOW, "rails: wait target");
                        break;
                    }
                    for (int64_t k = 0; k < target && k < 2 * b->count[c]; ++k) {
                        const sig_inst_t *g = &b->log[b->log_base[c] + k];
                        int put = -1;
                        for (int j = 0; j < out->ranks[a].num_puts && put < 0; ++j) {
                            const put_pos_t *pp = put_at(b, a, j);
                            if (pp->op > i && pp->target == g->rank) put = j;
                        }
                        if (put < 0) {
                            res = unsupported(a, q, i, "a credit guards no later put to its sender");
                            break;
                        }
                        const tide_rail_credit_t cr = {g->queue, g->op, e - g->call,
                                                       *recv_of(b, a, put)};
                        res = add_credit(&out->ranks[g->rank], &cr, &cap[g->rank]);
                        if (res != TIDE_SUCCESS) break;
                    }
                }
            }
        }
    free(cap);
    if (res != TIDE_SUCCESS) return res;
    /* Group each rank's credits by step (a receive's step is known from its index). */
    for (int r = 0; r < b->n; ++r) {
        tide_rails_rank_t *rr = &out->ranks[r];
        qsort(rr->credits, (size_t)rr->num_credits, sizeof(*rr->credits), by_recv);
        int i = 0;
        for (int s = 0; s < out->num_steps; ++s) {
            tide_rail_step_t *st = &rr->steps[s];
            st->first_credit = i;
            while (i < rr->num_credits && rr->credits[i].recv < st->first_recv + st->num_recvs)
                ++i;
            st->num_credits = i - st->first_credit;
        }
    }
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ entry */

tide_result_t tide_rails_build(const tide_program_t *prog, tide_rails_t *out) {
    TIDE_ARG_CHECK(prog != NULL && prog->plan != NULL && out != NULL, "rails: no program");
    tide_rails_t r;
    memset(&r, 0, sizeof(r));
    build_t b;
    memset(&b, 0, sizeof(b));
    b.prog = prog;
    b.n = prog->num_ranks;
    b.l = prog->plan->topo.gpus_per_node;
    b.ctrs = tide_machine_counters_used(prog);
    if (b.ctrs < 1) b.ctrs = 1;
    r.num_ranks = b.n;
    r.nodes = prog->plan->topo.nodes;
    r.gpus_per_node = b.l;
    tide_result_t res = TIDE_SUCCESS;
    r.ranks = calloc((size_t)b.n, sizeof(*r.ranks));
    b.feed = calloc((size_t)b.n * (size_t)b.ctrs, 1);
    b.arrival = calloc((size_t)b.ctrs, 1);
    if (r.ranks == NULL || b.feed == NULL || b.arrival == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: %d ranks", b.n);
        goto done;
    }
    TIDE_CHECK_GOTO(tide_machine_count_signals(prog, b.ctrs, &b.count), res, done);
    find_arrivals(&b);
    TIDE_CHECK_GOTO(classify(&b, &r), res, done);
    TIDE_CHECK_GOTO(number_puts(&b, &r), res, done);
    TIDE_CHECK_GOTO(make_steps(&b, &r), res, done);
    TIDE_CHECK_GOTO(match(&b, &r), res, done);
    TIDE_CHECK_GOTO(check_covered(&b, &r), res, done);
    TIDE_CHECK_GOTO(run_log(&b), res, done);
    TIDE_CHECK_GOTO(place_credits(&b, &r), res, done);
done:
    free(b.first);
    free(b.arrival);
    free(b.puts);
    free(b.recv_of);
    free(b.feed);
    free(b.count);
    free(b.log_base);
    free(b.log);
    if (res != TIDE_SUCCESS) {
        tide_rails_free(&r);
        return res;
    }
    *out = r;
    return TIDE_SUCCESS;
}

void tide_rails_free(tide_rails_t *r) {
    if (r == NULL) return;
    for (int i = 0; r->ranks != NULL && i < r->num_ranks; ++i) {
        tide_rails_rank_t *rr = &r->ranks[i];
        free(rr->steps);
        free(rr->sends);
        free(rr->recvs);
        free(rr->credits);
        free(rr->put_step);
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            free(rr->dropped[q]);
            free(rr->credit[q]);
        }
    }
    free(r->ranks);
    memset(r, 0, sizeof(*r));
}
