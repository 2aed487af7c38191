/*
 * call_checks.h - what the argument-check tests share (test_cuda_checks.c, test_mp_checks.c,
 * test_nccl_checks.c): each registers groups of the same two parameters, makes the ranks
 * disagree on one argument of a call, and expects TIDE_ERR_INVALID_ARGUMENT naming it on
 * every rank.  The ranks of the multi-process tests report the step that failed to the
 * parent through a shared page.
 */
#ifndef TIDE_TESTS_GPU_CALL_CHECKS_H_
#define TIDE_TESTS_GPU_CALL_CHECKS_H_

#include "tide.h"

#include <stdbool.h>
#include <sys/types.h>

#define CHECKS_MAX_RANKS 4

/* In memory shared by the parent and its ranks. */
typedef struct {
    int step[CHECKS_MAX_RANKS]; /* 0: passed, else the step that failed */
    char msg[CHECKS_MAX_RANKS][400];
} checks_report_t;

/* A rank's device buffers for one all-gather group and one reduce-scatter group. */
typedef struct {
    void *shard, *out, *grads[2];
} checks_bufs_t;

/* The groups' two parameters (64 x 32 and 7 x 5, bf16). */
extern const tide_param_shape_t checks_shapes[2];
/* A group description over checks_shapes. */
tide_group_desc_t checks_desc(void);

/* A zeroed report the forked ranks share, or NULL. */
checks_report_t *checks_report_new(void);
/* Rank r's step failed: remember it and the library's message; returns step. */
int checks_failed(checks_report_t *rep, int r, int step);
/* res is TIDE_ERR_INVALID_ARGUMENT with a message naming `what` and a disagreement. */
bool checks_refused(tide_result_t res, const char *what);

/* On the current device: ag's shard (every byte `fill`), rs's fp32 output and zeroed
 * gradients; false on a CUDA failure (what was allocated stays in b for checks_free). */
bool checks_alloc(checks_bufs_t *b, tide_group_t ag, tide_group_t rs, int fill);
void checks_free(checks_bufs_t *b);

/* Rank r of a multi-process world, every rank calling at once: all-gather calls 0 and 1
 * agree; in call 2 rank `odd` passes slot 1 and every rank must be refused naming a slot.
 * 0, or the step that failed (10, 11). */
int checks_slot(tide_group_t ag, const checks_bufs_t *b, int r, int odd);
/* The same for reduce-scatter: call 0 agrees, in call 1 rank `odd` passes alpha 0.5 and every
 * rank must be refused naming alpha.  0, or the step that failed (20, 21). */
int checks_alpha(tide_group_t rs, const checks_bufs_t *b, int r, int odd);

/* Wait for the n forked ranks; print a line per rank (passed: "ok rank r: <passed>") and
 * return true when every rank exited 0 with no failed step. */
bool checks_wait(const pid_t *pids, int n, const checks_report_t *rep, const char *passed);

#endif /* TIDE_TESTS_GPU_CALL_CHECKS_H_ */
