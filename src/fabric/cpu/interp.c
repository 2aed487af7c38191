/*
 * interp.c - the CPU fabric's interpreter: run one rank's program of one call to completion
 * on the calling thread.
 *
 * The rank's queues are concurrent in the program's semantics, but one thread per rank is
 * enough to honour that: queues run cooperatively, round-robin.  A queue advances until it
 * reaches a WAIT whose counter is below its target, then the next queue gets the thread.  A
 * round in which no queue advanced yields, then sleeps on the rank's doorbell until a signal
 * arrives (doorbell.c) before polling again.
 * Since every queue's waits depend only on counters, this schedule can block only where the
 * program itself deadlocks, and that is caught by the deadline.
 *
 * Memory ordering: a SIGNAL (and the fused signal of a COPY) is a release increment after the
 * op's stores (and loads) have been issued; a WAIT is an acquire load.  So bytes copied before
 * a signal are visible to the waiter, and a buffer a waiter reuses after a credit is no longer
 * read by the rank that sent the credit.
 *
 * Deadline: a WAIT fails stop when it stays unsatisfied for TIDE_TIMEOUT_MS; the message
 * names the rank, queue, op index and kind, the counter, its value and the target, and lists
 * the other blocked queues.
 */
#include "core/checks.h"
#include "fabric/cpu/cpu.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Run state of one call. */
typedef struct {
    const tide_binding_t *b;
    const tide_program_t *prog;
    int pc[TIDE_Q_COUNT];
    uint64_t blocked_since[TIDE_Q_COUNT]; /* 0: not blocked */
    tide_bound_op_t blocked_op[TIDE_Q_COUNT];
    tide_cpu_call_rec_t *recs; /* the ranks' doorbells */
    tide_cpu_direct_prog_t *direct; /* direct mode's shortcuts (direct.c), or NULL */
} run_t;

/* `owner` is the rank whose arena holds the counter: the only rank that waits on it. */
static void signal_add(run_t *run, uint64_t *ctr, int owner) {
    atomic_fetch_add_explicit(tide_cpu_counter(ctr), 1, memory_order_release);
    tide_cpu_doorbell_ring(&run->recs[owner].doorbell);
}

/* Execute op pc[q] of queue q; *ready = false when it is a WAIT that cannot pass yet. */
static tide_result_t step(run_t *run, tide_queue_t q, bool *ready) {
    const int index = run->pc[q];
    const tide_op_t *op = &run->prog->ranks[run->b->rank].queues[q].ops[index];
    tide_bound_op_t bo;
    TIDE_CHECK(tide_bind_op(run->b, run->prog, q, index, &bo));
    *ready = true;
    if (op->kind == TIDE_OP_WAIT) {
        if (run->direct != NULL && tide_cpu_direct_drops(run->direct, run->b->rank, q, index))
            return TIDE_SUCCESS; /* the synchronisation elision: ordered by the end join */
        uint64_t v = atomic_load_explicit(tide_cpu_counter(bo.wait_ctr), memory_order_acquire);
        if (bo.wait_target > 0 && v < (uint64_t)bo.wait_target) {
            *ready = false;
            run->blocked_op[q] = bo;
        }
        return TIDE_SUCCESS;
    }
    /* The synchronisation elision: the output's padding ZEROs (and the EVENTs) run after
     * the end-of-call join (direct.c). */
    if (run->direct != NULL && tide_cpu_direct_late(run->direct, run->b->rank, q, index))
        return TIDE_SUCCESS;
    /* Direct mode: a copy nobody reads, or a landing a fused sum stored, only signals. */
    if (run->direct != NULL && tide_cpu_direct_skips(run->direct, run->b->rank, q, index)) {
        if (op->kind == TIDE_OP_LAND) {
            tide_land_args_t a; /* bound all the same: its table's checks */
            TIDE_CHECK(tide_bind_land(run->b, run->prog, q, index, &a));
        }
    } else {
        /* An EVENT has no data: the call returns only after every queue finished, which
         * implies both events. */
        TIDE_CHECK(tide_cpu_op_data(run->direct, run->b, run->prog, q, index, &bo));
    }
    if (bo.signal != NULL) signal_add(run, bo.signal, op->sig_rank);
    return TIDE_SUCCESS;
}

static tide_result_t run_queues(run_t *run);

/* The fail-stop message: the queue that missed its deadline, then the others that block. */
static tide_result_t timeout_error(const run_t *run, tide_queue_t q, uint64_t now) {
    const tide_rank_program_t *rp = &run->prog->ranks[run->b->rank];
    char others[256] = "";
    size_t used = 0;
    for (int o = 0; o < TIDE_Q_COUNT && used < sizeof(others); ++o) {
        if (o == (int)q || run->blocked_since[o] == 0) continue;
        const tide_op_t *op = &rp->queues[o].ops[run->pc[o]];
        const tide_bound_op_t *bo = &run->blocked_op[o];
        int k = snprintf(others + used, sizeof(others) - used,
                         "; also blocked: queue %s op %d counter %d = %" PRIu64 " < %" PRId64,
                         tide_queue_name((tide_queue_t)o), run->pc[o], op->ctr,
                         atomic_load(tide_cpu_counter(bo->wait_ctr)), bo->wait_target);
        if (k < 0) break;
        used += (size_t)k;
    }
    const tide_op_t *op = &rp->queues[q].ops[run->pc[q]];
    const tide_bound_op_t *bo = &run->blocked_op[q];
    char hint[256];
    return TIDE_ERR(TIDE_ERR_TIMEOUT,
                    "rank %d queue %s op %d (%s) missed its deadline after %" PRIu64
                    " ms: counter %d = %" PRIu64 ", target %" PRId64 " (epoch %" PRIu64
                    ", TIDE_TIMEOUT_MS = %" PRId64 ")%s; %s",
                    run->b->rank, tide_queue_name(q), run->pc[q], tide_op_kind_name(op->kind),
                    (now - run->blocked_since[q]) / 1000000u, op->ctr,
                    atomic_load(tide_cpu_counter(bo->wait_ctr)), bo->wait_target, run->b->epoch,
                    tide_fabric_timeout_ms(), others,
                    tide_cpu_timeout_hint((const tide_cpu_world_t *)run->b->arena->world, hint,
                                          sizeof(hint)));
}

tide_result_t tide_cpu_execute(struct tide_fabric_arena *arena, const tide_program_t *prog,
                               const tide_binding_t *binding, void *stream) {
    if (stream != NULL)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "cpu fabric: stream must be NULL (the call runs on the calling thread)");
    if (prog->num_ranks != arena->world->ranks || binding->rank != arena->world->rank ||
        binding->arena != arena)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cpu fabric: program of %d ranks / binding of rank %d does not match "
                        "rank %d of %d",
                        prog->num_ranks, binding->rank, arena->world->rank, arena->world->ranks);

    tide_cpu_note_caller((tide_cpu_world_t *)arena->world);
    run_t run;
    memset(&run, 0, sizeof(run));
    run.b = binding;
    run.prog = prog;
    run.recs = ((tide_cpu_arena_t *)arena)->calls;
    TIDE_CHECK(tide_cpu_direct_begin((tide_cpu_arena_t *)arena, prog, binding, &run.direct));
    tide_result_t res = run_queues(&run);
    if (run.direct != NULL) {
        tide_result_t joined = tide_cpu_direct_end((tide_cpu_arena_t *)arena, run.direct, binding,
                                                   res != TIDE_SUCCESS);
        if (res == TIDE_SUCCESS) res = joined;
    }
    return res;
}

/* Every queue of the rank, round-robin, to the end (see the top). */
static tide_result_t run_queues(run_t *run) {
    const tide_binding_t *binding = run->b;
    const tide_program_t *prog = run->prog;
    const tide_rank_program_t *rp = &prog->ranks[binding->rank];
    const uint64_t timeout_ns = (uint64_t)tide_fabric_timeout_ms() * 1000000u;
    tide_cpu_waiter_t wt = {.d = &run->recs[binding->rank].doorbell};

    for (;;) {
        bool progress = false, done = true;
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const int num_ops = rp->queues[q].num_ops;
            while (run->pc[q] < num_ops) {
                bool ready;
                tide_result_t res = step(run, (tide_queue_t)q, &ready);
                if (res != TIDE_SUCCESS) {
                    tide_cpu_waiter_done(&wt);
                    return res;
                }
                if (!ready) {
                    uint64_t now = tide_cpu_now_ns();
                    if (run->blocked_since[q] == 0) {
                        run->blocked_since[q] = now;
                    } else if (now - run->blocked_since[q] > timeout_ns) {
                        tide_cpu_waiter_done(&wt);
                        return timeout_error(run, (tide_queue_t)q, now);
                    }
                    break;
                }
                run->blocked_since[q] = 0;
                ++run->pc[q];
                progress = true;
            }
            if (run->pc[q] < num_ops) done = false;
        }
        if (done) {
            tide_cpu_waiter_done(&wt);
            return TIDE_SUCCESS;
        }
        if (progress)
            tide_cpu_waiter_busy(&wt);
        else
            tide_cpu_waiter_idle(&wt);
    }
}
