/*
 * test_stream_ops_mp.c - the per-rank stream operations that tide-plan program --stream-ops
 * counts without a GPU (src/program/stream_ops.h) against what the one-process-per-rank CUDA
 * fabric counted while it enqueued (tide_cuda_mp_stats), for the reduce-scatter of
 * bench_fsdp_layers' layer shapes (9 parameters: dim, hidden as given) at M = 1, L = N.
 *
 *   test_stream_ops_mp [N [DIM HIDDEN]]     default 8 processes, dim 256, hidden 512
 *
 * Each rank makes CALLS reduce-scatters on its stream (the last ones steady: same gradients,
 * tables unchanged), then compares the last call's waits (event and flag waits), records
 * (event records and flag writes, as the fabric counts them), launches and copies, elided
 * copies and fused landings with the model's.  The layer's shapes only scale the bytes: the
 * program and so the counts are those of the 386 MiB layer at dim 4096, hidden 11008.
 *
 * Exit status: 0 every rank matched, 1 a mismatch or a failed rank, 2 a bad argument.
 */
#include "api/comm.h"
#include "fabric/cuda/mp.h"
#include "fabric/fabric.h"
#include "plan/plan.h"
#include "program/compile_rs.h"
#include "program/stream_ops.h"
#include "program/sync_elide.h"
#include "tide.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MAX_N = 8, P = 9, CALLS = 6 };

typedef struct {
    int status[MAX_N];
    /* waits, records, launches, elided, fused, wait calls, start fence left out */
    unsigned long long got[MAX_N][7], want[MAX_N][7];
    int direct[MAX_N];
    int memops[MAX_N]; /* the model's stream memory operations of the rank */
    int elided[MAX_N]; /* the last call ran the synchronisation elision */
} report_t;

enum { FIELDS = 7 };
static const char *const field[FIELDS] = {"waits",  "records",    "launches+copies",
                                          "elided", "fused",      "wait-calls",
                                          "start-fence-implied"};

/* The fabric's counting of one eager call (mp_execute.c, call.c, ipc.c) from the model's:
 * waits count forks, joins, upload waits and every flag polled; records count the start
 * event, joins, EVENT ops, flag writes of the commands and the done flag, the done event and
 * in direct mode without the synchronisation elision read-done (with it, the late EVENTs are
 * the model's events; the "began" word and the watchdog's event are not counted); wait calls
 * the stream memory operations the flag waits took (runs batched unless
 * TIDE_CUDA_MP_WAIT_RUNS=0); the start fence is implied after a call that ended with the end
 * fence on the same stream (direct mode, or the elision). */
static void want_of(const tide_stream_ops_t *m, bool direct, bool elided, bool runs,
                    unsigned long long *w) {
    w[0] = (unsigned long long)(m->forks + m->joins + m->upload_waits + m->waits_peer +
                                m->waits_own + m->exec_flag_waits);
    w[1] = (unsigned long long)(1 + m->joins + m->events + m->records + 1 + 1 +
                                (direct && !elided ? 1 : 0));
    w[2] = (unsigned long long)(m->copies + m->sums + m->lands);
    w[3] = (unsigned long long)m->elided;
    w[4] = (unsigned long long)m->fused;
    w[5] = (unsigned long long)((runs ? m->wait_calls : m->waits_peer + m->waits_own) +
                                m->exec_flag_calls);
    w[6] = direct || elided;
}

static int child(int n, int r, uint64_t dim, uint64_t hidden, const char *name, report_t *rep) {
    const cudaError_t e = cudaSetDevice(0); /* creates the rank's CUDA context */
    if (e != cudaSuccess) {
        fprintf(stderr, "rank %d: cudaSetDevice(0): %s\n", r, cudaGetErrorString(e));
        return 2;
    }
    const tide_param_shape_t shapes[P] = {{dim, 1},      {dim, dim},    {dim, dim},
                                          {dim, dim},    {dim, dim},    {dim, 1},
                                          {hidden, dim}, {hidden, dim}, {dim, hidden}};
    tide_comm_t comm;
    if (tide_comm_init_rank(TIDE_FABRIC_CUDA, 1, n, r, name, &comm) != TIDE_SUCCESS) return 3;
    tide_group_desc_t desc = {P, shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = 1;
    cfg.gpus_per_node = n;
    tide_group_t grp;
    if (tide_group_register(comm, &cfg, &desc, &grp) != TIDE_SUCCESS) {
        fprintf(stderr, "rank %d register: %s\n", r, tide_get_last_error());
        return 4;
    }
    const tide_geom_t *g = &grp->plan->geom;
    void *out = NULL, *grads[P];
    if (cudaMalloc(&out, g->fp32_shard_bytes) != cudaSuccess) return 5;
    for (int p = 0; p < P; ++p) {
        const size_t b = g->params[p].dim0 * g->params[p].inner * g->grad_item;
        if (cudaMalloc(&grads[p], b) != cudaSuccess) return 5;
        cudaMemset(grads[p], 0, b);
    }
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaDeviceSynchronize();
    for (int e = 0; e < CALLS; ++e)
        if (tide_reduce_scatter(grp, (const void *const *)grads, out, 1.0f, 0, TIDE_RS_IN_PLACE,
                                s) != TIDE_SUCCESS) {
            fprintf(stderr, "rank %d call %d: %s\n", r, e, tide_get_last_error());
            return 6;
        }
    if (tide_cuda_mp_sync(grp->arena, TIDE_COLL_REDUCE_SCATTER) != TIDE_SUCCESS) return 7;
    tide_cuda_stats_t st;
    if (tide_cuda_mp_stats(grp->arena, TIDE_COLL_REDUCE_SCATTER, &st) != TIDE_SUCCESS) return 7;
    rep->direct[r] = (int)st.direct;
    rep->elided[r] = (int)st.sync_elided;
    rep->got[r][0] = st.waits;
    rep->got[r][1] = st.records;
    rep->got[r][2] = st.descriptors - st.uploads; /* launches and copies */
    rep->got[r][3] = st.elided;
    rep->got[r][4] = st.fused;
    rep->got[r][5] = st.wait_calls;
    rep->got[r][6] = st.fence_skipped;

    /* The model, on the group's own plan: the program the fabric compiled is the same. */
    tide_program_t prog;
    tide_schedule_t sched;
    tide_direct_t dir;
    memset(&sched, 0, sizeof(sched));
    memset(&dir, 0, sizeof(dir));
    if (tide_program_compile_rs(grp->plan, TIDE_RS_IN_PLACE, &prog) != TIDE_SUCCESS ||
        tide_schedule_build(&prog, &sched) != TIDE_SUCCESS ||
        tide_direct_analyse(&prog, &sched, TIDE_DIRECT_SUM | TIDE_DIRECT_FUSE, NULL, &dir) !=
            TIDE_SUCCESS)
        return 8;
    tide_stream_ops_t m;
    /* The model counts fused sums (with the synchronisation elision where the fabric ran
     * it), or the pushed path. */
    const bool direct = st.direct == 2, elided = st.sync_elided != 0;
    tide_sync_elide_t se;
    memset(&se, 0, sizeof(se));
    if (elided && tide_sync_elide_build(&prog, &sched, &dir, &se) != TIDE_SUCCESS) return 8;
    if (tide_stream_ops_count(&prog, &sched, direct ? &dir : NULL, elided ? &se : NULL,
                              TIDE_STREAM_OPS_FLAGS, r, st.form, &m, NULL) != TIDE_SUCCESS)
        return 8;
    bool runs = true;
    if (tide_fabric_wait_runs_env(&runs) != TIDE_SUCCESS) return 8;
    want_of(&m, direct, elided, runs, rep->want[r]);
    rep->memops[r] = tide_stream_ops_memops(&m, runs);
    tide_sync_elide_free(&se);
    tide_direct_free(&dir);
    tide_schedule_free(&sched);
    tide_program_free(&prog);
    tide_group_deregister(grp);
    tide_comm_destroy(comm);
    return 0;
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 8;
    const long long dim = argc > 3 ? atoll(argv[2]) : 256, hidden = argc > 3 ? atoll(argv[3]) : 512;
    if (n < 2 || n > MAX_N || dim < 1 || hidden < 1) {
        fprintf(stderr, "usage: test_stream_ops_mp [N [DIM HIDDEN]] (2 <= N <= %d)\n", MAX_N);
        return 2;
    }
    report_t *rep =
        mmap(NULL, sizeof(report_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rep == MAP_FAILED) return 2;
    memset(rep, 0, sizeof(*rep));
    char name[64];
    snprintf(name, sizeof(name), "mpops%ld", (long)getpid());
    pid_t pids[MAX_N];
    for (int r = 0; r < n; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(child(n, r, (uint64_t)dim, (uint64_t)hidden, name, rep));
    }
    bool ok = true;
    for (int r = 0; r < n; ++r) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            printf("FAIL rank %d: status %d\n", r, st);
            ok = false;
            continue;
        }
        printf("rank %d (direct %d, elided %d, %d stream memory operations):", r,
               rep->direct[r], rep->elided[r], rep->memops[r]);
        for (int k = 0; k < FIELDS; ++k) {
            printf(" %s %llu (model %llu)", field[k], rep->got[r][k], rep->want[r][k]);
            if (rep->got[r][k] != rep->want[r][k]) ok = false;
        }
        printf("\n");
        /* TIDE_SYNC_ELIDE=0 asks for every signal; else the elision runs (the default). */
        const char *env = getenv("TIDE_SYNC_ELIDE");
        const int want = env != NULL && strcmp(env, "0") == 0 ? 0 : 1;
        if (rep->direct[r] != 2 || rep->elided[r] != want) {
            printf("FAIL rank %d: the reduce-scatter took path %d, elided %d, not fused "
                   "outputs %s\n",
                   r, rep->direct[r], rep->elided[r],
                   want ? "with the synchronisation elided" : "with every signal");
            ok = false;
        }
    }
    printf("%s: the stream operations of one reduce-scatter call, N = %d, dim %lld, hidden %lld\n",
           ok ? "PASS" : "FAIL", n, dim, hidden);
    return ok ? 0 : 1;
}
