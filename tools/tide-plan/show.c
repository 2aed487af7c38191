/*
 * show.c - `tide-plan show`: build the plan of one group on one topology and print all of it:
 * geometry, TIDE-AG rounds, TIDE-RS waves and rounds, the arena, and memory against stock
 * FSDP2.  The plan object is read through plan.h, so what is printed is what the program
 * compiler would consume.
 */
#include "tide-plan/cli.h"

#include "plan/plan.h"
#include "plan/presets.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMD "show"

typedef struct {
    cli_group_opts_t group;
    bool json;
} show_args_t;

/* Everything printed, gathered once so that the text and JSON printers share it. */
typedef struct {
    const show_args_t *args;
    const tide_preset_t *preset; /* NULL with --shapes */
    tide_plan_t plan;
    tide_plan_summary_t sum;
    tide_memory_bounds_t bounds;
    uint64_t fsdp2_ag_bytes;    /* AG output + unsharded copy-out: 2 N S */
    uint64_t fsdp2_total_bytes; /* 2 N S + B_pack */
} show_ctx_t;

enum { OPT_MULTICAST = CLI_OPT_OWN };

static const struct option long_options[] = {
    CLI_GROUP_LONG_OPTIONS,
    {"multicast", no_argument, NULL, OPT_MULTICAST},
    {NULL, 0, NULL, 0},
};

/* --multicast, the one option of show's own. */
static int own_option(const char *cmd, int c, const char *arg, void *ctx) {
    (void)cmd, (void)c, (void)arg;
    ((show_args_t *)ctx)->group.multicast = 1;
    return -1;
}

/* Returns -1 to go on, or an exit code. */
static int parse_args(int argc, char **argv, show_args_t *a) {
    int rc = cli_group_parse(CMD, argc, argv, long_options, &a->group, &a->json, own_option, a);
    return rc >= 0 ? rc : cli_group_opts_require(CMD, &a->group, NULL);
}

/* ------------------------------------------------------------------ text */

static void print_text(const show_ctx_t *x) {
    const struct tide_plan *p = x->plan;
    const tide_plan_summary_t *s = &x->sum;
    const tide_config_t *c = &p->config;
    printf("TIDE plan: M = %d nodes x L = %d GPUs = N = %d ranks, P = %d parameters", s->nodes,
           s->gpus_per_node, s->ranks, s->num_params);
    if (x->preset != NULL) printf(" (preset %s)", x->preset->name);
    printf("\n  dtypes: all-gather %s, gradients %s, shards %s; RS mode %s\n",
           cli_dtype_name(x->args->group.dtype), cli_dtype_name(x->args->group.dtype),
           cli_dtype_name(x->args->group.dtype), cli_mode_name(c->mode));
    printf("  tuning: W_wave %d, k %d, n_part %d, n_stg %d, sum CTAs %d, landing CTAs %d, "
           "multicast %s, lane %s\n\n",
           c->wave_width, c->round_width, c->passes, c->staging_slots, c->sum_ctas, c->landing_ctas,
           c->multicast ? "on" : "off", cli_lane_name(c->lane));

    printf("geometry (bytes; o_p and fp32_offset per rank)\n");
    printf("  %4s  %-32s %10s %12s %8s %14s %14s %14s\n", "p", "name", "D_p", "K_p", "R_p", "s_p",
           "o_p", "fp32_offset");
    for (int i = 0; i < s->num_params; ++i) {
        tide_param_geometry_t g;
        tide_plan_get_param(x->plan, i, &g);
        printf("  %4d  %-32s %10" PRIu64 " %12" PRIu64 " %8" PRIu64 " %14" PRIu64 " %14" PRIu64
               " %14" PRIu64 "\n",
               i, x->preset ? x->preset->param_names[i] : "-", g.dim0, g.inner, g.rows_per_rank,
               g.shard_bytes, g.shard_offset, g.fp32_offset);
    }
    printf("  S = %" PRIu64 ", N S = %" PRIu64 ", S_grad = %" PRIu64 ", S_fp32 = %" PRIu64
           ", B_pack = %" PRIu64 "\n\n",
           s->shard_bytes, s->group_bytes, s->grad_shard_bytes, s->fp32_shard_bytes,
           s->fsdp2_pack_bytes);

    printf("TIDE-AG: R = %d rounds, %" PRIu64 " stage slots, at most %" PRIu64
           " copy descriptors per rank per call\n",
           p->ag.num_rounds, p->ag.stage_slots, s->ag_descriptors_max);
    printf("  %5s %9s %6s %11s\n", "round", "distance", "count", "first_slot");
    for (int d = 0; d < p->ag.num_rounds; ++d)
        printf("  %5d %9d %6d %11d\n", d, p->ag.rounds[d].distance, p->ag.rounds[d].count,
               p->ag.rounds[d].first_slot);

    const tide_rs_schedule_t *rs = &p->rs;
    printf("\nTIDE-RS: W_wave %d, W = %d waves per pass, n_par = %d inbox generations, k = %d, "
           "n_part = %d, %d rounds per call, n_out = %d, E_sub = %" PRIu64 " elements\n",
           rs->wave_width, rs->waves_per_pass, rs->inbox_generations, rs->round_width, rs->passes,
           rs->num_rounds, rs->outbox_depth, rs->subslice_elems);
    printf("  Level-1 copy descriptors per rank per call: %" PRIu64 " flat, %" PRIu64
           " coalesced\n",
           rs->descriptors_flat, rs->descriptors_coalesced);
    printf("  %5s %5s %6s %6s %4s %4s %12s %11s  %s\n", "wave", "pass", "first", "count", "gen",
           "own", "first_round", "num_rounds", "zero_mask[s]");
    for (int w = 0; w < rs->num_waves; ++w) {
        const tide_rs_wave_t *v = &rs->waves[w];
        printf("  %5d %5d %6d %6d %4d %4s %12d %11d  ", w, v->pass, v->first, v->count,
               v->generation, v->has_own ? "yes" : "no", v->first_round, v->num_rounds);
        for (int j = 0; j < rs->gpus_per_node; ++j)
            printf("%s%02x", j ? "," : "", v->zero_mask ? v->zero_mask[j] : 0);
        printf("\n");
    }
    printf("  %5s %5s %6s %6s\n", "round", "wave", "first", "count");
    for (int r = 0; r < rs->num_rounds; ++r)
        printf("  %5d %5d %6d %6d\n", r, rs->rounds[r].wave, rs->rounds[r].first,
               rs->rounds[r].count);

    printf("\narena (bytes per rank)\n  %-12s %16s %16s\n", "region", "offset", "bytes");
    for (int r = 0; r < TIDE_REGION_COUNT; ++r) {
        tide_region_info_t info;
        tide_plan_get_region(x->plan, (tide_region_t)r, &info);
        printf("  %-12s %16" PRIu64 " %16" PRIu64 "\n", tide_region_name((tide_region_t)r),
               info.offset, info.bytes);
    }
    printf("  %-12s %16s %16" PRIu64 "\n\n", "total", "", s->arena_bytes);

    double ns = (double)s->group_bytes;
    printf("memory vs stock FSDP2 (bytes per rank)\n");
    printf("  TIDE arena                                  %16" PRIu64 "  (%.3f N S)\n",
           s->arena_bytes, (double)s->arena_bytes / ns);
    printf("  FSDP2 all-gather output + unsharded (2 N S) %16" PRIu64 "\n", x->fsdp2_ag_bytes);
    printf("  FSDP2 reduce-scatter pack buffer (B_pack)   %16" PRIu64 "\n", s->fsdp2_pack_bytes);
    printf("  FSDP2 total                                 %16" PRIu64 "  (%.3f N S)\n",
           x->fsdp2_total_bytes, (double)x->fsdp2_total_bytes / ns);
    printf("  TIDE / FSDP2                                %16.3f\n",
           (double)s->arena_bytes / (double)x->fsdp2_total_bytes);
    printf("  closed-form bounds (§5.4: bf16, n_stg = 2, k = %d, n_par = %d), units of N S:\n",
           rs->round_width, rs->inbox_generations);
    printf("    RS staging: in-place %.3f, slot-reuse %.3f\n", x->bounds.in_place_staging_ns,
           x->bounds.slot_reuse_staging_ns);
    printf("    live during backward: in-place %.3f, slot-reuse %.3f, stock FSDP2 %.3f\n",
           x->bounds.in_place_total_ns, x->bounds.slot_reuse_total_ns, x->bounds.fsdp2_total_ns);
    if (x->plan->rs.rail_lane)
        printf("    this plan runs the rail lane (L = 1): RS inbox %.3f; live during backward: "
               "in-place %.3f, slot-reuse %.3f\n",
               x->bounds.rail_lane_staging_ns, x->bounds.rail_lane_in_place_total_ns,
               x->bounds.rail_lane_slot_reuse_total_ns);
}

/* ------------------------------------------------------------------ JSON */

static void json_params(const show_ctx_t *x, cJSON *root) {
    cJSON *arr = cli_json_array(root, "params");
    for (int i = 0; i < x->sum.num_params; ++i) {
        tide_param_geometry_t g;
        tide_plan_get_param(x->plan, i, &g);
        cJSON *o = cli_json_array_object(arr);
        cli_json_int(o, "index", i);
        cli_json_string(o, "name", x->preset ? x->preset->param_names[i] : NULL);
        cli_json_u64(o, "dim0", g.dim0);
        cli_json_u64(o, "inner", g.inner);
        cli_json_u64(o, "rows_per_rank", g.rows_per_rank);
        cli_json_u64(o, "shard_bytes", g.shard_bytes);
        cli_json_u64(o, "shard_offset", g.shard_offset);
        cli_json_u64(o, "fp32_offset", g.fp32_offset);
    }
}

static void json_ag(const show_ctx_t *x, cJSON *root) {
    const tide_ag_schedule_t *ag = &x->plan->ag;
    cJSON *o = cli_json_object(root, "ag");
    cli_json_int(o, "num_rounds", ag->num_rounds);
    cli_json_u64(o, "stage_slots", ag->stage_slots);
    cli_json_u64(o, "descriptors_max", x->sum.ag_descriptors_max);
    cJSON *arr = cli_json_array(o, "rounds");
    for (int d = 0; d < ag->num_rounds; ++d) {
        cJSON *r = cli_json_array_object(arr);
        cli_json_int(r, "round", d);
        cli_json_int(r, "distance", ag->rounds[d].distance);
        cli_json_int(r, "count", ag->rounds[d].count);
        cli_json_int(r, "first_slot", ag->rounds[d].first_slot);
    }
}

static void json_rs(const show_ctx_t *x, cJSON *root) {
    const tide_rs_schedule_t *rs = &x->plan->rs;
    cJSON *o = cli_json_object(root, "rs");
    cli_json_string(o, "mode", cli_mode_name(rs->mode));
    cli_json_int(o, "wave_width", rs->wave_width);
    cli_json_int(o, "waves_per_pass", rs->waves_per_pass);
    cli_json_int(o, "num_waves", rs->num_waves);
    cli_json_int(o, "inbox_generations", rs->inbox_generations);
    cli_json_int(o, "round_width", rs->round_width);
    cli_json_int(o, "passes", rs->passes);
    cli_json_int(o, "staging_slots", rs->staging_slots);
    cli_json_int(o, "num_rounds", rs->num_rounds);
    cli_json_int(o, "outbox_depth", rs->outbox_depth);
    cli_json_u64(o, "subslice_elems", rs->subslice_elems);
    cli_json_u64(o, "descriptors_flat", rs->descriptors_flat);
    cli_json_u64(o, "descriptors_coalesced", rs->descriptors_coalesced);
    cJSON *waves = cli_json_array(o, "waves");
    for (int w = 0; w < rs->num_waves; ++w) {
        const tide_rs_wave_t *v = &rs->waves[w];
        cJSON *wo = cli_json_array_object(waves);
        cli_json_int(wo, "index", w);
        cli_json_int(wo, "pass", v->pass);
        cli_json_int(wo, "first", v->first);
        cli_json_int(wo, "count", v->count);
        cli_json_int(wo, "generation", v->generation);
        cli_json_bool(wo, "has_own", v->has_own);
        cli_json_int(wo, "first_round", v->first_round);
        cli_json_int(wo, "num_rounds", v->num_rounds);
        cJSON *mask = cli_json_array(wo, "zero_mask");
        for (int j = 0; j < rs->gpus_per_node; ++j)
            cli_json_array_int(mask, v->zero_mask ? v->zero_mask[j] : 0);
    }
    cJSON *rounds = cli_json_array(o, "rounds");
    for (int r = 0; r < rs->num_rounds; ++r) {
        cJSON *ro = cli_json_array_object(rounds);
        cli_json_int(ro, "index", r);
        cli_json_int(ro, "wave", rs->rounds[r].wave);
        cli_json_int(ro, "first", rs->rounds[r].first);
        cli_json_int(ro, "count", rs->rounds[r].count);
    }
    cJSON *pieces = cli_json_array(o, "subslice_pieces");
    for (int i = 0; rs->num_pieces != NULL && i < rs->passes * rs->gpus_per_node; ++i)
        cli_json_array_int(pieces, rs->num_pieces[i]);
}

static void json_memory(const show_ctx_t *x, cJSON *root) {
    cJSON *arena = cli_json_object(root, "arena");
    cli_json_u64(arena, "total_bytes", x->sum.arena_bytes);
    cJSON *regions = cli_json_array(arena, "regions");
    for (int r = 0; r < TIDE_REGION_COUNT; ++r) {
        tide_region_info_t info;
        tide_plan_get_region(x->plan, (tide_region_t)r, &info);
        cJSON *ro = cli_json_array_object(regions);
        cli_json_string(ro, "name", tide_region_name((tide_region_t)r));
        cli_json_u64(ro, "offset", info.offset);
        cli_json_u64(ro, "bytes", info.bytes);
    }
    cJSON *m = cli_json_object(root, "memory");
    cli_json_u64(m, "tide_arena_bytes", x->sum.arena_bytes);
    cli_json_u64(m, "fsdp2_ag_bytes", x->fsdp2_ag_bytes);
    cli_json_u64(m, "fsdp2_pack_bytes", x->sum.fsdp2_pack_bytes);
    cli_json_u64(m, "fsdp2_total_bytes", x->fsdp2_total_bytes);
    cli_json_double(m, "tide_over_fsdp2",
                    (double)x->sum.arena_bytes / (double)x->fsdp2_total_bytes);
    cJSON *b = cli_json_object(m, "bounds_ns");
    cli_json_double(b, "in_place_staging_ns", x->bounds.in_place_staging_ns);
    cli_json_double(b, "slot_reuse_staging_ns", x->bounds.slot_reuse_staging_ns);
    cli_json_double(b, "in_place_total_ns", x->bounds.in_place_total_ns);
    cli_json_double(b, "slot_reuse_total_ns", x->bounds.slot_reuse_total_ns);
    cli_json_double(b, "fsdp2_total_ns", x->bounds.fsdp2_total_ns);
    cli_json_bool(b, "rail_lane", x->bounds.rail_lane != 0);
    cli_json_double(b, "rail_lane_staging_ns", x->bounds.rail_lane_staging_ns);
    cli_json_double(b, "rail_lane_in_place_total_ns", x->bounds.rail_lane_in_place_total_ns);
    cli_json_double(b, "rail_lane_slot_reuse_total_ns", x->bounds.rail_lane_slot_reuse_total_ns);
}

static int print_json(const show_ctx_t *x) {
    const tide_plan_summary_t *s = &x->sum;
    const tide_config_t *c = &x->plan->config;
    cJSON *root = cli_json_object(NULL, NULL);
    cli_json_int(root, "nodes", s->nodes);
    cli_json_int(root, "gpus_per_node", s->gpus_per_node);
    cli_json_int(root, "ranks", s->ranks);
    cli_json_int(root, "num_params", s->num_params);
    cli_json_string(root, "preset", x->preset ? x->preset->name : NULL);
    cli_json_string(root, "ag_dtype", cli_dtype_name(x->args->group.dtype));
    cli_json_string(root, "grad_dtype", cli_dtype_name(x->args->group.dtype));
    cli_json_string(root, "shard_dtype", cli_dtype_name(x->args->group.dtype));
    cli_json_string(root, "mode", cli_mode_name(c->mode));
    cli_json_int(root, "wave_width", c->wave_width);
    cli_json_int(root, "round_width", c->round_width);
    cli_json_int(root, "passes", c->passes);
    cli_json_int(root, "staging_slots", c->staging_slots);
    cli_json_string(root, "lane", cli_lane_name(c->lane));
    cli_json_int(root, "sum_ctas", c->sum_ctas);
    cli_json_int(root, "landing_ctas", c->landing_ctas);
    cli_json_bool(root, "multicast", c->multicast != 0);
    cli_json_u64(root, "shard_bytes", s->shard_bytes);
    cli_json_u64(root, "group_bytes", s->group_bytes);
    cli_json_u64(root, "grad_shard_bytes", s->grad_shard_bytes);
    cli_json_u64(root, "fp32_shard_bytes", s->fp32_shard_bytes);
    cli_json_u64(root, "fsdp2_pack_bytes", s->fsdp2_pack_bytes);
    json_params(x, root);
    json_ag(x, root);
    json_rs(x, root);
    json_memory(x, root);
    return cli_json_print(CMD, root);
}

/* ------------------------------------------------------------------ command */

int cli_cmd_show(int argc, char **argv) {
    show_args_t a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;

    show_ctx_t x = {.args = &a};
    rc = cli_group_plan(CMD, &a.group, &x.plan, &x.preset);
    if (rc != CLI_EXIT_OK) return rc;
    tide_result_t res = tide_plan_get_summary(x.plan, &x.sum);
    if (res != TIDE_SUCCESS) {
        rc = cli_lib_error(CMD, "tide_plan_get_summary", res);
        goto done;
    }
    res = tide_memory_bounds(x.sum.nodes, x.sum.gpus_per_node, x.sum.rs_round_width,
                             x.sum.rs_inbox_generations, &x.bounds);
    if (res != TIDE_SUCCESS) {
        rc = cli_lib_error(CMD, "tide_memory_bounds", res);
        goto done;
    }
    /* N S fits (the plan checked it); 2 N S and B_pack may not fit together. */
    if (__builtin_mul_overflow(x.sum.group_bytes, 2, &x.fsdp2_ag_bytes) ||
        __builtin_add_overflow(x.fsdp2_ag_bytes, x.sum.fsdp2_pack_bytes, &x.fsdp2_total_bytes)) {
        fprintf(stderr, "tide-plan " CMD ": stock FSDP2 footprint overflows 64 bits\n");
        rc = CLI_EXIT_ERROR;
        goto done;
    }
    if (a.json)
        rc = print_json(&x);
    else
        print_text(&x);
done:
    tide_plan_destroy(x.plan);
    return rc;
}
