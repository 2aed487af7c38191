/*
 * stream_ops_cmd.c - `tide-plan program --stream-ops`: what one call of the program enqueues
 * per rank on the two CUDA fabrics (program/stream_ops.h), counted without a GPU: the
 * single-process fabric (signals are events) and one process per rank (signals are flags
 * that streams write and wait kernels poll, or stream memory operations with
 * TIDE_CUDA_MP_FLAGS=host / device: one per run of waits either way, so the counts hold for
 * both), in direct mode where the reduce-scatter takes it (M = 1:
 * the sums read the peers' gradients in place and store every rank's output), with and
 * without the synchronisation elision that the one-process-per-rank fabric runs there by
 * default (program/sync_elide.h).
 */
#include "tide-plan/cli.h"

#include "program/stream_ops.h"

#include <stdio.h>
#include <string.h>

static void print_rank(const char *name, const tide_stream_ops_t *s, bool flags) {
    const char *rec = flags ? "flag writes" : "event records";
    const char *wt = flags ? "flag waits" : "event waits";
    printf("%s:\n", name);
    printf("  signals (RECORD)         %d %s\n", s->records, rec);
    printf("  waits (WAIT, WAIT_PREV)  %d %s: %d on other ranks, %d on own queues; %d runs\n",
           s->waits_peer + s->waits_own, wt, s->waits_peer, s->waits_own, s->wait_runs);
    if (flags)
        printf("  waits as issued          %d wait kernels, or memory operations with host or "
               "device flags (a run of one stream's waits is one)\n",
               s->wait_calls);
    printf("  forks / joins / upload waits  %d / %d / %d (events)\n", s->forks, s->joins,
           s->upload_waits);
    printf("  launches                 %d sum, %d land, %d copy; %d events\n", s->sums, s->lands,
           s->copies, s->events);
    printf("  direct mode              %d copies elided, %d landings fused\n", s->elided, s->fused);
    if (flags)
        printf("  executor                 %d flag writes, %d flag waits in %d memory "
               "operations, %d event records\n",
               s->exec_flag_writes, s->exec_flag_waits, s->exec_flag_calls, s->exec_event_records);
    else
        printf("  executor                 %d event records, %d event waits\n",
               s->exec_event_records, s->exec_event_waits);
    printf("  into the sums            %d waits (%d on other ranks) in %d runs\n", s->sum_waits,
           s->sum_waits_peer, s->sum_wait_runs);
    if (flags)
        printf("  stream memory operations %d (%d with every wait alone, "
               "TIDE_CUDA_MP_WAIT_RUNS=0)\n",
               tide_stream_ops_memops(s, true), tide_stream_ops_memops(s, false));
}

int cli_program_stream_ops(const char *cmd, const tide_program_t *prog, int rank) {
    tide_schedule_t sched;
    memset(&sched, 0, sizeof(sched));
    tide_direct_t dir;
    memset(&dir, 0, sizeof(dir));
    bool have_dir = false;
    tide_sync_elide_t se;
    memset(&se, 0, sizeof(se));
    int rc = CLI_EXIT_OK;
    tide_result_t res = tide_schedule_build(prog, &sched);
    if (res != TIDE_SUCCESS) return cli_lib_error(cmd, "tide_schedule_build", res);
    /* Both fabrics' reduce-scatter shortcuts at M = 1 (mp_direct.c asks for these two; the
     * single-process fabric's other bits find nothing there). */
    if (prog->coll == TIDE_COLL_REDUCE_SCATTER && prog->plan->config.nodes == 1) {
        res = tide_direct_analyse(prog, &sched, TIDE_DIRECT_SUM | TIDE_DIRECT_FUSE, NULL, &dir);
        if (res != TIDE_SUCCESS) {
            rc = cli_lib_error(cmd, "tide_direct_analyse", res);
            goto done;
        }
        have_dir = true;
    }
    if (prog->plan->config.nodes == 1) {
        res = tide_sync_elide_build(prog, &sched, have_dir ? &dir : NULL, &se);
        if (res != TIDE_SUCCESS) {
            rc = cli_lib_error(cmd, "tide_sync_elide_build", res);
            goto done;
        }
    }
    printf("# stream operations of one steady call, rank %d of %d (%s, M = %d, L = %d, %s)\n", rank,
           prog->num_ranks, prog->coll == TIDE_COLL_ALL_GATHER ? "all-gather" : "reduce-scatter",
           prog->plan->config.nodes, prog->plan->config.gpus_per_node,
           have_dir && dir.rs && dir.sum ? "direct sums" : "pushed path");
    tide_stream_ops_t s[3];
    tide_stream_ops_shared_t shared;
    for (int f = 0; f < 3; ++f) {
        const tide_stream_ops_fabric_t fab =
            f == 0 ? TIDE_STREAM_OPS_EVENTS : TIDE_STREAM_OPS_FLAGS;
        res = tide_stream_ops_count(prog, &sched, have_dir ? &dir : NULL, f == 2 ? &se : NULL,
                                    fab, rank, TIDE_SCHED_STEADY, &s[f],
                                    f == 0 ? &shared : NULL);
        if (res != TIDE_SUCCESS) {
            rc = cli_lib_error(cmd, "tide_stream_ops_count", res);
            goto done;
        }
    }
    print_rank("single-process fabric (events)", &s[0], false);
    printf("  once per call            %d event waits, %d event records (utility and "
           "aggregate streams)\n",
           shared.event_waits, shared.event_records);
    print_rank("one process per rank (flags), every signal of the program", &s[1], true);
    if (se.on)
        print_rank("one process per rank (flags), synchronisation elided (its default here)",
                   &s[2], true);
    else
        printf("synchronisation elision: not applicable (%s)\n",
               se.why[0] != '\0' ? se.why : "M > 1");
done:
    tide_sync_elide_free(&se);
    if (have_dir) tide_direct_free(&dir);
    tide_schedule_free(&sched);
    return rc;
}
