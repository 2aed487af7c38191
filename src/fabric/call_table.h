/*
 * call_table.h - comparing the arguments of a collective call across ranks without waiting
 * (fabric.h, call_check), for fabrics where one thread may drive every rank: the
 * single-process CUDA fabric.  Plain C, no CUDA: the CPU build tests it
 * (tests/unit/test_call_table.c).
 *
 * Every rank posts its signature of check `seq` (group.c: the all-gather's slot; alpha,
 * accumulate and mode of the reduce-scatter; the group's place in a set) in any order; the
 * first poster's signature is the reference.  A rank whose signature differs, and every rank
 * that posts that check after it, is told the rank that disagrees; the check is then refused
 * for good, and any later post, of any check, answers TIDE_CALL_TABLE_REFUSED with both
 * sides, so that the ranks that posted the refused check before the disagreement (and were
 * told nothing was wrong yet) learn of it at their next call.  Nothing is enqueued for a
 * refused check on the single-process fabric: its call is enqueued by the last rank's
 * execute, and that rank, or one before it, was refused.
 *
 * Checks of several calls may be open at once (a thread per rank, one rank ahead; or a set
 * of groups, one check sequence for all of them); a check closes when every rank posted it.
 * The caller serialises the posts (the fabric's lock).
 */
#ifndef TIDE_FABRIC_CALL_TABLE_H_
#define TIDE_FABRIC_CALL_TABLE_H_

#include "program/program.h"
#include "tide.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t seq, sig;
    int first;  /* the rank that posted first: its signature is the reference */
    int posted; /* ranks that posted so far */
} tide_call_check_t;

typedef struct {
    int ranks;
    int count, cap;
    tide_call_check_t *open; /* checks some rank posted and some did not */
    bool refused;            /* a check was refused: every later post is answered so */
    uint64_t refused_seq;
    int rank_a, rank_b; /* the reference rank and the one that differed */
    uint64_t sig_a, sig_b;
} tide_call_table_t;

enum {
    TIDE_CALL_TABLE_AGREE = 0,   /* no rank that posted this check so far differs */
    TIDE_CALL_TABLE_DIFFERS = 1, /* *other_out (with *other_sig_out) differs from this rank */
    TIDE_CALL_TABLE_REFUSED = 2, /* an earlier check was refused: the table's rank_a / sig_a
                                  * and rank_b / sig_b say by whom */
};

void tide_call_table_init(tide_call_table_t *t, int ranks);
void tide_call_table_free(tide_call_table_t *t);

/* Post `rank`'s signature `sig` of check `seq`.  *verdict_out is one of the values above;
 * *other_out / *other_sig_out name the rank that differs (DIFFERS), else -1 / 0.
 * TIDE_ERR_NO_MEMORY when a new check cannot be opened. */
tide_result_t tide_call_table_post(tide_call_table_t *t, int rank, uint64_t seq, uint64_t sig,
                                   int *verdict_out, int *other_out, uint64_t *other_sig_out);

/* A signature in words ("slot 1"; "alpha 0.5 (bits 3f000000), accumulate 0, mode in-place"),
 * as group.c builds them. */
void tide_call_describe(tide_collective_t coll, uint64_t sig, char *buf, size_t size);

#endif /* TIDE_FABRIC_CALL_TABLE_H_ */
