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
    cli_group_opts_t group;
    int rank;
    bool have_collective;
    tide_collective_t collective;
    bool json;
    bool stream_ops;
} program_args_t;

enum { OPT_COLLECTIVE = CLI_OPT_OWN, OPT_RANK, OPT_STREAM_OPS };

static const struct option long_options[] = {
    CLI_GROUP_LONG_OPTIONS,
    {"collective", required_argument, NULL, OPT_COLLECTIVE},
    {"rank", required_argument, NULL, OPT_RANK},
    {"stream-ops", no_argument, NULL, OPT_STREAM_OPS},
    {NULL, 0, NULL, 0},
};

/* --collective and --rank. */
static int own_option(const char *cmd, int c, const char *arg, void *ctx) {
    program_args_t *a = ctx;
    if (c == OPT_RANK) return cli_int_option(cmd, "rank", arg, &a->rank);
    if (c == OPT_STREAM_OPS) {
        a->stream_ops = true;
        return -1;
    }
    if (strcmp(arg, "ag") == 0)
        a->collective = TIDE_COLL_ALL_GATHER;
    else if (strcmp(arg, "rs") == 0)
        a->collective = TIDE_COLL_REDUCE_SCATTER;
    else
        return cli_usage_error(cmd, "--collective '%s': expected ag or rs", arg);
    a->have_collective = true;
    return -1;
}

/* Returns -1 to go on, or an exit code. */
static int parse_args(int argc, char **argv, program_args_t *a) {
    memset(a, 0, sizeof(*a));
    int rc = cli_group_parse(CMD, argc, argv, long_options, &a->group, &a->json, own_option, a);
    if (rc >= 0) return rc;
    if (a->json && a->stream_ops)
        return cli_usage_error(CMD, "--stream-ops prints text: it does not take --json");
    return cli_group_opts_require(
        CMD, &a->group, a->have_collective ? NULL : "--collective is required (ag or rs)");
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
        cli_json_bool(o, "in_bf16", t->in_bf16 != 0);
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
    cli_json_string(root, "dtype", cli_dtype_name(a->group.dtype));
    cli_json_int(root, "wave_width", plan->config.wave_width);
    cli_json_int(root, "round_width", plan->config.round_width);
    cli_json_int(root, "passes", plan->config.passes);
    cli_json_int(root, "staging_slots", plan->config.staging_slots);
    cli_json_string(root, "lane", cli_lane_name(plan->config.lane));

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

int cli_cmd_program(int argc, char **argv) {
    program_args_t a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;

    tide_plan_t plan = NULL;
    const tide_preset_t *preset = NULL;
    rc = cli_group_plan(CMD, &a.group, &plan, &preset);
    if (rc != CLI_EXIT_OK) return rc;
    tide_result_t res;
    if (a.rank < 0 || a.rank >= plan->topo.ranks) {
        fprintf(stderr, "tide-plan " CMD ": --rank %d is outside [0, %d) for M = %d, L = %d\n",
                a.rank, plan->topo.ranks, plan->topo.nodes, plan->topo.gpus_per_node);
        rc = CLI_EXIT_ERROR;
        goto done_plan;
    }
    tide_program_t prog;
    if (a.collective == TIDE_COLL_ALL_GATHER) {
        res = tide_program_compile_ag(plan, &prog);
        if (res != TIDE_SUCCESS) {
            rc = cli_lib_error(CMD, "tide_program_compile_ag", res);
            goto done_plan;
        }
    } else {
        res = tide_program_compile_rs(plan, a.group.mode, &prog);
        if (res != TIDE_SUCCESS) {
            rc = cli_lib_error(CMD, "tide_program_compile_rs", res);
            goto done_plan;
        }
    }
    if (a.stream_ops) {
        rc = cli_program_stream_ops(CMD, &prog, a.rank);
    } else if (a.json) {
        rc = print_json(&a, preset, plan, &prog);
    } else {
        res = tide_program_print(&prog, a.rank, stdout);
        if (res != TIDE_SUCCESS) rc = cli_lib_error(CMD, "tide_program_print", res);
    }
    tide_program_free(&prog);
done_plan:
    tide_plan_destroy(plan);
    return rc;
}
