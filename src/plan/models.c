/*
 * models.c - model presets for whole-model memory (models.h).  Shapes from the models' public
 * configurations, parameters in nn.Module.named_parameters() order, 2-D weights as
 * (out_features, in_features), norms as (dim, 1), grouped experts as (experts, rest).
 */
#include "plan/models.h"

#include <stddef.h>
#include <strings.h>

#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Llama 3.1 8B: dim 4096, 32 layers, GQA 32/8 (head 128), MLP 14336, vocab 128256. */
static const tide_param_shape_t llama8b_block[] = {
    {4096, 4096},  {1024, 4096},  {1024, 4096},  {4096, 4096}, /* wq, wk, wv, wo */
    {14336, 4096}, {4096, 14336}, {14336, 4096},               /* w1, w2, w3 */
    {4096, 1},     {4096, 1},                                  /* attention_norm, ffn_norm */
};
static const tide_param_shape_t llama8b_root[] = {{128256, 4096}, {4096, 1}, {128256, 4096}};

/* Llama 3.1 70B: dim 8192, 80 layers, GQA 64/8, MLP 28672, vocab 128256. */
static const tide_param_shape_t llama70b_block[] = {
    {8192, 8192},  {1024, 8192},  {1024, 8192}, {8192, 8192}, {28672, 8192},
    {8192, 28672}, {28672, 8192}, {8192, 1},    {8192, 1},
};
static const tide_param_shape_t llama70b_root[] = {{128256, 8192}, {8192, 1}, {128256, 8192}};

/* Qwen3-30B-A3B: hidden 2048, 48 layers, GQA 32/4 (head 128), 128 experts of 768, vocab
 * 151936, untied embeddings. */
static const tide_param_shape_t qwen3_block[] = {
    {4096, 2048},      {512, 2048},       {512, 2048},       {2048, 4096}, /* q, k, v, o */
    {128, 1},          {128, 1},                                           /* q_norm, k_norm */
    {2048, 1},         {2048, 1},                                          /* layer norms */
    {128, 2048},                                                           /* router gate */
    {128, 768 * 2048}, {128, 2048 * 768}, {128, 768 * 2048},               /* experts w1, w2, w3 */
};
static const tide_param_shape_t qwen3_root[] = {{151936, 2048}, {2048, 1}, {151936, 2048}};

#define MODEL(n, d, blocks, b, r)                                                                  \
    { (n), (d), (blocks), COUNT_OF(b), (b), COUNT_OF(r), (r) }

static const tide_model_t models[] = {
    MODEL("llama-3.1-8b", "Llama 3.1 8B: 32 blocks + root (torchtitan wrapping)", 32, llama8b_block,
          llama8b_root),
    MODEL("llama-3.1-70b", "Llama 3.1 70B: 80 blocks + root (torchtitan wrapping)", 80,
          llama70b_block, llama70b_root),
    MODEL("qwen3-30b-a3b", "Qwen3-30B-A3B: 48 MoE blocks + root (torchtitan wrapping, no EP)", 48,
          qwen3_block, qwen3_root),
};

int tide_model_count(void) {
    return COUNT_OF(models);
}

const tide_model_t *tide_model_at(int i) {
    return i >= 0 && i < COUNT_OF(models) ? &models[i] : NULL;
}

const tide_model_t *tide_model_find(const char *name) {
    if (name == NULL) return NULL;
    for (int i = 0; i < COUNT_OF(models); ++i)
        if (strcasecmp(models[i].name, name) == 0) return &models[i];
    return NULL;
}

const char *tide_model_names(void) {
    return "llama-3.1-8b, llama-3.1-70b, qwen3-30b-a3b";
}

static uint64_t count(const tide_param_shape_t *s, int n) {
    uint64_t total = 0;
    for (int i = 0; i < n; ++i)
        total += s[i].dim0 * s[i].inner;
    return total;
}

uint64_t tide_model_params(const tide_model_t *m) {
    return (uint64_t)m->blocks * count(m->block_shapes, m->block_params) +
           count(m->root_shapes, m->root_params);
}
