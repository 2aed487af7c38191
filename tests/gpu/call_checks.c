/*
 * call_checks.c - the argument-check tests' common part (call_checks.h).
 */
#include "call_checks.h"

#include "api/comm.h"
#include "plan/plan.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>

const tide_param_shape_t checks_shapes[2] = {{64, 32}, {7, 5}};

tide_group_desc_t checks_desc(void) {
    return (tide_group_desc_t){2, checks_shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
}

checks_report_t *checks_report_new(void) {
    checks_report_t *rep =
        mmap(NULL, sizeof(*rep), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rep == MAP_FAILED) return NULL;
    memset(rep, 0, sizeof(*rep));
    return rep;
}

int checks_failed(checks_report_t *rep, int r, int step) {
    rep->step[r] = step;
    snprintf(rep->msg[r], sizeof(rep->msg[r]), "%s", tide_get_last_error());
    return step;
}

bool checks_refused(tide_result_t res, const char *what) {
    return res == TIDE_ERR_INVALID_ARGUMENT && strstr(tide_get_last_error(), what) != NULL &&
           strstr(tide_get_last_error(), "disagree") != NULL;
}

bool checks_alloc(checks_bufs_t *b, tide_group_t ag, tide_group_t rs, int fill) {
    const tide_geom_t *g = &rs->plan->geom;
    const size_t shard_bytes = ag->plan->geom.shard_bytes;
    memset(b, 0, sizeof(*b));
    if (cudaMalloc(&b->shard, shard_bytes) != cudaSuccess ||
        cudaMalloc(&b->out, g->fp32_shard_bytes) != cudaSuccess)
        return false;
    cudaMemset(b->shard, fill, shard_bytes);
    for (int p = 0; p < 2; ++p) {
        const size_t bytes = g->params[p].dim0 * g->params[p].inner * g->grad_item;
        if (cudaMalloc(&b->grads[p], bytes) != cudaSuccess) return false;
        cudaMemset(b->grads[p], 0, bytes);
    }
    return true;
}

void checks_free(checks_bufs_t *b) {
    for (int p = 0; p < 2; ++p)
        cudaFree(b->grads[p]);
    cudaFree(b->shard);
    cudaFree(b->out);
    memset(b, 0, sizeof(*b));
}

int checks_slot(tide_group_t ag, const checks_bufs_t *b, int r, int odd) {
    for (int e = 0; e < 2; ++e)
        if (tide_all_gather(ag, b->shard, e % 2, NULL) != TIDE_SUCCESS) return 10;
    if (!checks_refused(tide_all_gather(ag, b->shard, r == odd ? 1 : 0, NULL), "slot")) return 11;
    return 0;
}

int checks_alpha(tide_group_t rs, const checks_bufs_t *b, int r, int odd) {
    const void *const *grads = (const void *const *)b->grads;
    if (tide_reduce_scatter(rs, grads, b->out, 1.0f, 0, TIDE_RS_IN_PLACE, NULL) != TIDE_SUCCESS)
        return 20;
    if (!checks_refused(tide_reduce_scatter(rs, grads, b->out, r == odd ? 0.5f : 1.0f, 0,
                                            TIDE_RS_IN_PLACE, NULL),
                        "alpha"))
        return 21;
    return 0;
}

bool checks_wait(const pid_t *pids, int n, const checks_report_t *rep, const char *passed) {
    bool ok = true;
    for (int r = 0; r < n; ++r) {
        int st = 0;
        const bool got = waitpid(pids[r], &st, 0) == pids[r];
        const bool good = got && WIFEXITED(st) && WEXITSTATUS(st) == 0 && rep->step[r] == 0;
        if (good)
            printf("ok   rank %d: %s\n", r, passed);
        else if (!got)
            printf("FAIL rank %d: waitpid failed\n", r);
        else if (WIFSIGNALED(st))
            printf("FAIL rank %d: killed by signal %d (SIGALRM: it hung)\n", r, WTERMSIG(st));
        else
            printf("FAIL rank %d: step %d: %s\n", r, rep->step[r], rep->msg[r]);
        ok = ok && good;
    }
    return ok;
}
