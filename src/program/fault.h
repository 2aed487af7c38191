/*
 * fault.h - fault injection: deterministic mutations of a compiled program, each modelling
 * one protocol bug of the paper's fault-injection suite (App. E, §6.3).  docs/faults.md lists
 * every kind, what it models and what catches it: the static checker (check.h), a data
 * mismatch against the unmutated run, or the fabrics' deadline (fail-stop with the rank,
 * queue and op).
 *
 * A kind has a list of eligible sites (ops it can mutate), enumerated rank-major, then queue,
 * then op index; injection picks site `seed mod count` and mutates a deep copy, so the same
 * (program, kind, seed) always gives the same faulty program.
 */
#ifndef TIDE_PROGRAM_FAULT_H_
#define TIDE_PROGRAM_FAULT_H_

#include "program/program.h"

#include <stdint.h>

typedef enum {
    TIDE_FAULT_DROP_CREDIT = 0,           /* a SIGNAL to AG_CREDIT / RS_CREDIT / RS_STG_CREDIT
                                             removed */
    TIDE_FAULT_DROP_COMPLETION_FENCE = 1, /* DONE's AG_LANDED wait / NET's RS_NODE_ARRIVED
                                             wait removed */
    TIDE_FAULT_DROP_READ_COMPLETION = 2,  /* READ's RS_PUSHED wait removed, or read-done
                                             recorded before the last sum */
    TIDE_FAULT_EARLY_OUTBOX_REUSE = 3,    /* an RS_SENT wait threshold lowered by n_out */
    TIDE_FAULT_EARLY_INBOX_REUSE = 4,     /* an RS_CREDIT / RS_NODE_LANDED threshold lowered
                                             by one use */
    TIDE_FAULT_SKIP_STALE_ZERO = 5,       /* a ZERO removed */
    TIDE_FAULT_SHIFT_LATIN_SLOT = 6,      /* a PUT into the inbox goes to block s + 1 mod L */
    TIDE_FAULT_MISSING_SIGNAL = 7,        /* a (fused) signal to RS_STAGED / AG_ARRIVED
                                             removed */
    TIDE_FAULT_DUPLICATE_SIGNAL = 8,      /* a SIGNAL issued twice */
    TIDE_FAULT_TRUNCATE_COPY = 9,         /* a COPY moves half its bytes */
    TIDE_FAULT_WRONG_PITCH = 10,          /* a COPY2D's destination pitch one element longer */
    TIDE_FAULT_REORDER_WAIT = 11,         /* a WAIT moved after the op that follows it */
    TIDE_FAULT_KIND_COUNT = 12
} tide_fault_kind_t;

/* "drop-credit", ... ("?" for an unknown kind). */
const char *tide_fault_name(tide_fault_kind_t kind);

/* Where a fault was injected (in the unmutated program's numbering). */
typedef struct {
    int index; /* site index among the kind's eligible sites */
    int rank;
    int queue; /* tide_queue_t */
    int op;
    char what[160]; /* the mutation, in words */
} tide_fault_site_t;

/* Number of ops `kind` can mutate in prog (0: the kind does not apply). */
tide_result_t tide_fault_count_sites(const tide_program_t *prog, tide_fault_kind_t kind,
                                     int *count_out);

/*
 * Deep-copy prog into *faulty_out and mutate eligible site `seed mod count`.  Returns
 * TIDE_ERR_UNSUPPORTED when the kind has no eligible site in prog.  *faulty_out (free with
 * tide_program_free) and *site_out (may be NULL) are written only on success.
 */
tide_result_t tide_fault_inject(const tide_program_t *prog, tide_fault_kind_t kind, uint64_t seed,
                                tide_program_t *faulty_out, tide_fault_site_t *site_out);

#endif /* TIDE_PROGRAM_FAULT_H_ */
