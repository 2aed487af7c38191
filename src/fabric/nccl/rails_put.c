/*
 * rails_put.c - the one-sided rail transport over NCCL >= 2.29 (rails.h):
 * ncclPutSignal / ncclSignal / ncclWaitSignal.
 *
 * EXPERIMENTAL, NEVER RUN (rails.h): compiled only against NCCL 2.29+ headers (the 2.28 build
 * contains none of it), never against a running library.
 *
 * NCCL's one-sided model (nccl.h and enqueue.cc of 2.29.2 .. 2.30.7): ncclPutSignal(src,
 * count, type, peer, peerWin, peerWinOffset, sigIdx = 0, ctx = 0, flags = 0, comm, stream)
 * writes into the peer's part of a window registered on comm and adds one to the signal the
 * peer keeps for this sender; the source must lie in a window of comm registered with
 * NCCL_WIN_COLL_SYMMETRIC.  ncclSignal adds one without data.  ncclWaitSignal(descs, comm,
 * stream) makes the stream wait until, per descriptor {opCnt, peer}, opCnt more signals than
 * the previous waits consumed have come from that peer (NCCL counts on the host per peer).
 * sigIdx and ctx must be 0, so a communicator has one signal count per peer pair.
 *
 * A put lands without its receiver taking part, while the rail steps need what send/recv
 * gives (docs/nccl-fabric.md, "Rails"): a send lands only after its receiver reached the
 * step, i.e. its queue reached it and the credits of its receives ran, which the rail stream
 * waited for before transfer.  So each step first rendezvouses on a second rail communicator
 * (the ready signals: its own count, which the data signals cannot be mistaken for):
 *
 *   1. ready    ncclSignal to every peer this rank receives puts from in the step
 *               (rail_ready_comm): "I reached step s, my buffers for you are free"
 *   2. wait     ncclWaitSignal, one ready from every peer it puts to in the step
 *   3. puts     ncclPutSignal per send, into the receiver's rail window at the destination's
 *               offset (one group)
 *   4. shard    sends whose source is the caller's shard or gradient operand (no window
 *               holds it: the AG's own-shard puts without the cast, the rail lane's RS
 *               pieces) and their receives: ncclSend / ncclRecv on rail_comm, one group (both
 *               sides tell them from the put's source kind, which every rank's schedule has)
 *   5. arrival  ncclWaitSignal for the step's puts from each peer (rail_comm)
 *
 * Empty puts (zero bytes, program/rails.h) take part in none of these, on either side.
 *
 * Counts match by construction: every rank derives the same steps (program/rails.h), sends
 * one ready per (step, sender it receives puts from) and puts in step order, and a sender's
 * puts of step s + 1 need this rank's ready of step s + 1, sent only after its step s ended:
 * when step 5 waits, exactly the puts of steps <= s have been issued to it.  Deadlock: 1 waits
 * for nothing, 2 for the peers' 1, 4 for the peers' 4 (reached after their 2), 5 for the
 * peers' 3; with the lockstep premise of the CPU test (a step's preconditions need only
 * earlier steps) every rank completes every step.
 *
 * Assumed, to be checked on real nodes: a put's stream completion means its source may be
 * overwritten, and a wait's completion makes the bytes visible to later work of the stream;
 * the same memory may be registered on the node and the rail communicator at once.
 */
#include "fabric/nccl/rails.h"

#include "core/checks.h"

#if TIDE_NCCL_HAVE_RMA

#include <stdlib.h>
#include <string.h>

/* A put from the caller's shard or gradient operand goes two-sided (no window holds its
 * source: the AG's own shard without the cast, the rail lane's RS pieces). */
static bool two_sided(const tide_rail_xfer_t *x) {
    return x->src.kind == TIDE_REF_SHARD || x->src.kind == TIDE_REF_GRAD;
}

/* An empty put (zero bytes, program/rails.h) is neither put nor sent, nor waited for, by
 * either side: it carries nothing, and its receiver raises its signal after the step's
 * credits anyway. */
static bool empty(const tide_rail_xfer_t *x) { return x->bytes == 0; }

/* Offset in this rank's segment of an address resolved on this rank. */
static tide_result_t seg_offset(const tide_mp_arena_t *a, const void *p, uint64_t bytes,
                                uint64_t *off_out) {
    const uint8_t *base = a->base.bases[a->w->base.rank], *x = p;
    if (base == NULL || x < base || (uint64_t)(x - base) > a->alloc_bytes ||
        bytes > a->alloc_bytes - (uint64_t)(x - base))
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "nccl rails: rank %d: %p (+%llu) outside its segment", a->w->base.rank,
                        p, (unsigned long long)bytes);
    *off_out = (uint64_t)(x - base);
    return TIDE_SUCCESS;
}

/* A put's source in the memory NCCL registered (the ncclMemAlloc pointer: the window looks
 * its sources up by that address, not by this rank's LSA mapping of it), and its
 * destination's offset in the receiver's segment (every segment has the same layout, so
 * this rank's own reference of the same region and offset gives it). */
static tide_result_t put_addrs(tide_mp_arena_t *a, const tide_mp_rails_call_t *c,
                               const tide_rail_xfer_t *x, const void **src_out,
                               uint64_t *dst_off_out) {
    const tide_nccl_arena_t *na = (const tide_nccl_arena_t *)a;
    const int me = a->w->base.rank;
    void *p = NULL;
    uint64_t off = 0;
    TIDE_CHECK(tide_cuda_mp_rails_resolve(a, c, me, &x->src, x->bank_dep != 0, x->bytes, &p));
    TIDE_CHECK(seg_offset(a, p, x->bytes, &off));
    const void *src = (const uint8_t *)na->mem + off;
    tide_ref_t mine = x->dst;
    mine.rank = me;
    TIDE_CHECK(tide_cuda_mp_rails_resolve(a, c, me, &mine, x->bank_dep != 0, x->bytes, &p));
    TIDE_CHECK(seg_offset(a, p, x->bytes, &off));
    *src_out = src;
    *dst_off_out = off;
    return TIDE_SUCCESS;
}

/* Descriptor list: one {opCnt, peer} per distinct rail peer, in first-seen order. */
static int add_peer(ncclWaitSignalDesc_t *d, int n, int peer) {
    for (int i = 0; i < n; ++i)
        if (d[i].peer == peer) {
            ++d[i].opCnt;
            return n;
        }
    memset(&d[n], 0, sizeof(d[n]));
    d[n].opCnt = 1;
    d[n].peer = peer; /* sigIdx = ctx = 0: the only ones NCCL accepts */
    return n + 1;
}

static tide_result_t nccl_failed(const tide_nccl_lib_t *lib, ncclResult_t r, const char *what) {
    return tide_nccl_error(lib, r, __FILE__, __LINE__, what);
}

/* Every address of the step resolved before any NCCL call of it: an error then leaves no
 * half-issued step behind. */
static tide_result_t resolve_step(tide_mp_arena_t *a, const tide_mp_rails_call_t *c,
                                  const tide_rails_rank_t *rr, const tide_rail_step_t *st) {
    const int me = a->w->base.rank;
    const void *src = NULL;
    uint64_t off = 0;
    void *p = NULL;
    for (int k = st->first_send; k < st->first_send + st->num_sends; ++k) {
        const tide_rail_xfer_t *x = &rr->sends[k];
        if (empty(x)) continue;
        if (two_sided(x))
            TIDE_CHECK(tide_cuda_mp_rails_resolve(a, c, me, &x->src, x->bank_dep != 0, x->bytes,
                                                  &p));
        else
            TIDE_CHECK(put_addrs(a, c, x, &src, &off));
    }
    for (int k = st->first_recv; k < st->first_recv + st->num_recvs; ++k)
        if (!empty(&rr->recvs[k]))
            TIDE_CHECK(tide_cuda_mp_rails_resolve(a, c, me, &rr->recvs[k].dst,
                                                  rr->recvs[k].bank_dep != 0, rr->recvs[k].bytes,
                                                  &p));
    return TIDE_SUCCESS;
}

static tide_result_t put_step(tide_mp_arena_t *a, const tide_rails_rank_t *rr,
                              const tide_rail_step_t *st, const tide_mp_rails_call_t *c,
                              cudaStream_t rail, ncclWaitSignalDesc_t *from,
                              ncclWaitSignalDesc_t *to) {
    const tide_nccl_world_t *w = (const tide_nccl_world_t *)a->w;
    const tide_nccl_arena_t *na = (const tide_nccl_arena_t *)a;
    const tide_nccl_lib_t *lib = w->lib;
    const int me = w->mp.base.rank, l = w->mp.base.gpus_per_node;
    int n_from = 0, n_to = 0, n_two = 0;
    for (int k = st->first_recv; k < st->first_recv + st->num_recvs; ++k)
        if (empty(&rr->recvs[k]))
            continue;
        else if (two_sided(&rr->recvs[k]))
            ++n_two;
        else
            n_from = add_peer(from, n_from, rr->recvs[k].src_rank / l);
    for (int k = st->first_send; k < st->first_send + st->num_sends; ++k)
        if (empty(&rr->sends[k]))
            continue;
        else if (two_sided(&rr->sends[k]))
            ++n_two;
        else
            n_to = add_peer(to, n_to, rr->sends[k].dst_rank / l);
    /* 1. ready: one signal per sender of this step's puts. */
    for (int i = 0; i < n_from; ++i) {
        const ncclResult_t r = lib->Signal(from[i].peer, 0, 0, 0, w->rail_ready_comm, rail);
        if (r != ncclSuccess) return nccl_failed(lib, r, "ncclSignal(rail ready)");
    }
    /* 2. every receiver of this rank's puts is ready. */
    if (n_to > 0) {
        for (int i = 0; i < n_to; ++i)
            to[i].opCnt = 1;
        const ncclResult_t r = lib->WaitSignal(n_to, to, w->rail_ready_comm, rail);
        if (r != ncclSuccess) return nccl_failed(lib, r, "ncclWaitSignal(rail ready)");
    }
    /* 3. the puts, one group; closed on every path. */
    ncclResult_t first = ncclSuccess;
    if (n_to > 0) {
        TIDE_NCCL_CALL(lib, lib->GroupStart(), "ncclGroupStart(rail puts)");
        for (int k = st->first_send; k < st->first_send + st->num_sends && first == ncclSuccess;
             ++k) {
            const tide_rail_xfer_t *x = &rr->sends[k];
            if (two_sided(x) || empty(x)) continue;
            const void *src = NULL;
            uint64_t off = 0;
            (void)put_addrs(a, c, x, &src, &off); /* resolved once already: cannot fail */
            first = lib->PutSignal(src, (size_t)x->bytes, ncclUint8, x->dst_rank / l,
                                   na->rail_win, (size_t)off, 0, 0, 0, w->rail_comm, rail);
        }
        const ncclResult_t end = lib->GroupEnd();
        if (first != ncclSuccess) return nccl_failed(lib, first, "ncclPutSignal(rail put)");
        if (end != ncclSuccess) return nccl_failed(lib, end, "ncclGroupEnd(rail puts)");
    }
    /* 4. the shard's puts, two-sided, one group; closed on every path. */
    if (n_two > 0) {
        const char *what = NULL;
        TIDE_NCCL_CALL(lib, lib->GroupStart(), "ncclGroupStart(rail shard sends)");
        for (int k = st->first_send; k < st->first_send + st->num_sends && first == ncclSuccess;
             ++k) {
            const tide_rail_xfer_t *x = &rr->sends[k];
            if (!two_sided(x) || empty(x)) continue;
            void *src = NULL;
            (void)tide_cuda_mp_rails_resolve(a, c, me, &x->src, x->bank_dep != 0, x->bytes, &src);
            first = lib->Send(src, (size_t)x->bytes, ncclUint8, x->dst_rank / l, w->rail_comm,
                              rail);
            what = "ncclSend(rail shard put)";
        }
        for (int k = st->first_recv; k < st->first_recv + st->num_recvs && first == ncclSuccess;
             ++k) {
            const tide_rail_xfer_t *x = &rr->recvs[k];
            if (!two_sided(x) || empty(x)) continue;
            void *dst = NULL;
            (void)tide_cuda_mp_rails_resolve(a, c, me, &x->dst, x->bank_dep != 0, x->bytes, &dst);
            first = lib->Recv(dst, (size_t)x->bytes, ncclUint8, x->src_rank / l, w->rail_comm,
                              rail);
            what = "ncclRecv(rail shard put)";
        }
        const ncclResult_t end = lib->GroupEnd();
        if (first != ncclSuccess) return nccl_failed(lib, first, what);
        if (end != ncclSuccess) return nccl_failed(lib, end, "ncclGroupEnd(rail shard sends)");
    }
    /* 5. this step's puts to this rank have landed. */
    if (n_from > 0) {
        const ncclResult_t r = lib->WaitSignal(n_from, from, w->rail_comm, rail);
        if (r != ncclSuccess) return nccl_failed(lib, r, "ncclWaitSignal(rail arrivals)");
    }
    return TIDE_SUCCESS;
}

static tide_result_t transfer_put(tide_mp_arena_t *a, const tide_mp_rails_prog_t *rp,
                                  const tide_mp_rails_call_t *c, int step, cudaStream_t rail) {
    const tide_nccl_world_t *w = (const tide_nccl_world_t *)a->w;
    const tide_nccl_arena_t *na = (const tide_nccl_arena_t *)a;
    const int me = w->mp.base.rank;
    if (w->rail_comm == NULL || w->rail_ready_comm == NULL || !na->rail_registered ||
        !w->lib->has_rma || step < 0 || step >= rp->sched.num_steps)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "nccl rails: rank %d: one-sided step %d of %d without its communicators, "
                        "rail window or symbols",
                        me, step, rp->sched.num_steps);
    const tide_rails_rank_t *rr = &rp->sched.ranks[me];
    const tide_rail_step_t *st = &rr->steps[step];
    TIDE_CHECK(resolve_step(a, c, rr, st));
    const int n = st->num_sends + st->num_recvs;
    if (n == 0) return TIDE_SUCCESS;
    ncclWaitSignalDesc_t *d = calloc((size_t)n * 2, sizeof(*d));
    if (d == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "nccl rails: %d transfers", n);
    const tide_result_t res = put_step(a, rr, st, c, rail, d, d + n);
    free(d);
    return res;
}

const tide_mp_rails_ops_t tide_nccl_rails_put_ops = {
    .name = "nccl put/signal",
    .transfer = transfer_put,
};

#else
/* The 2.28 build: the one-sided transport does not exist (rails.h). */
typedef int tide_nccl_rails_put_absent;
#endif
