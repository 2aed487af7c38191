/*
 * program_cmd.c - `tide-plan program`: compile the TIDE-AG or TIDE-RS program of one plan and
 * print one rank's op lists, the way a fabric would execute them (docs/protocol.md).
 *
 * The text listing is tide_program_print's, the one a fail-stop timeout refers to ("rank r
 * queue q op i"); --json gives per-queue op counts and every op as an object, for scripts
 * that check a schedule without parsing the listing.
 */
#include "tide-plan/cli.h"

#include "fabric/fabric.h"
#include "plan/plan.h"
#include "plan/presets.h"
#include "program/program.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMD "program"

typedef struct {
    int nodes, gpus_per_node, rank;
    bool have_nodes, have_gpus, have_collective;
    const char *preset_name;
    const char *shape_list;
    tide_collective_t collective;
    tide_dtype_t dtype;
    tide_rs_mode_t mode;
    int wave_width, round_width, passes, staging_slots;
    bool json;
} program_args_t;

enum {
    OPT_NODES = 256,
    OPT_GPUS,
    OPT_PRESET,
    OPT_SHAPES,
    OPT_COLLECTIVE,
    OPT_RANK,
    OPT_DTYPE,
    OPT_MODE,
    OPT_WAVE,
    OPT_ROUND,
    OPT_PASSES,
    OPT_STAGING,
    OPT_JSON,
    OPT_HELP
};

static const struct option long_options[] = {
    {"nodes", required_argument, NULL, OPT_NODES},
    {"gpus-per-node", required_argument, NULL, OPT_GPUS},
    {"preset", required_argument, NULL, OPT_PRESET},
    {"shapes", required_argument, NULL, OPT_SHAPES},
    {"collective", required_argument, NULL, OPT_COLLECTIVE},
    {"rank", required_argument, NULL, OPT_RANK},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"mode", required_argument, NULL, OPT_MODE},
    {"wave-width", required_argument, NULL, OPT_WAVE},
    {"round-width", required_argument, NULL, OPT_ROUND},
    {"passes", required_argument, NULL, OPT_PASSES},
    {"staging-slots", required_argument, NULL, OPT_STAGING},
    {"json", no_argument, NULL, OPT_JSON},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

/* Returns -1 to go on, or an exit code. */
static int parse_args(int argc, char **argv, program_args_t *a) {
    memset(a, 0, sizeof(*a));
    a->dtype = TIDE_DTYPE_BF16;
    a->mode = TIDE_RS_IN_PLACE;
    opterr = 0;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, ":", long_options, &li)) != -1) {
        int *target = NULL;
        switch (c) {
        case OPT_NODES:
            target = &a->nodes;
            a->have_nodes = true;
            break;
        case OPT_GPUS:
            target = &a->gpus_per_node;
            a->have_gpus = true;
            break;
        case OPT_RANK:
            target = &a->rank;
            break;
        case OPT_WAVE:
            target = &a->wave_width;
            break;
        case OPT_ROUND:
            target = &a->round_width;
            break;
        case OPT_PASSES:
            target = &a->passes;
            break;
        case OPT_STAGING:
            target = &a->staging_slots;
            break;
        case OPT_PRESET:
            a->preset_name = optarg;
            break;
        case OPT_SHAPES:
            a->shape_list = optarg;
            break;
        case OPT_COLLECTIVE:
            if (strcmp(optarg, "ag") == 0)
                a->collective = TIDE_COLL_ALL_GATHER;
            else if (strcmp(optarg, "rs") == 0)
                a->collective = TIDE_COLL_REDUCE_SCATTER;
            else
                return cli_usage_error(CMD, "--collective '%s': expected ag or rs", optarg);
            a->have_collective = true;
            break;
        case OPT_DTYPE:
            if (!cli_parse_dtype(optarg, &a->dtype))
                return cli_usage_error(CMD, "--dtype '%s': expected bf16 or fp32", optarg);
            break;
        case OPT_MODE:
            if (!cli_parse_mode(optarg, &a->mode))
                return cli_usage_error(CMD, "--mode '%s': expected in-place or slot-reuse", optarg);
            break;
        case OPT_JSON:
            a->json = true;
            break;
        case OPT_HELP:
            cli_usage(CMD, false);
            return CLI_EXIT_OK;
        default:
            return cli_bad_option(CMD, c, argv);
        }
        if (target != NULL && !cli_parse_int(optarg, target))
            return cli_usage_error(CMD, "option '--%s' expects an integer, got '%s'",
                                   long_options[li].name, optarg);
    }
    if (optind < argc) return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!a->have_nodes) return cli_usage_error(CMD, "--nodes is required");
    if (!a->have_gpus) return cli_usage_error(CMD, "--gpus-per-node is required");
    if (!a->have_collective) return cli_usage_error(CMD, "--collective is required (ag or rs)");
    if ((a->preset_name == NULL) == (a->shape_list == NULL))
        return cli_usage_error(CMD, "give exactly one of --preset NAME or --shapes LIST");
    return -1;
}

/* ------------------------------------------------------------------ JSON */

static const char *ref_kind_name(int kind) {
    static const char *const names[TIDE_REF_KIND_COUNT] = {"none",  "arena", "landing",
                                                           "shard", "grad",  "out"};
    return kind >= 0 && kind < TIDE_REF_KIND_COUNT ? names[kind] : "?";
}

/* A buffer reference: kind, then only the fields that kind uses. */
static void fill_ref(cJSON *o, const tide_ref_t *ref) {
    cli_json_string(o, "kind", ref_kind_name(ref->kind));
    if (ref->kind == TIDE_REF_ARENA || ref->kind == TIDE_REF_LANDING)
        cli_json_int(o, "rank", ref->rank);
    if (ref->kind == TIDE_REF_ARENA)
        cli_json_string(o, "region", tide_region_name((tide_region_t)ref->region));
    if (ref->kind == TIDE_REF_GRAD) cli_json_int(o, "param", ref->param);
    cli_json_u64(o, "offset", ref->offset);
}

static void json_ref(cJSON *parent, const char *name, const tide_ref_t *ref) {
    fill_ref(cli_json_object(parent, name), ref);
}

static void json_op(cJSON *ops, int q, int index, const tide_op_t *op) {
    cJSON *o = cli_json_array_object(ops);
    cli_json_string(o, "queue", tide_queue_name((tide_queue_t)q));
    cli_json_int(o, "index", index);
    cli_json_string(o, "kind", tide_op_kind_name(op->kind));
    switch (op->kind) {
    case TIDE_OP_COPY:
    case TIDE_OP_COPY2D:
    case TIDE_OP_CAST:
        json_ref(o, "dst", &op->dst);
        json_ref(o, "src", &op->src);
        cli_json_u64(o, "bytes", op->bytes); /* per row for COPY2D */
        if (op->kind == TIDE_OP_COPY2D) {
            cli_json_u64(o, "rows", op->rows);
            cli_json_u64(o, "dst_pitch", op->dst_pitch);
            cli_json_u64(o, "src_pitch", op->src_pitch);
        }
        break;
    case TIDE_OP_ZERO:
        json_ref(o, "dst", &op->dst);
        cli_json_u64(o, "bytes", op->bytes);
        break;
    case TIDE_OP_SIGNAL:
        cli_json_int(o, "ctr", op->ctr);
        cli_json_int(o, "rank", op->sig_rank);
        break;
    case TIDE_OP_WAIT:
        cli_json_int(o, "ctr", op->ctr);
        cli_json_int(o, "inc", op->inc);
        cli_json_int(o, "thr", op->thr);
        break;
    case TIDE_OP_SUM:
    case TIDE_OP_LAND:
        cli_json_int(o, "table", op->table);
        if (op->kind == TIDE_OP_LAND) cli_json_bool(o, "init", op->init != 0);
        break;
    case TIDE_OP_EVENT:
        cli_json_string(o, "event",
                        op->event == TIDE_EVENT_READ_DONE   ? "read-done"
                        : op->event == TIDE_EVENT_CALL_DONE ? "call-done"
                                                            : "?");
        break;
    default:
        break;
    }
    if (op->kind == TIDE_OP_COPY || op->kind == TIDE_OP_COPY2D) {
        if (op->sig_rank >= 0) {
            cJSON *s = cli_json_object(o, "signal");
            cli_json_int(s, "ctr", op->ctr);
            cli_json_int(s, "rank", op->sig_rank);
        } else {
            cli_json_string(o, "signal", NULL);
        }
    }
    cli_json_bool(o, "bank", op->bank_dep != 0);
}

static void json_table(cJSON *tables, int index, const tide_table_t *t) {
    cJSON *o = cli_json_array_object(tables);
    cli_json_int(o, "index", index);
    cli_json_string(o, "kind", tide_op_kind_name(t->kind));
    cli_json_int(o, "num_segs", t->num_segs);
    if (t->kind == TIDE_OP_SUM) {
        json_ref(o, "staged", &t->staged);
        cli_json_int(o, "num_staged", t->num_staged);
        cli_json_u64(o, "stage_stride", t->stage_stride);
        json_ref(o, "out", &t->out);
    } else {
        cJSON *in = cli_json_array(o, "in");
        for (int i = 0; i < t->num_in && i < TIDE_MAX_GPUS_PER_NODE; ++i)
            fill_ref(cli_json_array_object(in), &t->in[i]);
    }
}

static int print_json(const program_args_t *a, const tide_preset_t *preset,
                      const struct tide_plan *plan, const tide_program_t *prog) {
    const tide_rank_program_t *rp = &prog->ranks[a->rank];
    cJSON *root = cli_json_object(NULL, NULL);
    cli_json_string(root, "collective", prog->coll == TIDE_COLL_ALL_GATHER ? "ag" : "rs");
    cli_json_string(root, "mode",
                    prog->coll == TIDE_COLL_REDUCE_SCATTER ? cli_mode_name(prog->mode) : NULL);
    cli_json_int(root, "nodes", plan->topo.nodes);
    cli_json_int(root, "gpus_per_node", plan->topo.gpus_per_node);
    cli_json_int(root, "ranks", plan->topo.ranks);
    cli_json_int(root, "rank", a->rank);
    cli_json_int(root, "num_params", plan->geom.num_params);
    cli_json_string(root, "preset", preset ? preset->name : NULL);
    cli_json_string(root, "dtype", cli_dtype_name(a->dtype));
    cli_json_int(root, "wave_width", plan->config.wave_width);
    cli_json_int(root, "round_width", plan->config.round_width);
    cli_json_int(root, "passes", plan->config.passes);
    cli_json_int(root, "staging_slots", plan->config.staging_slots);

    int total = 0;
    cJSON *queues = cli_json_array(root, "queues");
    for (int q = 0; q < TIDE_Q_COUNT; ++q) {
        const tide_queue_ops_t *qo = &rp->queues[q];
        int kinds[TIDE_OP_KIND_COUNT] = {0};
        for (int i = 0; i < qo->num_ops; ++i)
            if (qo->ops[i].kind < TIDE_OP_KIND_COUNT) ++kinds[qo->ops[i].kind];
        cJSON *qj = cli_json_array_object(queues);
        cli_json_string(qj, "name", tide_queue_name((tide_queue_t)q));
        cli_json_int(qj, "num_ops", qo->num_ops);
        cJSON *kj = cli_json_object(qj, "kinds");
        for (int k = 0; k < TIDE_OP_KIND_COUNT; ++k)
            if (kinds[k] > 0) cli_json_int(kj, tide_op_kind_name(k), kinds[k]);
        total += qo->num_ops;
    }
    cli_json_int(root, "num_ops", total);
    cJSON *ops = cli_json_array(root, "ops");
    for (int q = 0; q < TIDE_Q_COUNT; ++q)
        for (int i = 0; i < rp->queues[q].num_ops; ++i)
            json_op(ops, q, i, &rp->queues[q].ops[i]);
    cJSON *tables = cli_json_array(root, "tables");
    for (int t = 0; t < rp->num_tables; ++t)
        json_table(tables, t, &rp->tables[t]);
    return cli_json_print(CMD, root);
}

/* ------------------------------------------------------------------ command */

static int run(const program_args_t *a, const tide_group_desc_t *group,
               const tide_preset_t *preset) {
    tide_config_t config = TIDE_CONFIG_INIT;
    config.nodes = a->nodes;
    config.gpus_per_node = a->gpus_per_node;
    config.wave_width = a->wave_width;
    config.round_width = a->round_width;
    config.passes = a->passes;
    config.staging_slots = a->staging_slots;
    config.mode = a->mode;

    tide_plan_t plan = NULL;
    tide_result_t res = tide_plan_create(&config, group, &plan);
    if (res != TIDE_SUCCESS) return cli_lib_error(CMD, "tide_plan_create", res);
    int rc = CLI_EXIT_OK;
    if (a->rank < 0 || a->rank >= plan->topo.ranks) {
        fprintf(stderr, "tide-plan " CMD ": --rank %d is outside [0, %d) for M = %d, L = %d\n",
                a->rank, plan->topo.ranks, plan->topo.nodes, plan->topo.gpus_per_node);
        rc = CLI_EXIT_ERROR;
        goto done_plan;
    }
    tide_program_t prog;
    if (a->collective == TIDE_COLL_ALL_GATHER) {
        res = tide_program_compile_ag(plan, &prog);
        if (res != TIDE_SUCCESS) {
            rc = cli_lib_error(CMD, "tide_program_compile_ag", res);
            goto done_plan;
        }
    } else {
        res = tide_program_compile_rs(plan, a->mode, &prog);
        if (res != TIDE_SUCCESS) {
            rc = cli_lib_error(CMD, "tide_program_compile_rs", res);
            goto done_plan;
        }
    }
    if (a->json) {
        rc = print_json(a, preset, plan, &prog);
    } else {
        res = tide_program_print(&prog, a->rank, stdout);
        if (res != TIDE_SUCCESS) rc = cli_lib_error(CMD, "tide_program_print", res);
    }
    tide_program_free(&prog);
done_plan:
    tide_plan_destroy(plan);
    return rc;
}

int cli_cmd_program(int argc, char **argv) {
    program_args_t a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;

    tide_group_desc_t group = {0};
    group.ag_dtype = group.grad_dtype = group.shard_dtype = a.dtype;
    const tide_preset_t *preset = NULL;
    tide_param_shape_t *parsed = NULL;
    if (a.preset_name != NULL) {
        preset = tide_preset_find(a.preset_name);
        if (preset == NULL)
            return cli_usage_error(CMD, "unknown preset '%s' (presets: %s)", a.preset_name,
                                   tide_preset_names());
        group.num_params = preset->num_params;
        group.shapes = preset->shapes;
    } else {
        tide_result_t res = tide_shapes_parse(a.shape_list, &parsed, &group.num_params);
        if (res != TIDE_SUCCESS) return cli_usage_error(CMD, "--shapes: %s", tide_get_last_error());
        group.shapes = parsed;
    }
    rc = run(&a, &group, preset);
    free(parsed);
    return rc;
}
