/*
 * mp_export.h - which operands of a reduce-scatter call every rank can address on the
 * one-process-per-rank CUDA fabric (docs/cuda-fabric.md, "Direct mode across processes"):
 * the transport's peer_addressable, for direct mode (mp_direct.c).
 *
 * A pointer is addressable from every rank when it lies in this rank's mapped arena (every
 * peer maps it: Slot-Reuse gradients staged in the landing slot) or in a caller allocation
 * that this process exported once (cudaIpcGetMemHandle of the allocation's base) and every
 * peer opened (cudaIpcOpenMemHandle, once per allocation, cached).  Allocations made with the
 * VMM API (torch's expandable segments), managed or host memory, and memory of another device
 * cannot be exported this way: such a call takes the pushed path.
 */
#ifndef TIDE_FABRIC_CUDA_MP_EXPORT_H_
#define TIDE_FABRIC_CUDA_MP_EXPORT_H_

#include "fabric/cuda/mp.h"

/* A pointer as its owner describes it to the peers. */
typedef struct {
    uint32_t kind;   /* TIDE_MP_ADDR_* */
    uint32_t serial; /* IPC: the owner's export */
    uint64_t offset; /* ARENA: from the owner's segment; IPC: from the allocation's base */
} tide_mp_addr_t;

enum { TIDE_MP_ADDR_NONE = 0, TIDE_MP_ADDR_ARENA = 1, TIDE_MP_ADDR_IPC = 2 };

/* The RS family's exchange state.  After tide_cuda_mp_exchange: `sums` (every rank's
 * gradients addressable from every rank) and `outs` (their outputs too) are the same on every
 * rank, and when set, grads[r * P + p] / outs_at[r] are rank r's operands as addressed here. */
struct tide_mp_direct_call {
    bool sums, outs;
    int blocker;        /* not sums / outs: the lowest rank whose operand is not exportable, or
                         * -1 (a peer could not open one) */
    int logged;         /* the path last logged (TIDE_DEBUG=INFO), -1: none */
    const void **grads; /* [N][P] */
    float **outs_at;    /* [N] */
    int ranks, params;
    tide_mp_addr_t *mine, *sent; /* [P + 1]: this call's, the last exchanged */
    bool sent_valid;
    tide_mp_addr_t *theirs;      /* [N][P + 1]: the last exchanged of every rank */
    bool theirs_valid;
    uint8_t *tx;                 /* this rank's message: new handles, then addresses */
    size_t tx_len, tx_cap;
    uint8_t *rx;                 /* [N][rx_cap]: every rank's message */
    size_t *rx_len, rx_cap;
};

/* Collective over the bootstrap sockets, every rank at the same RS call: describe this
 * rank's gradients and output (b), exchange the descriptions (and the IPC handles the peers
 * have not seen), open what is new, and agree on the path.  A failed exchange (a peer died or
 * missed TIDE_TIMEOUT_MS) fails the group stop, as a missing rank of a call does. */
tide_result_t tide_cuda_mp_exchange(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                    const tide_binding_t *b);
void tide_cuda_mp_exchange_free(struct tide_mp_direct_call *c);

#endif /* TIDE_FABRIC_CUDA_MP_EXPORT_H_ */
