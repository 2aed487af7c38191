/*
 * check_internal.h - the checker's shared state (check.c, check_exec.c, check_mem.c,
 * check_data.c).
 *
 * Memory objects.  Every buffer a program can touch is one object: each rank's arena regions,
 * each rank's landing slot (one object for all calls: the strictest binding, where every call
 * passes the same slot), and per call and rank the operands (shard, output, one gradient per
 * parameter; a call's operands are distinct objects from the next call's, since the caller
 * may pass other buffers).  An object keeps the access history of the race detector and,
 * while I1 is traced, one tag per element.
 *
 * Threads.  Thread t = rank * TIDE_Q_COUNT + queue; each has a vector clock of T entries.
 */
#ifndef TIDE_PROGRAM_CHECK_INTERNAL_H_
#define TIDE_PROGRAM_CHECK_INTERNAL_H_

#include "plan/plan.h"
#include "program/check.h"
#include "program/machine.h"

#include <stdbool.h>
#include <stdint.h>

enum { CHK_OBJ_ARENA, CHK_OBJ_LANDING, CHK_OBJ_SHARD, CHK_OBJ_OUT, CHK_OBJ_GRAD };

/* I1 tag of one element: where its value came from. */
enum { CHK_TAG_ZERO = 0, CHK_TAG_DATA = 1, CHK_TAG_UNDEF = 2 };
typedef struct {
    uint8_t state;
    uint16_t epoch; /* call that produced the source element */
    int16_t param;  /* RS: parameter; AG: 0 */
    uint32_t elem;  /* RS: element of G_p; AG: element of the packed shard */
    uint64_t ranks; /* contributing (RS) or owning (AG) ranks */
} chk_tag_t;

/* One access of the race detector's history. */
typedef struct {
    uint64_t lo, hi;
    uint32_t thread;
    uint32_t clock;
    uint8_t write;
    uint8_t user; /* the caller's access at an event (thread = the event's queue) */
    uint8_t kind; /* op kind */
    int32_t op;
    int32_t call;
} chk_access_t;

typedef struct {
    uint8_t kind; /* CHK_OBJ_* */
    int32_t rank;
    int32_t sub;  /* region (arena) or parameter (gradient) */
    int32_t call; /* operands; -1 otherwise */
    uint64_t bytes;
    uint32_t elem; /* element size for I1 */
    /* race history */
    chk_access_t *acc;
    int num_acc, cap_acc;
    /* I1 tags (lazily allocated) */
    chk_tag_t *tags;
} chk_object_t;

typedef struct {
    const tide_program_t *prog;
    const struct tide_plan *plan;
    int n, p, calls, threads, ctrs; /* ctrs: counters per rank */
    bool rs;                        /* reduce-scatter program */
    tide_check_report_t *rep;       /* first violation (race, bounds, I4, missing event) */
    bool found;
    tide_check_report_t i1; /* first I1 violation of the traced schedule */
    bool i1_found;
    bool trace;     /* this run traces I1 */
    bool per_trace; /* happens-before of each run as it happened */
    bool entry;     /* options.direct_operands: the caller's operand writes at call entry */
    bool i1_able;

    int num_objs;
    chk_object_t *objs;

    /* run state */
    tide_machine_t m; /* pc, call, counters (machine.h) */
    uint32_t *vc;     /* threads x threads */
    uint8_t *events;  /* ranks x calls x TIDE_EVENT_COUNT: recorded */
    uint64_t ops_run;
} chk_ctx_t;

/* ---- check.c: reports */
void chk_site(tide_check_site_t *s, int rank, int queue, int op, int kind, int call);
void chk_fail(chk_ctx_t *c, tide_check_invariant_t inv, const tide_check_site_t *site,
              const tide_check_site_t *other, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void chk_fail_i1(chk_ctx_t *c, const tide_check_site_t *site, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *chk_op_name(int kind);

/* ---- check_mem.c: objects, references, the race detector */
tide_result_t chk_objects_init(chk_ctx_t *c);
void chk_objects_reset(chk_ctx_t *c); /* clears histories and tags between schedules */
void chk_objects_free(chk_ctx_t *c);
int chk_obj_arena(const chk_ctx_t *c, int rank, int region);
int chk_obj_landing(const chk_ctx_t *c, int rank);
int chk_obj_shard(const chk_ctx_t *c, int rank, int call);
int chk_obj_out(const chk_ctx_t *c, int rank, int call);
int chk_obj_grad(const chk_ctx_t *c, int rank, int call, int param);
/* Object and byte offset a reference names for an op of `rank` in `call` (refs are
 * validated by the IR pass). */
void chk_resolve(const chk_ctx_t *c, const tide_ref_t *ref, bool bank_dep, int rank, int call,
                 int *obj_out, uint64_t *offset_out);
void chk_describe_obj(const chk_ctx_t *c, int obj, char *buf, size_t len);
/* Record every access of op `op` run by thread t (bounds, races, reads after events). */
tide_result_t chk_mem_op(chk_ctx_t *c, int t, const tide_op_t *op, const tide_check_site_t *s);
/* The output object a LAND of `rank` writes: its own, or the rank its table's `out` names. */
int chk_land_out(const chk_ctx_t *c, const tide_table_t *t, int rank, int call);
/* options.direct_operands: rank's caller writes its gradients and output of `call` as the
 * call begins (thread t: the rank's first queue, just joined). */
tide_result_t chk_mem_entry(chk_ctx_t *c, int t, int rank, int call);
/* The caller's accesses at an event of rank r's call e. */
tide_result_t chk_mem_event(chk_ctx_t *c, int t, int event, const tide_check_site_t *s);

/* ---- check_data.c: I1 */
tide_result_t chk_data_op(chk_ctx_t *c, const tide_op_t *op, const tide_check_site_t *s);
tide_result_t chk_data_event(chk_ctx_t *c, int event, const tide_check_site_t *s);

/* ---- check_exec.c: the abstract machine */
tide_result_t chk_run_alloc(chk_ctx_t *c);
void chk_run_free(chk_ctx_t *c);
/* One maximal run of all ranks over c->calls calls (trace `index`), then its happens-before
 * fixpoint and the checks. */
tide_result_t chk_run(chk_ctx_t *c, int index, uint64_t seed);

#endif /* TIDE_PROGRAM_CHECK_INTERNAL_H_ */
