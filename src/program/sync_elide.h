/*
 * sync_elide.h - groundwork for eliding synchronisation in fused direct mode
 * (docs/performance.md, "What one reduce-scatter call enqueues per rank"; docs/sync-elide.md).
 *
 * In direct mode with fused sums at M = 1 every Level-1 push is elided and every landing is
 * fused into a SUM, so nothing touches staging or the spare across ranks, and the credits,
 * the own PUSHED / SUMMED signals and the ARRIVED / LANDED barriers only order what the
 * fabric's end-of-call fence already orders.  The proposal keeps only the STAGED signals and
 * waits ("rank u's caller reached this call").
 *
 * The static checker proves invariants on a program, not on a fabric's elisions, so this
 * file builds a *model* program: the compiled program as the fused direct fabric runs it,
 * with the proposed waits and signals removed and the fence written out as ordinary ops.
 * tide_program_check_ex with options.direct_operands = 1 then checks it.  The model is
 * analysis only: no fabric or executor runs it; the fabrics run the commands of
 * tide_sync_elide_build below.  The all-gather's model (no lowering: see
 * tide_sync_elide_model) is checked without direct_operands.
 *
 * How the direct semantics are lowered into the IR (what the checker sees):
 *   - an elided push keeps its fused signal as a bare SIGNAL where it stood (as the fabrics
 *     fire it), and its bytes move into a pull on the target's READ queue right before the
 *     SUM: a copy from the pusher's gradient (a peer operand reference) into the target's
 *     staging.  The SUM reads the peers' gradients there in direct mode, so the pull makes
 *     the same accesses at the same point; staging becomes private to one queue;
 *   - a fused LAND moves from the owner's NET queue to the summing rank's READ queue, right
 *     after the SUM, writing the owner's output (a LAND table whose `out` names a peer);
 *   - the fence: every non-empty queue of a rank ends with a SIGNAL of the rank's own
 *     TIDE_SYNC_ELIDE_CTR_QUEUES; the CALLER queue waits for them, signals
 *     TIDE_SYNC_ELIDE_CTR_FENCE on every rank, waits for all N, then records read-done and
 *     call-done (the proposal records both after the end fence).  Both counters are
 *     all-gather counters, unused by a reduce-scatter program.
 */
#ifndef TIDE_PROGRAM_SYNC_ELIDE_H_
#define TIDE_PROGRAM_SYNC_ELIDE_H_

#include "program/counters.h"
#include "program/direct.h"
#include "program/program.h"
#include "program/schedule.h"

enum {
    TIDE_SYNC_ELIDE_CTR_QUEUES = TIDE_CTR_AG_READY, /* a queue of the rank finished the call */
    TIDE_SYNC_ELIDE_CTR_FENCE = TIDE_CTR_FENCE,     /* a rank finished the call */
    /* The all-gather's model keeps READY: its queues' counter is one no all-gather uses. */
    TIDE_SYNC_ELIDE_AG_CTR_QUEUES = TIDE_CTR_RS_PUSHED
};

enum {
    TIDE_SYNC_ELIDE_PROPOSAL = 0,    /* keep the STAGED waits and signals, drop the rest */
    TIDE_SYNC_ELIDE_DROP_STAGED = 1, /* drop the STAGED ones (the all-gather's READY) as well
                                      * (must fail the check) */
    TIDE_SYNC_ELIDE_NO_FENCE = 2     /* leave the fence out (ops and events stay) */
};

/* What the reduction removed and kept, summed over all ranks, counted as program ops (a
 * WAIT for k signals is one op; a copy's fused signal is one signal). */
typedef struct {
    int waits_dropped, signals_dropped;
    int waits_kept, signals_kept;
    int pushes_elided, landings_fused;
} tide_sync_elide_stats_t;

/*
 * Build the model of `prog` (a reduce-scatter program at M = 1, L >= 2, compiled, not a
 * fence) as fused direct mode runs it, with the proposal's waits and signals removed (flags:
 * TIDE_SYNC_ELIDE_*).  An all-gather program at M = 1, L >= 2 without a cast is modelled as
 * the fabrics run its elision: its own ops, READY's waits and signals kept, every other wait
 * and signal (a copy's fused one too) dropped, the fence with TIDE_SYNC_ELIDE_AG_CTR_QUEUES
 * for the queues, its EVENTs after it (stats: no pushes elided, no landings fused).  The direct analysis is the fabrics' (tide_direct_analyse with
 * TIDE_DIRECT_SUM | TIDE_DIRECT_FUSE); TIDE_ERR_UNSUPPORTED when it does not elide every
 * push and fuse every landing, or the program has ops the lowering does not know.
 * *model_out (release with tide_program_free; it borrows prog's plan) and *stats_out (may be
 * NULL) are set only on success.
 */
tide_result_t tide_sync_elide_model(const tide_program_t *prog, int flags,
                                    tide_program_t *model_out, tide_sync_elide_stats_t *stats_out);

/*
 * Whether `prog` has the shape the elision knows (sync_elide_plan.c): a reduce-scatter at
 * M = 1, L >= 2, not a fence, whose direct analysis `dir` (SUM | FUSE) elides every push into
 * STAGING and fuses every landing into a SUM, with only the NET queue's ZEROs (the output's
 * padding) and EVENTs besides.  On false, `why` (may be NULL) says which op is outside it.
 */
bool tide_sync_elide_shape(const tide_program_t *prog, const tide_schedule_t *sched,
                           const tide_direct_t *dir, char *why, size_t why_len);

/*
 * What a fabric runs in fused direct mode with the synchronisation elided: the model above,
 * as commands (docs/sync-elide.md, "The fabrics").  Built from the schedule's own command
 * lists, so the order of everything kept is the one the schedule proved deadlock free:
 *   - RECORD, WAIT and WAIT_PREV of a signal on any counter but STAGED are left out (drop);
 *   - the NET queue's padding ZEROs and the EVENT ops leave the queues (late): the executor
 *     runs them, in program order, on the caller's stream after its end-of-call fence (every
 *     rank finished the call), which it must issue on every call that runs these commands,
 *     with its start fence on call e - 1 (the STAGED counting wait relies on no rank being a
 *     call ahead, which only the fences bound once the credits are gone);
 *   - a thread left with nothing that issues (no record, no data op, no upload) is not
 *     forked; its no-op OP commands (elided pushes, fused landings) stay for the counts;
 *   - the schedule's joins are replaced by one JOIN of every forked thread (the fewest
 *     joins of the full list relied on waits between the rank's threads that are gone).
 * Checked on the result, in both forms: every rank's SUM is preceded on its stream by a WAIT
 * on a STAGED signal of every other rank of this call; otherwise `on` is false (with `why`).
 * A program of another shape gives on = false, not an error.
 */
typedef struct {
    bool on;
    uint8_t *drop;                          /* [schedule num_ops]: WAITs and signalling ops left out */
    uint8_t *late;                          /* [schedule num_ops]: ops run after the end fence */
    tide_sched_cmd_t *cmds[TIDE_SCHED_FORMS]; /* the commands with the above applied */
    int num_cmds[TIDE_SCHED_FORMS];
    char why[160]; /* on false: why the elision does not apply */
} tide_sync_elide_t;

/* Build the elision of `prog` (schedule `sched` from tide_schedule_build; `dir` its direct
 * analysis with TIDE_DIRECT_SUM | TIDE_DIRECT_FUSE).  From an op numbering alone
 * (tide_schedule_layout: no commands) only `drop` and `late` are made, for a fabric that runs
 * the program's WAIT ops themselves (the CPU fabric).  *out is set on success (on may be
 * false) and released with tide_sync_elide_free. */
tide_result_t tide_sync_elide_build(const tide_program_t *prog, const tide_schedule_t *sched,
                                    const tide_direct_t *dir, tide_sync_elide_t *out);
void tide_sync_elide_free(tide_sync_elide_t *se);

/* Whether op `id` (of thread t) issues anything on its stream when the elision runs: not a
 * SIGNAL, WAIT or EVENT, not a copy direct mode elides, not a fused landing, not late. */
bool tide_sync_elide_issues(const tide_program_t *prog, const tide_schedule_t *sched,
                            const tide_direct_t *dir, const tide_sync_elide_t *se, int id, int t);

#endif /* TIDE_PROGRAM_SYNC_ELIDE_H_ */
