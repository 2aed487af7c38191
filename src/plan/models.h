/*
 * models.h - whole models as FSDP2 wraps them with torchtitan: one group per transformer
 * block (fully_shard per block) and the root group (fully_shard on the model) holding the
 * token embeddings, the final norm and the output projection.  Used by `tide-plan memory
 * --model`; not part of the public API.
 */
#ifndef TIDE_PLAN_MODELS_H_
#define TIDE_PLAN_MODELS_H_

#include "plan/presets.h"

typedef struct {
    const char *name; /* "llama-3.1-70b" */
    const char *description;
    int blocks; /* transformer blocks, one group each */
    int block_params;
    const tide_param_shape_t *block_shapes;
    int root_params;
    const tide_param_shape_t *root_shapes; /* embeddings, final norm, output */
} tide_model_t;

int tide_model_count(void);
const tide_model_t *tide_model_at(int i);
/* By name, case-insensitive; NULL when unknown. */
const tide_model_t *tide_model_find(const char *name);
/* All model names separated by ", " (static storage). */
const char *tide_model_names(void);
/* Parameters of the whole model. */
uint64_t tide_model_params(const tide_model_t *model);

#endif /* TIDE_PLAN_MODELS_H_ */
