/*
 * presets.h - named parameter groups of real models, and a parser for shape lists.
 *
 * A preset is one FSDP2 parameter group, i.e. one transformer block wrapped by fully_shard,
 * with every parameter sharded along dim 0 and listed in the module's parameter order (the
 * order FSDP2 packs and TIDE lands).  Shapes follow the models' public configurations.
 * Used by tide-plan, the benchmarks and the tests; not part of the public API.
 */
#ifndef TIDE_PLAN_PRESETS_H_
#define TIDE_PLAN_PRESETS_H_

#include "tide.h"

typedef struct {
    const char *name;                 /* e.g. "llama3-70b-layer" */
    const char *description;          /* one line: model and configuration */
    int num_params;                   /* P */
    const tide_param_shape_t *shapes; /* P entries, (D_p, K_p) */
    const char *const *param_names;   /* P entries, the module's parameter names */
} tide_preset_t;

/* Number of presets, and preset i (NULL when i is out of range). */
int tide_preset_count(void);
const tide_preset_t *tide_preset_at(int i);

/* The preset called name, or NULL (name may be NULL). */
const tide_preset_t *tide_preset_find(const char *name);

/* All preset names separated by ", " (static storage). */
const char *tide_preset_names(void);

/*
 * Parse a comma-separated shape list such as "8192x8192,1024x8192,8192".  Each item is
 * A[xBxC...] of decimal integers >= 1: dim0 = A and inner = B C ... (1 for a 1-D item).
 * Rejects empty items, signs, spaces, zeros and values or products beyond 64 bits with
 * TIDE_ERR_INVALID_ARGUMENT naming the item.  *shapes_out is malloc'ed (free() it).
 */
tide_result_t tide_shapes_parse(const char *list, tide_param_shape_t **shapes_out, int *num_out);

#endif /* TIDE_PLAN_PRESETS_H_ */
