/*
 * memory_model.c - `tide-plan memory --model NAME`: a whole model's per-GPU bytes with TIDE's
 * shared arena (docs/arena.md) beside stock FSDP2's, and the paper's §5.4 bounds.
 *
 * Both columns assume torchtitan's setup: one FSDP2 group per transformer block and a root
 * group (embeddings, final norm, output) that stays unsharded through the step (its
 * reshard_after_forward is False); MixedPrecisionPolicy(param bf16, reduce fp32); AdamW.
 * Model state (fp32 masters, fp32 sharded gradients, AdamW's two moments) is the same in both.
 * Stock FSDP2's transients are those of the largest block: the current and the prefetched
 * all-gather outputs (2 N S), autograd's unsharded bf16 gradients (N S) and the fp32
 * reduce-scatter pack buffer (B_pack = 2 N S), plus the root's unsharded parameters.
 * TIDE's are the arena (ring slots, the root's own slot, the shared RS / receive regions)
 * and, In-Place, autograd's gradients, which the reduce-scatter reads where they are.
 */
#include "plan/arena_plan.h"
#include "plan/models.h"
#include "tide-plan/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

typedef struct {
    const char *key; /* JSON name */
    const char *label;
    uint64_t stock, tide;
} row_t;

static void print_row(const row_t *r) {
    printf("  %-44s %10.3f %10.3f\n", r->label, (double)r->stock / GIB, (double)r->tide / GIB);
}

int cli_memory_model(const char *cmd, const char *name, int nodes, int gpus, tide_rs_mode_t mode,
                     bool with_root, bool json) {
    const tide_model_t *model = tide_model_find(name);
    if (model == NULL)
        return cli_usage_error(cmd, "unknown --model '%s' (one of: %s)", name, tide_model_names());
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = nodes;
    cfg.gpus_per_node = gpus;
    cfg.mode = mode;
    const tide_group_desc_t block = {model->block_params, model->block_shapes, TIDE_DTYPE_BF16,
                                     TIDE_DTYPE_BF16, TIDE_DTYPE_FP32};
    const tide_group_desc_t root = {model->root_params, model->root_shapes, TIDE_DTYPE_BF16,
                                    TIDE_DTYPE_BF16, TIDE_DTYPE_FP32};
    const int groups = model->blocks + (with_root ? 1 : 0);
    tide_group_entry_t *e = calloc((size_t)groups, sizeof(*e));
    if (e == NULL) {
        fprintf(stderr, "tide-plan %s: out of memory\n", cmd);
        return CLI_EXIT_ERROR;
    }
    /* Blocks alternate on the two-slot ring in execution order; the root keeps a slot of
     * its own, as its lifetime spans the whole step. */
    for (int b = 0; b < model->blocks; ++b)
        e[b] = (tide_group_entry_t){&cfg, &block, b % 2, NULL};
    if (with_root) e[model->blocks] = (tide_group_entry_t){&cfg, &root, TIDE_RING_OWN_SLOT, "root"};
    tide_arena_plan_t ap = NULL;
    tide_result_t res = tide_arena_plan_create(groups, e, &ap);
    free(e);
    if (res != TIDE_SUCCESS) return cli_lib_error(cmd, "tide_arena_plan_create", res);

    tide_arena_summary_t s;
    tide_arena_plan_get_summary(ap, &s);
    const struct tide_plan *bp = ap->groups[0].plan;
    uint64_t shard_elems = 0; /* padded sum R_p K_p over every group */
    for (int i = 0; i < groups; ++i)
        shard_elems += ap->groups[i].plan->geom.shard_elems;
    const uint64_t ns = bp->geom.group_bytes;
    const uint64_t ns_root = with_root ? ap->groups[model->blocks].plan->geom.group_bytes : 0;
    const uint64_t grads_inplace = mode == TIDE_RS_IN_PLACE ? ns : 0;
    const row_t rows[] = {
        {"fp32_masters", "fp32 master shards", 4 * shard_elems, 4 * shard_elems},
        {"fp32_grads", "fp32 gradient shards", 4 * shard_elems, 4 * shard_elems},
        {"adamw_states", "AdamW states (2 x fp32)", 8 * shard_elems, 8 * shard_elems},
        {"ag_outputs", "all-gather outputs, current + prefetch", 2 * ns, 0},
        {"autograd_grads", "autograd's bf16 gradients, one block", ns, grads_inplace},
        {"rs_pack", "reduce-scatter pack buffer (fp32)", bp->geom.pack_bytes, 0},
        {"root_unsharded", "root unsharded (kept through the step)", ns_root, 0},
        {"arena", "TIDE arena", 0, s.total_bytes},
    };
    const int num_rows = (int)(sizeof(rows) / sizeof(rows[0]));
    uint64_t stock = 0, tide = 0;
    for (int i = 0; i < num_rows; ++i) {
        stock += rows[i].stock;
        tide += rows[i].tide;
    }
    tide_memory_bounds_t b;
    res = tide_memory_bounds(nodes, gpus, bp->config.round_width, bp->rs.inbox_generations, &b);
    if (res != TIDE_SUCCESS) {
        tide_arena_plan_destroy(ap);
        return cli_lib_error(cmd, "tide_memory_bounds", res);
    }

    if (json) {
        cJSON *j = cli_json_object(NULL, NULL);
        cli_json_string(j, "model", model->name);
        cli_json_u64(j, "parameters", tide_model_params(model));
        cli_json_int(j, "groups", groups);
        cli_json_bool(j, "root", with_root);
        cli_json_int(j, "nodes", nodes);
        cli_json_int(j, "gpus_per_node", gpus);
        cli_json_string(j, "mode", cli_mode_name(mode));
        cJSON *st = cli_json_object(j, "stock");
        cJSON *td = cli_json_object(j, "tide");
        for (int i = 0; i < num_rows; ++i) {
            cli_json_u64(st, rows[i].key, rows[i].stock);
            cli_json_u64(td, rows[i].key, rows[i].tide);
        }
        cli_json_u64(st, "total", stock);
        cli_json_u64(td, "total", tide);
        cJSON *ar = cli_json_object(j, "arena");
        for (int k = 0; k < TIDE_REGION_COUNT; ++k)
            cli_json_u64(ar, tide_region_name((tide_region_t)k), s.region_bytes[k]);
        cli_json_u64(ar, "own_slots", s.own_slot_bytes);
        cli_json_u64(ar, "total", s.total_bytes);
        cli_json_u64(ar, "separate_arenas", s.separate_bytes);
        cJSON *bj = cli_json_object(j, "bounds_ns");
        cli_json_u64(bj, "unit_bytes", ns);
        cli_json_double(bj, "in_place_total", b.in_place_total_ns);
        cli_json_double(bj, "slot_reuse_total", b.slot_reuse_total_ns);
        cli_json_double(bj, "fsdp2_total", b.fsdp2_total_ns);
        tide_arena_plan_destroy(ap);
        return cli_json_print(cmd, j);
    }
    printf("%s, %.2f B parameters, %d groups%s; M = %d, L = %d (N = %d), %s\n", model->description,
           (double)tide_model_params(model) / 1e9, groups,
           with_root ? "" : " (--no-root: the blocks only, root excluded)", nodes, gpus,
           nodes * gpus, cli_mode_name(mode));
    printf("per GPU, GiB %38s %10s %10s\n", "", "stock", "TIDE");
    for (int i = 0; i < num_rows; ++i)
        print_row(&rows[i]);
    printf("  %-44s %10.3f %10.3f\n", "total", (double)stock / GIB, (double)tide / GIB);
    printf("TIDE arena by region, GiB (one per GPU, shared by the %d groups)\n", groups);
    for (int k = 0; k < TIDE_REGION_COUNT; ++k)
        printf("  %-44s %10.3f\n", tide_region_name((tide_region_t)k),
               (double)s.region_bytes[k] / GIB);
    if (with_root) printf("  %-44s %10.3f\n", "own slots (root)", (double)s.own_slot_bytes / GIB);
    printf("  %-44s %10.3f\n", "total", (double)s.total_bytes / GIB);
    printf("  %-44s %10.3f\n", "one arena per group instead", (double)s.separate_bytes / GIB);
    printf("paper §5.4 bounds, live bytes in backward, units of the block's N S = %.3f GiB\n",
           (double)ns / GIB);
    printf("  In-Place %.3f (%.3f GiB), Slot-Reuse %.3f (%.3f GiB), stock FSDP2 %.3f "
           "(%.3f GiB)\n",
           b.in_place_total_ns, b.in_place_total_ns * (double)ns / GIB, b.slot_reuse_total_ns,
           b.slot_reuse_total_ns * (double)ns / GIB, b.fsdp2_total_ns,
           b.fsdp2_total_ns * (double)ns / GIB);
    tide_arena_plan_destroy(ap);
    return CLI_EXIT_OK;
}
