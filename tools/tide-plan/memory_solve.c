/*
 * memory_solve.c - `tide-plan memory` (closed-form bounds, §5.4 eqs. 10-12) and
 * `tide-plan solve` (sizing solver, App. G eqs. 13-14): thin front ends over
 * tide_memory_bounds and tide_solve.
 */
#include "tide-plan/cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ memory */

enum { MEM_NODES = 256, MEM_GPUS, MEM_ROUND, MEM_GENERATIONS, MEM_JSON, MEM_HELP, MEM_MODEL,
       MEM_MODE, MEM_NO_ROOT };

static const struct option memory_options[] = {
    {"nodes", required_argument, NULL, MEM_NODES},
    {"gpus-per-node", required_argument, NULL, MEM_GPUS},
    {"round-width", required_argument, NULL, MEM_ROUND},
    {"inbox-generations", required_argument, NULL, MEM_GENERATIONS},
    {"json", no_argument, NULL, MEM_JSON},
    {"help", no_argument, NULL, MEM_HELP},
    {"model", required_argument, NULL, MEM_MODEL},
    {"mode", required_argument, NULL, MEM_MODE},
    {"no-root", no_argument, NULL, MEM_NO_ROOT},
    {NULL, 0, NULL, 0},
};

int cli_cmd_memory(int argc, char **argv) {
    static const char *const cmd = "memory";
    /* nodes, gpus_per_node, round_width, inbox_generations: all required. */
    int v[4];
    bool have[4] = {false, false, false, false};
    bool json = false;
    const char *model = NULL;
    tide_rs_mode_t mode = TIDE_RS_IN_PLACE;
    bool have_mode = false, with_root = true;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":", memory_options, NULL)) != -1) {
        if (c == MEM_NO_ROOT) {
            with_root = false;
            continue;
        }
        if (c == MEM_MODEL) {
            model = optarg;
            continue;
        }
        if (c == MEM_MODE) {
            if (!cli_parse_mode(optarg, &mode))
                return cli_usage_error(cmd, "--mode '%s': need in-place or slot-reuse", optarg);
            have_mode = true;
            continue;
        }
        if (c == MEM_JSON) {
            json = true;
            continue;
        }
        if (c == MEM_HELP) {
            cli_usage(cmd, false);
            return CLI_EXIT_OK;
        }
        if (c < MEM_NODES || c > MEM_GENERATIONS) return cli_bad_option(cmd, c, argv);
        int i = c - MEM_NODES;
        int rc = cli_int_option(cmd, memory_options[i].name, optarg, &v[i]);
        if (rc >= 0) return rc;
        have[i] = true;
    }
    int rc = cli_no_operands(cmd, argc, argv);
    if (rc >= 0) return rc;
    if (model != NULL) {
        /* A whole model: the planner picks k and n_par per group. */
        for (int i = 0; i < 2; ++i)
            if (!have[i]) return cli_usage_error(cmd, "--%s is required", memory_options[i].name);
        if (have[2] || have[3])
            return cli_usage_error(cmd, "--model plans every group: --round-width and "
                                        "--inbox-generations do not apply");
        return cli_memory_model(cmd, model, v[0], v[1], mode, with_root, json);
    }
    if (have_mode || !with_root)
        return cli_usage_error(cmd, "--mode and --no-root apply to --model only");
    for (int i = 0; i < 4; ++i)
        if (!have[i]) return cli_usage_error(cmd, "--%s is required", memory_options[i].name);

    tide_memory_bounds_t b;
    tide_result_t res = tide_memory_bounds(v[0], v[1], v[2], v[3], &b);
    if (res != TIDE_SUCCESS) return cli_lib_error(cmd, "tide_memory_bounds", res);

    if (json) {
        cJSON *root = cli_json_object(NULL, NULL);
        cli_json_int(root, "nodes", v[0]);
        cli_json_int(root, "gpus_per_node", v[1]);
        cli_json_int(root, "round_width", v[2]);
        cli_json_int(root, "inbox_generations", v[3]);
        cli_json_double(root, "in_place_staging_ns", b.in_place_staging_ns);
        cli_json_double(root, "slot_reuse_staging_ns", b.slot_reuse_staging_ns);
        cli_json_double(root, "in_place_total_ns", b.in_place_total_ns);
        cli_json_double(root, "slot_reuse_total_ns", b.slot_reuse_total_ns);
        cli_json_double(root, "fsdp2_total_ns", b.fsdp2_total_ns);
        cli_json_bool(root, "rail_lane", b.rail_lane != 0);
        cli_json_double(root, "rail_lane_staging_ns", b.rail_lane_staging_ns);
        cli_json_double(root, "rail_lane_in_place_total_ns", b.rail_lane_in_place_total_ns);
        cli_json_double(root, "rail_lane_slot_reuse_total_ns", b.rail_lane_slot_reuse_total_ns);
        return cli_json_print(cmd, root);
    }
    printf("memory bounds, units of N S (one unsharded bf16 group; n_stg = 2)\n");
    printf("  M = %d, L = %d, k = %d, n_par = %d\n", v[0], v[1], v[2], v[3]);
    printf("  RS staging, In-Place   (eq. 11)  %.3f\n", b.in_place_staging_ns);
    printf("  RS staging, Slot-Reuse (eq. 12)  %.3f\n", b.slot_reuse_staging_ns);
    printf("  live in backward, In-Place       %.3f\n", b.in_place_total_ns);
    printf("  live in backward, Slot-Reuse     %.3f\n", b.slot_reuse_total_ns);
    printf("  live in backward, stock FSDP2    %.3f\n", b.fsdp2_total_ns);
    if (b.rail_lane) {
        printf("  rail lane (L = 1, the default there; the lines above are the generic programs)\n");
        printf("  RS inbox, both modes             %.3f\n", b.rail_lane_staging_ns);
        printf("  live in backward, In-Place       %.3f\n", b.rail_lane_in_place_total_ns);
        printf("  live in backward, Slot-Reuse     %.3f\n", b.rail_lane_slot_reuse_total_ns);
    }
    return CLI_EXIT_OK;
}

/* ------------------------------------------------------------------ solve */

enum {
    SOL_NODES = 256,
    SOL_GPUS,
    SOL_WAVE,
    SOL_PASSES, /* ints */
    SOL_NIC,
    SOL_SUM,
    SOL_LAND,
    SOL_CAP,
    SOL_TROUND,
    SOL_LINK, /* doubles */
    SOL_BYTES,
    SOL_DTYPE,
    SOL_JSON,
    SOL_HELP
};

static const struct option solve_options[] = {
    {"nodes", required_argument, NULL, SOL_NODES},
    {"gpus-per-node", required_argument, NULL, SOL_GPUS},
    {"wave-width", required_argument, NULL, SOL_WAVE},
    {"passes", required_argument, NULL, SOL_PASSES},
    {"bw-nic", required_argument, NULL, SOL_NIC},
    {"bw-sum", required_argument, NULL, SOL_SUM},
    {"bw-land", required_argument, NULL, SOL_LAND},
    {"bw-cap", required_argument, NULL, SOL_CAP},
    {"t-round", required_argument, NULL, SOL_TROUND},
    {"bw-link", required_argument, NULL, SOL_LINK},
    {"bytes", required_argument, NULL, SOL_BYTES},
    {"dtype", required_argument, NULL, SOL_DTYPE},
    {"json", no_argument, NULL, SOL_JSON},
    {"help", no_argument, NULL, SOL_HELP},
    {NULL, 0, NULL, 0},
};

/* Options whose absence is a usage error, by enum value. */
static const int solve_required[] = {SOL_NODES, SOL_GPUS, SOL_NIC,    SOL_SUM,
                                     SOL_LAND,  SOL_CAP,  SOL_TROUND, SOL_BYTES};

int cli_cmd_solve(int argc, char **argv) {
    static const char *const cmd = "solve";
    tide_solver_input_t in;
    memset(&in, 0, sizeof(in));
    in.grad_dtype = TIDE_DTYPE_BF16;
    int *ints[] = {&in.nodes, &in.gpus_per_node, &in.wave_width, &in.passes};
    double *dbls[] = {&in.bw_nic_gbps, &in.bw_sum_gbps, &in.bw_land_gbps, &in.bw_cap_gbps,
                      &in.t_round_ms, &in.bw_link_gbps};
    bool seen[SOL_HELP - SOL_NODES + 1] = {false};
    bool json = false;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":", solve_options, NULL)) != -1) {
        if (c < SOL_NODES || c > SOL_HELP) return cli_bad_option(cmd, c, argv);
        seen[c - SOL_NODES] = true;
        bool ok = true;
        if (c <= SOL_PASSES)
            ok = cli_parse_int(optarg, ints[c - SOL_NODES]);
        else if (c <= SOL_LINK)
            ok = cli_parse_double(optarg, dbls[c - SOL_NIC]);
        else if (c == SOL_BYTES)
            ok = cli_parse_bytes(optarg, &in.fp32_shard_bytes);
        else if (c == SOL_DTYPE) {
            if (!cli_parse_dtype(optarg, &in.grad_dtype))
                return cli_usage_error(cmd, "--dtype '%s': expected bf16 or fp32", optarg);
        } else if (c == SOL_JSON)
            json = true;
        else {
            cli_usage(cmd, false);
            return CLI_EXIT_OK;
        }
        if (!ok)
            return cli_usage_error(cmd, "option '--%s': cannot parse '%s'",
                                   solve_options[c - SOL_NODES].name, optarg);
    }
    int rc = cli_no_operands(cmd, argc, argv);
    if (rc >= 0) return rc;
    for (size_t i = 0; i < sizeof(solve_required) / sizeof(solve_required[0]); ++i)
        if (!seen[solve_required[i] - SOL_NODES])
            return cli_usage_error(cmd, "--%s is required",
                                   solve_options[solve_required[i] - SOL_NODES].name);

    tide_solver_output_t out;
    tide_result_t res = tide_solve(&in, &out);
    if (res != TIDE_SUCCESS) return cli_lib_error(cmd, "tide_solve", res);

    if (json) {
        cJSON *root = cli_json_object(NULL, NULL);
        cli_json_int(root, "nodes", in.nodes);
        cli_json_int(root, "gpus_per_node", in.gpus_per_node);
        cli_json_int(root, "wave_width", in.wave_width == 0 ? in.gpus_per_node : in.wave_width);
        cli_json_int(root, "passes", in.passes == 0 ? 1 : in.passes);
        cli_json_string(root, "grad_dtype", cli_dtype_name(in.grad_dtype));
        cli_json_u64(root, "fp32_shard_bytes", in.fp32_shard_bytes);
        cli_json_double(root, "bw_link_gbps", in.bw_link_gbps);
        cli_json_int(root, "round_width", out.round_width);
        cli_json_int(root, "sum_ctas", out.sum_ctas);
        cli_json_int(root, "landing_ctas", out.landing_ctas);
        cli_json_double(root, "t_nic_ms", out.t_nic_ms);
        cli_json_int(root, "rounds", out.rounds);
        return cli_json_print(cmd, root);
    }
    printf("sizing solver (App. G): M = %d, L = %d, S_fp32 = %" PRIu64 " bytes, %s gradients\n",
           in.nodes, in.gpus_per_node, in.fp32_shard_bytes, cli_dtype_name(in.grad_dtype));
    printf("  t_NIC = (M - 1) S_fp32 / BW_NIC     %.3f ms\n", out.t_nic_ms);
    if (in.nodes == 1 && in.bw_link_gbps != 0.0)
        printf("  sum CTAs C_sum (M = 1, BW_link)     %d\n", out.sum_ctas);
    else
        printf("  sum CTAs C_sum (eq. 13)             %d\n", out.sum_ctas);
    printf("  landing CTAs C_mc (eq. 14)          %d\n", out.landing_ctas);
    printf("  round width k                       %d\n", out.round_width);
    printf("  network rounds per pass             %d\n", out.rounds);
    return CLI_EXIT_OK;
}
