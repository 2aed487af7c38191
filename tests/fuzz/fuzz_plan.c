/*
 * fuzz_plan.c - libFuzzer target: arbitrary configs and groups through the public plan API.
 *
 * The input bytes choose a topology (mostly small, sometimes the limits), tuning fields (mostly
 * in range, sometimes anything), dtypes, and up to 300 shapes (mostly small, sometimes zero or
 * huge to reach the argument and overflow checks).  tide_plan_create must either fail with a
 * documented code or return a plan whose getters all succeed and agree with eq. (2); nothing
 * may crash, leak or hit UB.
 */
#include "tide.h"
#include "plan/presets.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *data;
    size_t size;
} reader_t;

static uint64_t take(reader_t *r, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
        v = v << 8 | (r->size ? *r->data : 0);
        if (r->size) {
            ++r->data;
            --r->size;
        }
    }
    return v;
}

/* A field that is usually valid (uniform in [lo, hi]; 0 is "planner's choice" for tuning), and
 * about one time in twenty anything at all, so that both the plan and the argument checks get
 * inputs. */
static int take_field(reader_t *r, int lo, int hi) {
    uint8_t sel = (uint8_t)take(r, 1);
    if (sel < 243) return lo + (int)(take(r, 1) % (uint64_t)(hi - lo + 1));
    return (int)(int32_t)take(r, 4);
}

static tide_dtype_t take_dtype(reader_t *r) {
    uint8_t sel = (uint8_t)take(r, 1);
    if (sel < 120) return TIDE_DTYPE_BF16;
    if (sel < 245) return TIDE_DTYPE_FP32;
    return (tide_dtype_t)(sel % 5); /* fp16 and out-of-enum values */
}

static uint64_t take_dim(reader_t *r) {
    uint8_t sel = (uint8_t)take(r, 1);
    if (sel < 200) return 1 + take(r, 1); /* small, mostly padded shards */
    if (sel < 250) return 1 + take(r, 2); /* up to 64 Ki */
    if (sel < 253) return 0;              /* rejected */
    return take(r, 8);                    /* anything: overflow paths */
}

static void check(int cond) {
    if (!cond) __builtin_trap();
}

static void exercise(tide_plan_t plan) {
    tide_plan_summary_t s;
    check(tide_plan_get_summary(plan, &s) == TIDE_SUCCESS);
    check(s.num_params >= 1 && s.ranks == s.nodes * s.gpus_per_node);
    uint64_t offset = 0;
    for (int p = 0; p < s.num_params; ++p) {
        tide_param_geometry_t g;
        check(tide_plan_get_param(plan, p, &g) == TIDE_SUCCESS);
        check(g.shard_offset == offset);
        offset += g.shard_bytes;
        uint64_t land;
        int ranks[] = {0, s.ranks / 2, s.ranks - 1};
        for (int i = 0; i < 3; ++i) {
            check(tide_plan_landing_offset(plan, p, ranks[i], &land) == TIDE_SUCCESS);
            check(land == g.shard_offset * (uint64_t)s.ranks + (uint64_t)ranks[i] * g.shard_bytes);
            check(land < s.group_bytes || g.shard_bytes == 0);
        }
        check(tide_plan_landing_offset(plan, p, s.ranks, &land) == TIDE_ERR_INVALID_ARGUMENT);
    }
    check(offset == s.shard_bytes);
    tide_param_geometry_t g;
    check(tide_plan_get_param(plan, s.num_params, &g) == TIDE_ERR_INVALID_ARGUMENT);
    uint64_t end = 0;
    for (int r = 0; r < TIDE_REGION_COUNT; ++r) {
        tide_region_info_t info;
        check(tide_plan_get_region(plan, (tide_region_t)r, &info) == TIDE_SUCCESS);
        check(info.offset >= end && info.offset % TIDE_ARENA_ALIGN == 0);
        end = info.offset + info.bytes;
    }
    check(end <= s.arena_bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader_t r = {data, size};
    tide_config_t c = TIDE_CONFIG_INIT;
    uint8_t topo = (uint8_t)take(&r, 1);
    /* Large topologies cost milliseconds each (O(M) waves and AG nodes), so they are rare and
     * the fuzzer spends its time on the many small shapes of the schedules. */
    if (topo < 240)
        c.nodes = 1 + (int)take(&r, 1) % 80;
    else if (topo < 252)
        c.nodes = 1 + (int)(take(&r, 2) % 2048);
    else if (topo < 254)
        c.nodes = 1 + (int)(take(&r, 2) % TIDE_MAX_NODES);
    else
        c.nodes = (int)(int32_t)take(&r, 4);
    c.gpus_per_node = take_field(&r, 1, TIDE_MAX_GPUS_PER_NODE);
    c.wave_width =
        take_field(&r, 0, c.gpus_per_node >= 1 && c.gpus_per_node <= 8 ? c.gpus_per_node : 8);
    c.round_width = take_field(&r, 0, TIDE_MAX_ROUND_WIDTH);
    c.passes = take_field(&r, 0, TIDE_MAX_PASSES);
    c.staging_slots = take_field(&r, 0, 4);
    c.mode = (tide_rs_mode_t)take_field(&r, 0, 1);
    c.sum_ctas = take_field(&r, 0, 16);
    c.landing_ctas = take_field(&r, 0, 16);
    c.multicast = take_field(&r, 0, 1);
    uint8_t header = (uint8_t)take(&r, 1);
    if (header == 255) c.magic ^= 1u;
    if (header == 254) c.size -= 8;
    if (header == 253) c.version += 10000;

    tide_group_desc_t g;
    memset(&g, 0, sizeof(g));
    g.ag_dtype = take_dtype(&r);
    g.grad_dtype = take_dtype(&r);
    g.shard_dtype = (take(&r, 1) & 1) ? TIDE_DTYPE_FP32 : g.ag_dtype;
    uint8_t many = (uint8_t)take(&r, 1);
    int n = many < 220 ? 1 + (int)(take(&r, 1) % 40) : (int)(take(&r, 2) % 301);
    tide_param_shape_t *shapes = n ? malloc((size_t)n * sizeof(*shapes)) : NULL;
    if (n && shapes == NULL) return 0;
    for (int i = 0; i < n; ++i) {
        shapes[i].dim0 = take_dim(&r);
        shapes[i].inner = take_dim(&r);
    }
    g.num_params = n;
    g.shapes = shapes;

    tide_plan_t plan = NULL;
    tide_result_t res = tide_plan_create(&c, &g, &plan);
    check(res >= TIDE_SUCCESS && res < TIDE_RESULT_COUNT);
    if (res == TIDE_SUCCESS) {
        exercise(plan);
        tide_plan_destroy(plan);
    } else {
        check(plan == NULL);
        check(tide_get_last_error()[0] != '\0');
    }
    free(shapes);

    /* The shape-list parser on the raw bytes, as a string. */
    if (size > 0 && size < 4096) {
        char *text = malloc(size + 1);
        if (text == NULL) return 0;
        memcpy(text, data, size);
        text[size] = '\0';
        tide_param_shape_t *parsed = NULL;
        int num = 0;
        if (tide_shapes_parse(text, &parsed, &num) == TIDE_SUCCESS) {
            check(num >= 1 && parsed != NULL);
            for (int i = 0; i < num; ++i)
                check(parsed[i].dim0 >= 1 && parsed[i].inner >= 1);
            free(parsed);
        }
        free(text);
    }
    return 0;
}
