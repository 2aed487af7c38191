/*
 * compile_rs.h - shared state of the TIDE-RS compiler (compile_rs.c emits the queues,
 * compile_rs_tables.c the Level-1 copies and the SUM / LAND segment tables).
 *
 * Read order.  Each rank performs D = n_part M Level-1 sums per call, one per destination:
 * the remote destinations J = pi (M - 1) + c - 1 (pass pi, contributor c in [1, M), target
 * node (n + c) mod M) and the own node of each pass.  Following Algorithm 1 (App. E) they run
 * in the order
 *     remote J < min(n_out, D_rem),  own pi = 0 .. n_part - 1,  remote J >= n_out,
 * so the first n_out sums fill the outbox bank, the own-node spares come next, and only the
 * sums that must reuse an outbox block wait for the network.  With a full outbox (In-Place)
 * this is "every remote destination, then the own node of each pass".
 */
#ifndef TIDE_PROGRAM_COMPILE_RS_H_
#define TIDE_PROGRAM_COMPILE_RS_H_

#include "program/program.h"

#include <stdint.h>

/* One Level-1 destination of the read order. */
typedef struct {
    int pass; /* pi */
    int c;    /* send-order contributor index in [1, M]; M is the own node */
    int send; /* J for a remote destination, -1 for the own node */
} rs_dest_t;

typedef struct {
    const struct tide_plan *plan;
    tide_program_t *prog;
    int m, l;             /* M, L */
    int n_part;           /* passes */
    int n_stg;            /* staging slots */
    int n_out;            /* outbox blocks per bank */
    int d_rem;            /* remote destinations per call, n_part (M - 1) */
    int d_all;            /* sums per call, D = n_part M */
    uint64_t e_sub;       /* sub-slice row capacity, elements */
    uint64_t block_bytes; /* fp32 block of L rows: 4 L E_sub */
    uint64_t slot_elems;  /* one staging slot: (L - 1) L E_sub gradient items */
    uint64_t grad_item;   /* b_grad */
    rs_dest_t *dests;     /* D entries in read order */
    int *send_pos;        /* D_rem entries: read position of remote J */
    /* Scratch segment arrays, reused for every table (add_table copies them). */
    tide_sum_seg_t *sum_segs;
    int sum_cap;
    tide_land_seg_t *land_segs;
    int land_cap;
} rs_ctx_t;

/* Read position of the own-node sum of pass `pass`. */
static inline int rs_own_pos(const rs_ctx_t *c, int pass) {
    return (c->n_out < c->d_rem ? c->n_out : c->d_rem) + pass;
}

/* Node that destination `d` of rank `rank` sums for: (n + c) mod M. */
static inline int rs_target_node(const rs_ctx_t *c, int rank, const rs_dest_t *d) {
    return (rank / c->l + d->c) % c->m;
}

/* Op with every field zero except the kind; no fused signal. */

/*
 * Level-1 pushes of destination `d` from `rank` into the staging slot `slot` of local owner
 * `owner` (a local rank index != rank's): one COPY2D per piece over the fully valid
 * destination ranks plus a COPY for a partially valid one; the last copy carries the fused
 * RS_STAGED signal on the owner, or a bare SIGNAL follows when nothing was copied.
 */
tide_result_t rs_emit_pushes(rs_ctx_t *c, int rank, const rs_dest_t *d, int owner, int slot);

/* SUM table of destination `d` on `rank` (the owner of its sub-slice), staged slot `slot`;
 * out is the outbox block J mod n_out or the spare of the pass (bank 0 offsets). */
tide_result_t rs_add_sum_table(rs_ctx_t *c, int rank, const rs_dest_t *d, int slot, int *index_out);

/* LAND table of pass `pass` reading inbox generation `gen` of the L local ranks. */
tide_result_t rs_add_land_table(rs_ctx_t *c, int rank, int pass, int gen, int *index_out);

/* M = 1: LAND table of pass `pass`, sub-slice `s`, reading rank s's spare (one input,
 * plus_zero for L > 1; compile_rs.c, emit_landing_m1). */
tide_result_t rs_add_land_table_m1(rs_ctx_t *c, int rank, int pass, int s, int *index_out);

#endif /* TIDE_PROGRAM_COMPILE_RS_H_ */
