/*
 * streams_sim.h - the one-process-per-rank CUDA fabric's stream semantics on the host, for the
 * command lists it replays over an emulated rail transport (fabric/cuda/mp_rails.c,
 * transport/ipc/ipc.c, call.c, mp_execute.c).
 *
 * rails_sim.h runs a program under the rail *semantics* (program/rails.h).  This runs what
 * the fabric *enqueues*: per rank, its six queue streams, its one rail stream and its caller
 * stream, each a FIFO of stream operations (event records and waits with CUDA's rule that a
 * wait names the event's last record at enqueue time; 64-bit flag writes and GEQ waits), fed
 * call after call from the schedule's command list (tide_schedule_build_rails) with the
 * transport's rules: a put's flag written by its receiver's step, a credit a precondition of
 * the step that receives, the emulated rendezvous of posted / sent flags per step, empty
 * puts moving nothing.  Device progress runs every stream head that may run; the host of a
 * rank blocks for its call e - 2 before enqueuing call e (mp_execute.c), and every rank
 * enqueues call k before any enqueues call k + 1 (the argument check).  A deadlock is a state
 * where no stream can move and some call has not ended: the test names the blocked heads.
 */
#ifndef TIDE_TESTS_STREAMS_SIM_H_
#define TIDE_TESTS_STREAMS_SIM_H_

#include "test_util.h"

#include "program/program.h"
#include "program/rails.h"
#include "program/schedule.h"

#define SS_MAX_RANKS 16
#define SS_PROGS 3 /* flag areas: AG, RS in place, RS slot reuse (mp.h) */
#define SS_STREAMS (TIDE_Q_COUNT + 2)
#define SS_RAIL TIDE_Q_COUNT
#define SS_CALLER (TIDE_Q_COUNT + 1)

enum { SS_WAIT_EV, SS_REC_EV, SS_WAIT_FLAG, SS_WRITE_FLAG };

typedef struct {
    int kind;
    int stream;     /* the stream it was enqueued on (its hardware queue: ss_t.chan) */
    int ev;         /* event id */
    int64_t inst;   /* the record's instance, or the instance a wait needs (0: none) */
    uint64_t *flag; /* a flag of some rank */
    uint64_t value;
    char what[96];
} ss_op_t;

typedef struct {
    ss_op_t *ops;
    int n, cap, head;
} ss_stream_t;

/* A program as one rank's fabric prepared it (mp_execute.c prepare, mp_rails.c classify). */
typedef struct {
    const tide_program_t *prog;
    int fidx;
    tide_schedule_t sched;
    tide_rails_t rails;
    uint8_t *op_kind[SS_MAX_RANKS];   /* per rank: 0 op, 1 step, 2 in step */
    int32_t *op_step[SS_MAX_RANKS];   /* per rank */
    uint8_t *slot_kind[SS_MAX_RANKS]; /* per rank: 0 peer, 1 own, 2 skip */
    int ev_reach, ev_done;            /* first event ids of the steps' reach / done events */
    bool unsupported;                 /* tide_rails_build refused the program */
} ss_prog_t;

typedef struct {
    int64_t last_epoch;
    int last_prep;
    int64_t done_inst[2]; /* the done event's record instance per parity */
    int64_t done_epoch[2];
} ss_family_t;

typedef struct {
    int n, l;
    ss_stream_t streams[SS_MAX_RANKS][SS_STREAMS];
    /* Flags per rank: family done flags, slot flags per flag area, rendezvous flags. */
    uint64_t done_flag[SS_MAX_RANKS][2];
    uint64_t *slot_flag[SS_MAX_RANKS][SS_PROGS];
    uint64_t *rail_flag[SS_MAX_RANKS][SS_PROGS];
    int max_slots, max_steps;
    int64_t *ev_recorded, *ev_completed; /* [events] */
    int num_events, ev_cap;
    int ev_start, ev_end, ev_done_call; /* per rank: start; per thread: end; per rank x fam x 2 */
    ss_family_t fam[SS_MAX_RANKS][2];
    int chan[SS_STREAMS]; /* the hardware queue each stream feeds (identity: one each) */
} ss_t;

static inline int ss_event_new(ss_t *s, int count) {
    const int first = s->num_events;
    s->num_events += count;
    if (s->num_events > s->ev_cap) {
        s->ev_cap = 2 * s->num_events;
        s->ev_recorded = realloc(s->ev_recorded, (size_t)s->ev_cap * sizeof(int64_t));
        s->ev_completed = realloc(s->ev_completed, (size_t)s->ev_cap * sizeof(int64_t));
        assert_true(s->ev_recorded && s->ev_completed);
    }
    for (int i = first; i < s->num_events; ++i)
        s->ev_recorded[i] = s->ev_completed[i] = 0;
    return first;
}

static inline void ss_init(ss_t *s, int n, int l, int max_slots, int max_steps) {
    memset(s, 0, sizeof(*s));
    assert_true(n <= SS_MAX_RANKS);
    s->n = n;
    s->l = l;
    s->max_slots = max_slots;
    s->max_steps = max_steps;
    for (int k = 0; k < SS_STREAMS; ++k)
        s->chan[k] = k;
    for (int r = 0; r < n; ++r)
        for (int f = 0; f < SS_PROGS; ++f) {
            s->slot_flag[r][f] = calloc((size_t)max_slots + 1, sizeof(uint64_t));
            s->rail_flag[r][f] = calloc(2 * (size_t)max_steps + 2, sizeof(uint64_t));
            assert_true(s->slot_flag[r][f] && s->rail_flag[r][f]);
        }
    s->ev_start = ss_event_new(s, n);
    s->ev_end = ss_event_new(s, n * TIDE_Q_COUNT);
    s->ev_done_call = ss_event_new(s, n * 2 * 2);
    for (int r = 0; r < n; ++r)
        for (int f = 0; f < 2; ++f) {
            s->fam[r][f].last_epoch = -1;
            s->fam[r][f].done_epoch[0] = s->fam[r][f].done_epoch[1] = -1;
        }
}

static inline void ss_free(ss_t *s) {
    for (int r = 0; r < s->n; ++r) {
        for (int k = 0; k < SS_STREAMS; ++k)
            free(s->streams[r][k].ops);
        for (int f = 0; f < SS_PROGS; ++f) {
            free(s->slot_flag[r][f]);
            free(s->rail_flag[r][f]);
        }
    }
    free(s->ev_recorded);
    free(s->ev_completed);
}

static inline void ss_push(ss_t *s, int r, int k, ss_op_t op) {
    op.stream = k;
    ss_stream_t *st = &s->streams[r][s->chan[k]];
    if (st->n == st->cap) {
        st->cap = st->cap ? 2 * st->cap : 64;
        st->ops = realloc(st->ops, (size_t)st->cap * sizeof(*st->ops));
        assert_non_null(st->ops);
    }
    st->ops[st->n++] = op;
}

static inline void ss_record(ss_t *s, int r, int k, int ev, const char *what) {
    ss_op_t op = {.kind = SS_REC_EV, .ev = ev, .inst = ++s->ev_recorded[ev]};
    snprintf(op.what, sizeof(op.what), "record %s", what);
    ss_push(s, r, k, op);
}

/* cudaStreamWaitEvent: the event's last record when enqueued (none: no wait). */
static inline void ss_wait_event(ss_t *s, int r, int k, int ev, const char *what) {
    if (s->ev_recorded[ev] == 0) return;
    ss_op_t op = {.kind = SS_WAIT_EV, .ev = ev, .inst = s->ev_recorded[ev]};
    snprintf(op.what, sizeof(op.what), "wait event %s", what);
    ss_push(s, r, k, op);
}

static inline void ss_write(ss_t *s, int r, int k, uint64_t *flag, uint64_t v, const char *what) {
    ss_op_t op = {.kind = SS_WRITE_FLAG, .flag = flag, .value = v};
    snprintf(op.what, sizeof(op.what), "write %s = %llu", what, (unsigned long long)v);
    ss_push(s, r, k, op);
}

static inline void ss_wait_flag(ss_t *s, int r, int k, uint64_t *flag, uint64_t v,
                                const char *what) {
    ss_op_t op = {.kind = SS_WAIT_FLAG, .flag = flag, .value = v};
    snprintf(op.what, sizeof(op.what), "wait %s >= %llu", what, (unsigned long long)v);
    ss_push(s, r, k, op);
}

static inline uint64_t *ss_slot(ss_t *s, int r, int fidx, int slot) {
    assert_true(slot >= 0 && slot < s->max_slots);
    return &s->slot_flag[r][fidx][slot];
}
static inline uint64_t *ss_rail(ss_t *s, int r, int fidx, int step, int which) {
    assert_true(step >= 0 && step < s->max_steps);
    return &s->rail_flag[r][fidx][2 * step + which];
}

/* Device progress: every stream head that may run, until none can. */
static inline void ss_progress(ss_t *s) {
    for (bool moved = true; moved;) {
        moved = false;
        for (int r = 0; r < s->n; ++r)
            for (int k = 0; k < SS_STREAMS; ++k) {
                ss_stream_t *st = &s->streams[r][k];
                while (st->head < st->n) {
                    const ss_op_t *op = &st->ops[st->head];
                    bool ok = true;
                    switch (op->kind) {
                    case SS_WAIT_EV:
                        ok = s->ev_completed[op->ev] >= op->inst;
                        break;
                    case SS_REC_EV:
                        if (s->ev_completed[op->ev] < op->inst) s->ev_completed[op->ev] = op->inst;
                        break;
                    case SS_WAIT_FLAG:
                        ok = *op->flag >= op->value;
                        break;
                    case SS_WRITE_FLAG:
                        *op->flag = op->value; /* written, not maxed (ipc.c) */
                        break;
                    }
                    if (!ok) break;
                    ++st->head;
                    moved = true;
                }
            }
    }
}

/* The first blocked stream head, for a failure message. */
static inline bool ss_blocked(const ss_t *s, char *why, size_t len) {
    static const char *const names[SS_STREAMS] = {"ready", "caller-q", "ce",   "done",
                                                  "read",  "net",      "rail", "caller"};
    for (int r = 0; r < s->n; ++r)
        for (int k = 0; k < SS_STREAMS; ++k) {
            const ss_stream_t *st = &s->streams[r][k];
            if (st->head < st->n) {
                snprintf(why, len, "rank %d stream %s blocked at \"%s\" (%d ops left)", r,
                         names[st->ops[st->head].stream], st->ops[st->head].what, st->n - st->head);
                return true;
            }
        }
    return false;
}

#endif /* TIDE_TESTS_STREAMS_SIM_H_ */
