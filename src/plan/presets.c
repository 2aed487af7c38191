/*
 * presets.c - parameter groups of the paper's evaluation models, and the shape-list parser.
 *
 * One group is one transformer block; each parameter is listed as (dim0, product of the other
 * dims) in the order nn.Module.named_parameters() yields it, which is the order FSDP2 uses.
 */
#include "plan/presets.h"

#include "core/checks.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---------------------------------------------------------------- Llama 3 70B decoder layer */

/* clang-format off */
/* hidden 8192, intermediate 28672, 64 heads, 8 KV heads, head_dim 128. */
static const tide_param_shape_t llama3_70b_shapes[] = {
    {8192, 8192},   {1024, 8192},  {1024, 8192}, {8192, 8192}, {28672, 8192},
    {28672, 8192},  {8192, 28672}, {8192, 1},    {8192, 1},
};
static const char *const llama3_70b_names[] = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "mlp.down_proj.weight",    "input_layernorm.weight",  "post_attention_layernorm.weight",
};

/* ---------------------------------------------------------------- Wan2.2 T2V-A14B block */

/* One expert's WanAttentionBlock: dim 5120, ffn_dim 13824, qk_norm, cross_attn_norm (norm3
 * is an affine LayerNorm; norm1 and norm2 have no parameters).  The block's own modulation
 * parameter (1, 6, dim) comes first, then the submodules in definition order. */
static const tide_param_shape_t wan22_shapes[] = {
    {1, 6 * 5120},                                           /* modulation */
    {5120, 5120}, {5120, 1}, {5120, 5120}, {5120, 1},        /* self_attn q, k */
    {5120, 5120}, {5120, 1}, {5120, 5120}, {5120, 1},        /* self_attn v, o */
    {5120, 1},    {5120, 1},                                 /* self_attn norm_q, norm_k */
    {5120, 1},    {5120, 1},                                 /* norm3 */
    {5120, 5120}, {5120, 1}, {5120, 5120}, {5120, 1},        /* cross_attn q, k */
    {5120, 5120}, {5120, 1}, {5120, 5120}, {5120, 1},        /* cross_attn v, o */
    {5120, 1},    {5120, 1},                                 /* cross_attn norm_q, norm_k */
    {13824, 5120}, {13824, 1}, {5120, 13824}, {5120, 1},     /* ffn.0, ffn.2 */
};
static const char *const wan22_names[] = {
    "modulation",
    "self_attn.q.weight",  "self_attn.q.bias",  "self_attn.k.weight",  "self_attn.k.bias",
    "self_attn.v.weight",  "self_attn.v.bias",  "self_attn.o.weight",  "self_attn.o.bias",
    "self_attn.norm_q.weight", "self_attn.norm_k.weight",
    "norm3.weight",        "norm3.bias",
    "cross_attn.q.weight", "cross_attn.q.bias", "cross_attn.k.weight", "cross_attn.k.bias",
    "cross_attn.v.weight", "cross_attn.v.bias", "cross_attn.o.weight", "cross_attn.o.bias",
    "cross_attn.norm_q.weight", "cross_attn.norm_k.weight",
    "ffn.0.weight",        "ffn.0.bias",        "ffn.2.weight",        "ffn.2.bias",
};

/* ---------------------------------------------------------------- Qwen3-30B-A3B MoE layer */

/* hidden 2048, 32 heads, 4 KV heads, head_dim 128 (q_proj is 4096 wide), 128 experts with
 * moe_intermediate 768, stored as TorchTitan's grouped experts (E, out, in). */
static const tide_param_shape_t qwen3_moe_shapes[] = {
    {4096, 2048}, {512, 2048}, {512, 2048},  {2048, 4096},       /* q, k, v, o */
    {128, 1},     {128, 1},                                      /* q_norm, k_norm */
    {2048, 1},    {2048, 1},                                     /* layer norms */
    {128, 2048},                                                 /* router gate */
    {128, 768 * 2048}, {128, 2048 * 768}, {128, 768 * 2048},     /* experts w1, w2, w3 */
};
static const char *const qwen3_moe_names[] = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight",  "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight",  "self_attn.k_norm.weight",
    "input_layernorm.weight",  "post_attention_layernorm.weight", "mlp.router.gate.weight",
    "mlp.experts.w1",          "mlp.experts.w2",           "mlp.experts.w3",
};

/* clang-format on */

#define PRESET(n, d, shapes, names)                                                                \
    { (n), (d), COUNT_OF(shapes), (shapes), (names) }

static const tide_preset_t presets[] = {
    PRESET("llama3-70b-layer", "Llama 3 70B decoder layer (hidden 8192, GQA 64/8, MLP 28672)",
           llama3_70b_shapes, llama3_70b_names),
    PRESET("wan2.2-block", "Wan2.2 T2V-A14B expert attention block (dim 5120, FFN 13824)",
           wan22_shapes, wan22_names),
    PRESET("qwen3-30b-a3b-layer",
           "Qwen3-30B-A3B MoE layer (hidden 2048, GQA 32/4, 128 grouped experts of 768)",
           qwen3_moe_shapes, qwen3_moe_names),
};

_Static_assert(COUNT_OF(llama3_70b_shapes) == COUNT_OF(llama3_70b_names), "llama3 names");
_Static_assert(COUNT_OF(wan22_shapes) == COUNT_OF(wan22_names), "wan2.2 names");
_Static_assert(COUNT_OF(qwen3_moe_shapes) == COUNT_OF(qwen3_moe_names), "qwen3 names");

int tide_preset_count(void) {
    return COUNT_OF(presets);
}

const tide_preset_t *tide_preset_at(int i) {
    return i >= 0 && i < COUNT_OF(presets) ? &presets[i] : NULL;
}

const tide_preset_t *tide_preset_find(const char *name) {
    if (name == NULL) return NULL;
    for (int i = 0; i < COUNT_OF(presets); ++i)
        if (strcmp(presets[i].name, name) == 0) return &presets[i];
    return NULL;
}

const char *tide_preset_names(void) {
    return "llama3-70b-layer, wan2.2-block, qwen3-30b-a3b-layer";
}

/* ---------------------------------------------------------------- shape-list parser */

/* Parse one decimal dimension at *pos (digits only, >= 1, fits 64 bits); advance *pos. */
static tide_result_t parse_dim(const char *list, const char **pos, int item, uint64_t *out) {
    const char *p = *pos;
    if (*p < '0' || *p > '9')
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "shapes: item %d: expected a dimension at offset %d of \"%s\"", item,
                        (int)(p - list), list);
    uint64_t v = 0;
    while (*p >= '0' && *p <= '9') {
        if (!tide_mul_u64(v, 10, &v) || !tide_add_u64(v, (uint64_t)(*p - '0'), &v))
            return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                            "shapes: item %d: dimension at offset %d exceeds 64 bits", item,
                            (int)(*pos - list));
        ++p;
    }
    if (v == 0)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "shapes: item %d: zero dimension at offset %d (every dim must be >= 1)",
                        item, (int)(*pos - list));
    *pos = p;
    *out = v;
    return TIDE_SUCCESS;
}

/* Parse A[xBxC...] at *pos up to ',' or the end. */
static tide_result_t parse_item(const char *list, const char **pos, int item,
                                tide_param_shape_t *out) {
    tide_param_shape_t s = {0, 1};
    TIDE_CHECK(parse_dim(list, pos, item, &s.dim0));
    while (**pos == 'x' || **pos == 'X') {
        ++*pos;
        uint64_t d;
        TIDE_CHECK(parse_dim(list, pos, item, &d));
        if (!tide_mul_u64(s.inner, d, &s.inner))
            return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                            "shapes: item %d: product of the trailing dims exceeds 64 bits", item);
    }
    if (**pos != ',' && **pos != '\0')
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "shapes: item %d: unexpected '%c' at offset %d of \"%s\" (use AxBxC,...)",
                        item, **pos, (int)(*pos - list), list);
    *out = s;
    return TIDE_SUCCESS;
}

tide_result_t tide_shapes_parse(const char *list, tide_param_shape_t **shapes_out, int *num_out) {
    TIDE_ARG_CHECK(list != NULL, "shapes: list is NULL");
    TIDE_ARG_CHECK(shapes_out != NULL && num_out != NULL, "shapes: output is NULL");
    size_t len = strlen(list);
    TIDE_ARG_CHECK(len > 0, "shapes: empty list");
    size_t items = 1;
    for (size_t i = 0; i < len; ++i)
        items += list[i] == ',';
    TIDE_ARG_CHECK(items <= (size_t)INT_MAX, "shapes: too many items");

    tide_param_shape_t *shapes = malloc(items * sizeof(*shapes));
    if (shapes == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "shapes: %zu items", items);
    const char *pos = list;
    for (size_t i = 0; i < items; ++i) {
        tide_result_t res = parse_item(list, &pos, (int)i + 1, &shapes[i]);
        if (res != TIDE_SUCCESS) {
            free(shapes);
            return res;
        }
        if (*pos == ',') ++pos;
    }
    *shapes_out = shapes;
    *num_out = (int)items;
    return TIDE_SUCCESS;
}
