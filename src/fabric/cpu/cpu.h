/*
 * cpu.h - the CPU fabric's internal objects (host memory, POSIX shared memory).
 *
 * Ranks are threads of one process (tide_comm_init_all) or one process each
 * (tide_comm_init_rank).  Either way a group's arenas are one POSIX shared-memory object that
 * holds all N arenas back to back, so every rank reaches every arena with plain loads and
 * stores; the copy engine is memcpy and signals are lock-free C11 atomics on the 64-bit
 * counters of each arena's SIGNALS region, which work across processes because they are
 * address-free.
 *
 * Collective handshakes (communicator join, group registration, deregistration) are
 * cumulative barriers on a control block: heap memory shared by the threads, or a small shm
 * object named after the job shared by the processes.  Every wait carries the
 * TIDE_TIMEOUT_MS deadline.
 */
#ifndef TIDE_FABRIC_CPU_CPU_H_
#define TIDE_FABRIC_CPU_CPU_H_

#include "fabric/fabric.h"
#include "kernels/kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

/* Signals are plain uint64 counters in the arena; the CPU fabric accesses them atomically.
 * Lock-free atomics are address-free, which is what makes them process-shared. */
typedef _Atomic uint64_t tide_cpu_counter_t;
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2,
               "process-shared counters need lock-free 64-bit atomics");
_Static_assert(sizeof(tide_cpu_counter_t) == sizeof(uint64_t), "counter layout");

static inline tide_cpu_counter_t *tide_cpu_counter(uint64_t *ctr) {
    return (tide_cpu_counter_t *)ctr;
}

/* Longest shm object name we build ("/tide." + job + ".g" + 20 digits). */
#define TIDE_CPU_NAME_MAX 128
/* Header page in front of the arenas of a group's shm object. */
#define TIDE_CPU_HEADER_BYTES 4096u

/* ------------------------------------------------------------------ time */

uint64_t tide_cpu_now_ns(void);
/* Deadline TIDE_TIMEOUT_MS from now. */
uint64_t tide_cpu_deadline_ns(void);
/* Back off while nothing progresses: yield first, then sleep a little longer each time, so
 * that N rank threads on few cores do not starve the rank they wait for. */
void tide_cpu_backoff(unsigned *idle);

/* ------------------------------------------------------------------ shared memory */

/* Create a fresh object (a stale one of the same name is replaced) of `bytes`, zero-filled,
 * and map it. */
tide_result_t tide_cpu_shm_create(const char *name, size_t bytes, void **addr_out);
/* Open an object another rank creates; waits (until `deadline_ns`) for it to exist and reach
 * `bytes` (the creator sizes it after creating it). */
tide_result_t tide_cpu_shm_open(const char *name, size_t bytes, uint64_t deadline_ns,
                                void **addr_out);
void tide_cpu_shm_unlink(const char *name);

struct tide_cpu_direct_group;

/* A mapping shared by the rank handles of one process; the last reference unmaps it (and
 * frees `direct`). */
typedef struct {
    void *addr;
    size_t bytes;
    atomic_int refs;
    struct tide_cpu_direct_group *direct; /* threads world with direct mode: direct.c */
} tide_cpu_map_t;

tide_result_t tide_cpu_map_new(void *addr, size_t bytes, tide_cpu_map_t **map_out);
void tide_cpu_map_release(tide_cpu_map_t *map);

/* ------------------------------------------------------------------ worlds */

/* Shared by the ranks of a world (heap for threads, shm for processes).  Zero is the initial
 * state, so a freshly truncated shm object is ready without initialisation. */
typedef struct {
    tide_cpu_counter_t topo_key;   /* (M << 8 | L) + 1 once the first rank claimed it */
    tide_cpu_counter_t barrier;    /* cumulative barrier arrivals */
    tide_cpu_counter_t reg_failed; /* 1 + sequence of the last registration a rank failed */
    tide_cpu_counter_t joined[];   /* process mode: bitmap of the ranks that joined */
} tide_cpu_ctl_t;

/* Process-local state of a world, shared by the rank handles of this process. */
typedef struct {
    atomic_int refs;
    bool processes;              /* one process per rank */
    int direct;                  /* TIDE_CPU_DIRECT mask (direct.c); 0 with processes */
    char job[TIDE_CPU_NAME_MAX]; /* prefix of every shm name of the world */
    tide_cpu_ctl_t *ctl;
    size_t ctl_bytes;
    /* Threads mode: rank 0 hands each registration's mapping to the other ranks. */
    pthread_mutex_t lock;
    uint64_t pending_seq;
    tide_cpu_map_t *pending;
} tide_cpu_shared_t;

typedef struct {
    struct tide_fabric_world base;
    tide_cpu_shared_t *shared;
    /* The thread that last called into this rank (threads mode), as the address of a
     * thread-local marker: a timeout can then tell that ranks share one thread. */
    _Atomic uintptr_t caller;
    uint64_t barriers;      /* barriers this rank entered */
    uint64_t registrations; /* arena_create calls: numbers the shm objects */
    bool broken;            /* a handshake missed its deadline: barrier counts diverged */
} tide_cpu_world_t;

/* Collective barrier of the world with the TIDE_TIMEOUT_MS deadline; `what` names it. */
tide_result_t tide_cpu_barrier(tide_cpu_world_t *w, const char *what);

/* Record the calling thread as rank w's caller (threads mode). */
void tide_cpu_note_caller(tide_cpu_world_t *w);

/* The advice a timeout message ends with: names a rank driven from this same thread when
 * there is one (threads mode), else says that every rank needs its own thread or process. */
const char *tide_cpu_timeout_hint(const tide_cpu_world_t *w, char *buf, size_t size);

/* ------------------------------------------------------------------ arenas */

/* A doorbell (doorbell.c): a rank's is rung by every signal to one of its counters, a
 * group's call_bell by the last rank to post a call, while some thread sleeps on it. */
typedef struct {
    _Atomic uint32_t ring;
    _Atomic uint32_t sleepers;
} tide_cpu_doorbell_t;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "process-shared doorbells need lock-free atomics");

/* Group header at the start of the shm object (its own page). */
typedef struct {
    tide_cpu_counter_t signature; /* the group signature rank 0 registered */
    tide_cpu_counter_t bytes;     /* arena bytes per rank */
    tide_cpu_counter_t mismatches;
    /* The call check (calls.c): posts of every rank per collective, so call e is complete
     * when arrivals = N (e + 1); the rank that completes it rings call_bell, on which the
     * others sleep. */
    tide_cpu_counter_t arrivals[2];
    tide_cpu_doorbell_t call_bell;
} tide_cpu_header_t;

/* Ring d after the store that a sleeper may wait for (a signal's increment, a call's last post). */
void tide_cpu_doorbell_ring(tide_cpu_doorbell_t *d);

/* One thread's wait on a doorbell (doorbell.c).  A polling loop calls tide_cpu_waiter_idle
 * after a round without progress (it yields, then announces the waiter and returns so that
 * the caller polls once more, then sleeps until the doorbell rings or a short slice passes),
 * tide_cpu_waiter_busy after a round with progress, and tide_cpu_waiter_done when it leaves
 * the loop by any path. */
typedef struct {
    tide_cpu_doorbell_t *d;
    unsigned idle;
    bool armed;
    uint32_t seen;
} tide_cpu_waiter_t;
void tide_cpu_waiter_idle(tide_cpu_waiter_t *wt);
void tide_cpu_waiter_busy(tide_cpu_waiter_t *wt);
void tide_cpu_waiter_done(tide_cpu_waiter_t *wt);

/* One rank's call signatures (calls.c), in the group's shm object after the N arenas:
 * posted[coll] = 1 + the last call posted, sig[coll][epoch mod 2] its signature; and the
 * rank's doorbell. */
typedef struct {
    tide_cpu_counter_t posted[2];
    tide_cpu_counter_t sig[2][2];
    tide_cpu_doorbell_t doorbell;
    uint64_t pad_;
} tide_cpu_call_rec_t;
_Static_assert(sizeof(tide_cpu_call_rec_t) == 64, "one cache line per rank");

struct tide_cpu_direct_prog;

typedef struct {
    struct tide_fabric_arena base;
    tide_cpu_map_t *map;
    tide_cpu_call_rec_t *calls; /* N records */
    /* Direct mode (direct.c): this rank's analyses of the programs it ran, and its joins. */
    struct tide_cpu_direct_prog *direct_progs;
    uint64_t joins[2];          /* [collective]: end-of-call joins this rank entered */
    uint64_t elided_calls;      /* calls of this rank that ran the synchronisation elision */
} tide_cpu_arena_t;

tide_result_t tide_cpu_arena_create(struct tide_fabric_world *world, uint64_t bytes,
                                    uint64_t signature, struct tide_fabric_arena **arena_out);
tide_result_t tide_cpu_arena_destroy(struct tide_fabric_arena *arena);

/* The per-call comparison of the ranks' call signatures (calls.c, fabric.h). */
tide_result_t tide_cpu_call_check(struct tide_fabric_arena *arena, tide_collective_t coll,
                                  uint64_t epoch, uint64_t sig, int *other_rank_out,
                                  uint64_t *other_sig_out);

/* The arithmetic ops (arith.c): the bits of tide_ref_sum / tide_ref_land /
 * tide_ref_cast_bf16 (kernels/reference.c, the oracle), computed four lanes at a time. */
void tide_cpu_sum(const tide_sum_args_t *args);
void tide_cpu_land(const tide_land_args_t *args);
void tide_cpu_cast_bf16(const float *in, uint16_t *out, uint64_t n);

/* ------------------------------------------------------------------ direct mode (direct.c) */

/* TIDE_CPU_DIRECT: a mask of program/direct.h's bits (default all; 0: off), read when a
 * threads world is created.  A world of processes never takes direct mode: there a rank's
 * gradients and shard are private to its process. */
int tide_cpu_direct_env(void);

/* One registration's shared state (threads world): every rank's binding of its current call
 * of each collective, published before its first op, and the end-of-call join counters. */
struct tide_cpu_direct_plan;
typedef struct tide_cpu_direct_group {
    tide_cpu_counter_t joined[2];               /* [collective] arrivals, cumulative */
    pthread_mutex_t lock;                       /* plans */
    struct tide_cpu_direct_plan *plans;         /* one analysis per program, for all ranks */
    _Atomic(const tide_binding_t *) bound[];    /* [collective * N + rank] */
} tide_cpu_direct_group_t;

tide_result_t tide_cpu_direct_group_new(int ranks, tide_cpu_direct_group_t **out);
void tide_cpu_direct_group_free(tide_cpu_direct_group_t *g);

/* A rank's direct state for one program (NULL: the call runs the plain emulation). */
typedef struct tide_cpu_direct_prog tide_cpu_direct_prog_t;

/* Start of a call: the program's analysis (made at its first call on this rank) and the
 * publication of `b`; *dp_out is NULL when no shortcut applies. */
tide_result_t tide_cpu_direct_begin(tide_cpu_arena_t *a, const tide_program_t *prog,
                                    const tide_binding_t *b, tide_cpu_direct_prog_t **dp_out);
/* Whether op `index` of queue q is a copy or landing that direct mode leaves out. */
bool tide_cpu_direct_skips(const tide_cpu_direct_prog_t *dp, int rank, tide_queue_t q,
                           int index);
/* The synchronisation elision (program/sync_elide.h, TIDE_SYNC_ELIDE): whether op `index` of
 * queue q is a WAIT it leaves out, or an op it runs after the end-of-call join
 * (tide_cpu_direct_end).  The dropped signals still fire: the counters are cumulative, and a
 * later call of a program without the elision counts on them. */
bool tide_cpu_direct_drops(const tide_cpu_direct_prog_t *dp, int rank, tide_queue_t q, int index);
bool tide_cpu_direct_late(const tide_cpu_direct_prog_t *dp, int rank, tide_queue_t q, int index);
/* Rebind a data op for direct mode: a copy's source (all-gather readers of an elided put),
 * a SUM's peers and fused table, a landing's in_table. */
tide_result_t tide_cpu_direct_copy(tide_cpu_direct_prog_t *dp, const tide_binding_t *b,
                                   tide_queue_t q, int index, tide_bound_op_t *bo);
tide_result_t tide_cpu_direct_sum(tide_cpu_direct_prog_t *dp, const tide_binding_t *b,
                                  tide_queue_t q, int index, tide_sum_args_t *a);
tide_result_t tide_cpu_direct_land(tide_cpu_direct_prog_t *dp, const tide_binding_t *b,
                                   tide_queue_t q, int index, tide_land_args_t *a);
/* End of a call: wait until every rank of the world ended this call, so that no peer still
 * reads this rank's gradients or shard or writes its output when it returns.  One counter
 * wait with the TIDE_TIMEOUT_MS deadline.  A `failed` call only counts its arrival. */
tide_result_t tide_cpu_direct_end(tide_cpu_arena_t *a, tide_cpu_direct_prog_t *dp,
                                  const tide_binding_t *b, bool failed);
void tide_cpu_direct_free_all(tide_cpu_arena_t *a);

/* The data effect of op `index` of queue q of b's rank (opdata.c), whose tide_bind_op result
 * is `bo`: COPY, COPY2D, ZERO, CAST, SUM and LAND move their bytes; SIGNAL, WAIT and EVENT
 * do nothing (their waiting and signalling are the caller's, and so is the fused signal of a
 * copy).  `dp`: direct mode's context, whose rewrites of a copy's source and of the SUM and
 * LAND tables apply; NULL for the plain emulation.  An op kind without a data path fails. */
tide_result_t tide_cpu_op_data(tide_cpu_direct_prog_t *dp, const tide_binding_t *b,
                               const tide_program_t *prog, tide_queue_t q, int index,
                               const tide_bound_op_t *bo);

/* The interpreter (interp.c). */
tide_result_t tide_cpu_execute(struct tide_fabric_arena *arena, const tide_program_t *prog,
                               const tide_binding_t *binding, void *stream);

#endif /* TIDE_FABRIC_CPU_CPU_H_ */
