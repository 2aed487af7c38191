/*
 * cli.h - shared pieces of the tide-plan commands: exit codes, argument parsing, error
 * reporting, the group and tuning options of `show` and `program`, and JSON output.
 *
 * Exit codes: 0 success, 1 a library call failed (its last error is printed), 2 the command
 * line is malformed (a one-line reason and the usage are printed).
 */
#ifndef TIDE_PLAN_CLI_H_
#define TIDE_PLAN_CLI_H_

#include "tide.h"

#include "plan/presets.h"
#include "program/program.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

#define CLI_EXIT_OK 0
#define CLI_EXIT_ERROR 1
#define CLI_EXIT_USAGE 2

/* Commands: argv[0] is the command name, options follow. */
int cli_cmd_show(int argc, char **argv);
int cli_cmd_validate(int argc, char **argv);

/* `validate --programs` (validate_programs.c): the static checker on every compiled program
 * of M in [1, Mmax] at L.  Returns false only when a check could not run at all. */
typedef struct {
    long long checked, failed; /* programs */
    char first_failure[640];
} cli_programs_result_t;
bool cli_validate_programs(int l, int mmax, cli_programs_result_t *r);
/* The largest N = M L that --programs accepts: the checker traces I1 up to 64 ranks. */
#define CLI_PROGRAMS_MAX_RANKS 64
int cli_cmd_memory(int argc, char **argv);
/* `tide-plan memory --model NAME` (memory_model.c); returns the exit code. */
int cli_memory_model(const char *cmd, const char *model, int nodes, int gpus_per_node,
                     tide_rs_mode_t mode, bool with_root, bool json);
/* `tide-plan program --stream-ops` (stream_ops_cmd.c): what rank's part of one call of prog
 * enqueues on the two CUDA fabrics; returns the exit code. */
int cli_program_stream_ops(const char *cmd, const tide_program_t *prog, int rank);
int cli_cmd_solve(int argc, char **argv);
int cli_cmd_program(int argc, char **argv);

/* Print the usage of cmd (NULL: all commands) to stdout (help) or stderr (errors). */
void cli_usage(const char *cmd, bool to_stderr);

/* "tide-plan CMD: <message>" plus the command's usage on stderr; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "tide-plan CMD: <what>: <result string>: <last error>" on stderr; returns CLI_EXIT_ERROR. */
int cli_lib_error(const char *cmd, const char *what, tide_result_t res);

/*
 * getopt_long's report of a bad option (after opterr = 0 and an optstring starting with ':'),
 * as a usage error.  c is getopt's return ('?' or ':').
 */
int cli_bad_option(const char *cmd, int c, char **argv);

/* After the options: -1 when none is left, else a usage error naming the first operand. */
int cli_no_operands(const char *cmd, int argc, char **argv);

/*
 * Parse arg, the value of option --name, into *out: -1 on success, else a usage error
 * "option '--NAME' expects an integer, got 'ARG'".
 */
int cli_int_option(const char *cmd, const char *name, const char *arg, int *out);

/* Strict parsers: the whole string must be consumed; false on garbage or overflow. */
bool cli_parse_int(const char *s, int *out);
bool cli_parse_double(const char *s, double *out);
/* Bytes with an optional binary suffix: K, M, G, T, KiB, MiB, GiB, TiB (case-insensitive). */
bool cli_parse_bytes(const char *s, uint64_t *out);
bool cli_parse_dtype(const char *s, tide_dtype_t *out);
bool cli_parse_mode(const char *s, tide_rs_mode_t *out);
bool cli_parse_lane(const char *s, tide_lane_t *out);
const char *cli_lane_name(tide_lane_t lane);
const char *cli_dtype_name(tide_dtype_t dtype);
const char *cli_mode_name(tide_rs_mode_t mode);

/*
 * The group, topology and tuning options that `show` and `program` share, with --json and
 * --help.  A command's getopt_long table holds CLI_GROUP_LONG_OPTIONS and its own options,
 * numbered from CLI_OPT_OWN; cli_group_parse runs the whole command line.
 */
enum {
    CLI_OPT_NODES = 256,
    CLI_OPT_GPUS,
    CLI_OPT_PRESET,
    CLI_OPT_SHAPES,
    CLI_OPT_DTYPE,
    CLI_OPT_MODE,
    CLI_OPT_WAVE,
    CLI_OPT_ROUND,
    CLI_OPT_PASSES,
    CLI_OPT_STAGING,
    CLI_OPT_LANE,
    CLI_OPT_JSON,
    CLI_OPT_HELP,
    CLI_OPT_OWN /* a command's first own option */
};

#define CLI_GROUP_LONG_OPTIONS                                                                \
    {"nodes", required_argument, NULL, CLI_OPT_NODES},                                        \
        {"gpus-per-node", required_argument, NULL, CLI_OPT_GPUS},                             \
        {"preset", required_argument, NULL, CLI_OPT_PRESET},                                  \
        {"shapes", required_argument, NULL, CLI_OPT_SHAPES},                                  \
        {"dtype", required_argument, NULL, CLI_OPT_DTYPE},                                    \
        {"mode", required_argument, NULL, CLI_OPT_MODE},                                      \
        {"wave-width", required_argument, NULL, CLI_OPT_WAVE},                                \
        {"round-width", required_argument, NULL, CLI_OPT_ROUND},                              \
        {"passes", required_argument, NULL, CLI_OPT_PASSES},                                  \
        {"staging-slots", required_argument, NULL, CLI_OPT_STAGING},                          \
        {"lane", required_argument, NULL, CLI_OPT_LANE},                                      \
        {"json", no_argument, NULL, CLI_OPT_JSON}, {"help", no_argument, NULL, CLI_OPT_HELP}

typedef struct {
    int nodes, gpus_per_node;
    bool have_nodes, have_gpus;
    const char *preset_name; /* exactly one of preset_name and shape_list, once checked */
    const char *shape_list;
    tide_dtype_t dtype; /* all-gather, gradient and shard dtype; default bf16 */
    tide_rs_mode_t mode;
    int wave_width, round_width, passes, staging_slots; /* 0: the planner chooses */
    int multicast;                                      /* no shared option sets it */
    tide_lane_t lane;                                   /* --lane; default auto */
} cli_group_opts_t;

/*
 * A command's own option c (>= CLI_OPT_OWN) with its value arg; ctx is the command's.
 * Returns -1 to go on, or the exit code of a usage error it reported.
 */
typedef int (*cli_own_option_fn)(const char *cmd, int c, const char *arg, void *ctx);

/*
 * Parse argv (argv[0] the command) with the table opts: group options into *g (defaults
 * first: bf16, in-place, every tuning value left to the planner), --json into *json, --help
 * prints the usage, the command's own options go to own, and any other option or an operand
 * is a usage error.  Returns -1 to go on, or an exit code.
 */
int cli_group_parse(const char *cmd, int argc, char **argv, const struct option *opts,
                    cli_group_opts_t *g, bool *json, cli_own_option_fn own, void *ctx);

/*
 * The required options, checked in this order: --nodes, --gpus-per-node, then the command's
 * own (missing: the complaint about one that is absent, NULL when none is), then exactly one
 * of --preset and --shapes.  Returns -1 when all are there, else a usage error.
 */
int cli_group_opts_require(const char *cmd, const cli_group_opts_t *g, const char *missing);

/*
 * Build the group of g (a preset, or the parsed --shapes list) and plan it on g's topology
 * and tuning.  Returns CLI_EXIT_OK with *plan (destroy it) and *preset (NULL with --shapes),
 * or the exit code of the reported error: a usage error for an unknown preset or a bad shape
 * list, a library error when tide_plan_create rejects the plan.
 */
int cli_group_plan(const char *cmd, const cli_group_opts_t *g, tide_plan_t *plan,
                   const tide_preset_t **preset);

/*
 * JSON output.  The add helpers never fail loudly: an allocation failure marks the document
 * and cli_json_print then reports it.  Byte counts are JSON numbers (exact up to 2^53).
 */
cJSON *cli_json_object(cJSON *parent, const char *name); /* parent NULL: a new root */
cJSON *cli_json_array(cJSON *parent, const char *name);
cJSON *cli_json_array_object(cJSON *array); /* append a new object */
void cli_json_int(cJSON *obj, const char *name, long long v);
void cli_json_u64(cJSON *obj, const char *name, uint64_t v);
void cli_json_double(cJSON *obj, const char *name, double v);
void cli_json_bool(cJSON *obj, const char *name, bool v);
void cli_json_string(cJSON *obj, const char *name, const char *v); /* NULL: JSON null */
void cli_json_array_int(cJSON *array, long long v);
/* Print root to stdout, free it; returns CLI_EXIT_OK or CLI_EXIT_ERROR (out of memory). */
int cli_json_print(const char *cmd, cJSON *root);

#endif /* TIDE_PLAN_CLI_H_ */
