/*
 * group_opts.c - the group, topology and tuning options of `tide-plan show` and
 * `tide-plan program`, and the plan built from them.  One parser keeps the two commands'
 * options, messages and defaults the same.
 */
#include "tide-plan/cli.h"

#include <stdlib.h>
#include <string.h>

/* The shared entries alone, in the enum's order: the names for messages. */
static const struct option group_options[] = {CLI_GROUP_LONG_OPTIONS};
#define NUM_GROUP_OPTIONS ((int)(sizeof(group_options) / sizeof(group_options[0])))

/* The long name of group option c, for messages (the table is in the enum's order). */
static const char *option_name(int c) {
    int i = c - CLI_OPT_NODES;
    return i >= 0 && i < NUM_GROUP_OPTIONS ? group_options[i].name : "?";
}

/* Take option c with value arg if it is a group option: -1 to go on or an exit code in *rc. */
static bool group_option(const char *cmd, int c, const char *arg, cli_group_opts_t *g, int *rc) {
    int *target = NULL;
    *rc = -1;
    switch (c) {
    case CLI_OPT_NODES:
        target = &g->nodes;
        g->have_nodes = true;
        break;
    case CLI_OPT_GPUS:
        target = &g->gpus_per_node;
        g->have_gpus = true;
        break;
    case CLI_OPT_WAVE:
        target = &g->wave_width;
        break;
    case CLI_OPT_ROUND:
        target = &g->round_width;
        break;
    case CLI_OPT_PASSES:
        target = &g->passes;
        break;
    case CLI_OPT_STAGING:
        target = &g->staging_slots;
        break;
    case CLI_OPT_PRESET:
        g->preset_name = arg;
        break;
    case CLI_OPT_SHAPES:
        g->shape_list = arg;
        break;
    case CLI_OPT_DTYPE:
        if (!cli_parse_dtype(arg, &g->dtype))
            *rc = cli_usage_error(cmd, "--dtype '%s': expected bf16 or fp32", arg);
        break;
    case CLI_OPT_MODE:
        if (!cli_parse_mode(arg, &g->mode))
            *rc = cli_usage_error(cmd, "--mode '%s': expected in-place or slot-reuse", arg);
        break;
    case CLI_OPT_LANE:
        if (!cli_parse_lane(arg, &g->lane))
            *rc = cli_usage_error(cmd, "--lane '%s': expected auto, generic or rail", arg);
        break;
    default:
        return false;
    }
    if (target != NULL) *rc = cli_int_option(cmd, option_name(c), arg, target);
    return true;
}

int cli_group_parse(const char *cmd, int argc, char **argv, const struct option *opts,
                    cli_group_opts_t *g, bool *json, cli_own_option_fn own, void *ctx) {
    memset(g, 0, sizeof(*g));
    g->dtype = TIDE_DTYPE_BF16;
    g->mode = TIDE_RS_IN_PLACE;
    g->lane = TIDE_LANE_AUTO;
    *json = false;
    opterr = 0;
    int c, rc;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (group_option(cmd, c, optarg, g, &rc)) {
            if (rc >= 0) return rc;
        } else if (c == CLI_OPT_JSON) {
            *json = true;
        } else if (c == CLI_OPT_HELP) {
            cli_usage(cmd, false);
            return CLI_EXIT_OK;
        } else if (c >= CLI_OPT_OWN) {
            rc = own(cmd, c, optarg, ctx);
            if (rc >= 0) return rc;
        } else {
            return cli_bad_option(cmd, c, argv);
        }
    }
    return cli_no_operands(cmd, argc, argv);
}

int cli_group_opts_require(const char *cmd, const cli_group_opts_t *g, const char *missing) {
    if (!g->have_nodes) return cli_usage_error(cmd, "--nodes is required");
    if (!g->have_gpus) return cli_usage_error(cmd, "--gpus-per-node is required");
    if (missing != NULL) return cli_usage_error(cmd, "%s", missing);
    if ((g->preset_name == NULL) == (g->shape_list == NULL))
        return cli_usage_error(cmd, "give exactly one of --preset NAME or --shapes LIST");
    return -1;
}

int cli_group_plan(const char *cmd, const cli_group_opts_t *g, tide_plan_t *plan,
                   const tide_preset_t **preset) {
    tide_group_desc_t group = {0};
    group.ag_dtype = group.grad_dtype = group.shard_dtype = g->dtype;
    const tide_preset_t *found = NULL;
    tide_param_shape_t *parsed = NULL;
    if (g->preset_name != NULL) {
        found = tide_preset_find(g->preset_name);
        if (found == NULL)
            return cli_usage_error(cmd, "unknown preset '%s' (presets: %s)", g->preset_name,
                                   tide_preset_names());
        group.num_params = found->num_params;
        group.shapes = found->shapes;
    } else {
        tide_result_t res = tide_shapes_parse(g->shape_list, &parsed, &group.num_params);
        if (res != TIDE_SUCCESS) return cli_usage_error(cmd, "--shapes: %s", tide_get_last_error());
        group.shapes = parsed;
    }

    tide_config_t config = TIDE_CONFIG_INIT;
    config.nodes = g->nodes;
    config.gpus_per_node = g->gpus_per_node;
    config.wave_width = g->wave_width;
    config.round_width = g->round_width;
    config.passes = g->passes;
    config.staging_slots = g->staging_slots;
    config.mode = g->mode;
    config.multicast = g->multicast;
    config.lane = g->lane;

    /* The plan copies what it needs of the shapes, so a parsed list is freed here. */
    tide_plan_t built = NULL;
    tide_result_t res = tide_plan_create(&config, &group, &built);
    free(parsed);
    if (res != TIDE_SUCCESS) return cli_lib_error(cmd, "tide_plan_create", res);
    *plan = built;
    *preset = found;
    return CLI_EXIT_OK;
}
