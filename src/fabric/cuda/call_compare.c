/*
 * call_compare.c - the single-process CUDA fabric compares every call's arguments across
 * ranks (fabric.h, call_check) without waiting: one thread may drive every rank, so no rank
 * may wait for another's post.  The comparison is fabric/call_table.h's, one table per
 * collective of the registration (a set's parent for the groups of a shared arena).
 *
 * What each rank sees when rank k passes arguments that differ from the first poster's: rank
 * k and every rank that calls after it are refused at once (TIDE_ERR_INVALID_ARGUMENT naming
 * both values, from group.c); the ranks that called before it were told nothing was wrong
 * (their part was only recorded: the call is enqueued by the last rank's execute, which never
 * comes) and are refused, naming both values, at their next call of that collective.  Either
 * way nothing of the refused call runs on the device and the group is unusable (group.c).
 */
#include "core/checks.h"
#include "fabric/call_table.h"
#include "fabric/cuda/cuda.h"

#include <pthread.h>
#include <stdio.h>

tide_result_t tide_cuda_call_compare(struct tide_fabric_arena *arena, tide_collective_t coll,
                                     uint64_t seq, uint64_t sig, int *other_rank_out,
                                     uint64_t *other_sig_out) {
    tide_cuda_arena_t *a = (tide_cuda_arena_t *)arena;
    tide_cuda_group_t *g = a->group;
    tide_cuda_shared_t *sh = g->shared;
    const int r = arena->world->rank;
    tide_call_table_t *t = &g->checks[coll == TIDE_COLL_ALL_GATHER ? 0 : 1];
    int verdict = TIDE_CALL_TABLE_AGREE, other = -1;
    uint64_t other_sig = 0;
    pthread_mutex_lock(&sh->lock);
    if (t->ranks == 0) tide_call_table_init(t, sh->ranks); /* first check of the group */
    const tide_result_t res = tide_call_table_post(t, r, seq, sig, &verdict, &other, &other_sig);
    const tide_call_table_t seen = *t;
    pthread_mutex_unlock(&sh->lock);
    TIDE_CHECK(res);
    if (verdict == TIDE_CALL_TABLE_REFUSED) {
        char sa[128], sb[128];
        tide_call_describe(coll, seen.sig_a, sa, sizeof(sa));
        tide_call_describe(coll, seen.sig_b, sb, sizeof(sb));
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "cuda fabric: rank %d: the ranks disagree on %s call check %llu, which "
                        "was refused: rank %d passed %s, rank %d passed %s (every rank must pass "
                        "the same arguments to a collective; the group is unusable, deregister "
                        "it)",
                        r, coll == TIDE_COLL_ALL_GATHER ? "all-gather" : "reduce-scatter",
                        (unsigned long long)seen.refused_seq, seen.rank_a, sa, seen.rank_b, sb);
    }
    *other_rank_out = other;
    *other_sig_out = other_sig;
    return TIDE_SUCCESS;
}
