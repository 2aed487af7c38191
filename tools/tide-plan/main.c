/*
 * tide-plan - print and validate TIDE plans, memory bounds and solver choices.
 *
 *   tide-plan show      the full plan of one group on one topology
 *   tide-plan validate  the exhaustive Latin-square schedule validation (App. D)
 *   tide-plan memory    the closed-form memory bounds (§5.4, eqs. 10-12)
 *   tide-plan solve     the sizing solver (App. G, eqs. 13-14)
 *   tide-plan program   one rank's compiled TIDE-AG / TIDE-RS program (docs/protocol.md)
 *
 * This file dispatches commands and holds the argument parsers and error reporting shared by
 * all of them.  docs/tide-plan.md documents every option and JSON field.
 */
#include "tide-plan/cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
} cli_command_t;

static const cli_command_t commands[] = {
    {"show", cli_cmd_show,
     "tide-plan show --nodes M --gpus-per-node L (--preset NAME | --shapes LIST)\n"
     "               [--dtype bf16|fp32] [--mode in-place|slot-reuse] [--wave-width W]\n"
     "               [--round-width k] [--passes n] [--staging-slots n] [--lane auto|generic|rail]\n"
     "               [--multicast] [--json]"},
    {"validate", cli_cmd_validate,
     "tide-plan validate --gpus-per-node L --max-nodes Mmax [--jobs n] [--programs] [--json]"},
    {"memory", cli_cmd_memory,
     "tide-plan memory --nodes M --gpus-per-node L --round-width k --inbox-generations n\n"
     "                 [--json]\n"
     "  tide-plan memory --model llama-3.1-8b|llama-3.1-70b|qwen3-30b-a3b --nodes M\n"
     "                 --gpus-per-node L [--mode in-place|slot-reuse] [--no-root] [--json]"},
    {"solve", cli_cmd_solve,
     "tide-plan solve --nodes M --gpus-per-node L --bw-nic GBps --bw-sum GBps --bw-land GBps\n"
     "                --bw-cap GBps --t-round ms --bytes B [--wave-width W] [--passes n]\n"
     "                [--bw-link GBps]\n"
     "                [--dtype bf16|fp32] [--json]"},
    {"program", cli_cmd_program,
     "tide-plan program --nodes M --gpus-per-node L (--preset NAME | --shapes LIST)\n"
     "                  --collective ag|rs [--mode in-place|slot-reuse] [--rank r]\n"
     "                  [--dtype bf16|fp32] [--wave-width W] [--round-width k] [--passes n]\n"
     "                  [--staging-slots n] [--lane auto|generic|rail] [--json | --stream-ops]"},
};
#define NUM_COMMANDS ((int)(sizeof(commands) / sizeof(commands[0])))

void cli_usage(const char *cmd, bool to_stderr) {
    FILE *f = to_stderr ? stderr : stdout;
    fprintf(f, "usage:\n");
    for (int i = 0; i < NUM_COMMANDS; ++i)
        if (cmd == NULL || strcmp(cmd, commands[i].name) == 0)
            fprintf(f, "  %s\n", commands[i].usage);
    if (cmd == NULL) fprintf(f, "  tide-plan --help | --version\n");
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tide-plan%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    cli_usage(cmd, true);
    return CLI_EXIT_USAGE;
}

int cli_lib_error(const char *cmd, const char *what, tide_result_t res) {
    fprintf(stderr, "tide-plan %s: %s: %s: %s\n", cmd, what, tide_get_error_string(res),
            tide_get_last_error());
    return CLI_EXIT_ERROR;
}

int cli_bad_option(const char *cmd, int c, char **argv) {
    const char *opt = argv[optind - 1];
    if (c == ':') return cli_usage_error(cmd, "option '%s' requires a value", opt);
    /* A long option given a value it does not take: optopt is its value, not a character. */
    if (optopt > UCHAR_MAX) return cli_usage_error(cmd, "option '%s' takes no value", opt);
    if (optopt != 0) return cli_usage_error(cmd, "unknown option '-%c'", optopt);
    return cli_usage_error(cmd, "unknown option '%s'", opt);
}

int cli_no_operands(const char *cmd, int argc, char **argv) {
    if (optind < argc) return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    return -1;
}

int cli_int_option(const char *cmd, const char *name, const char *arg, int *out) {
    if (cli_parse_int(arg, out)) return -1;
    return cli_usage_error(cmd, "option '--%s' expects an integer, got '%s'", name, arg);
}

bool cli_parse_int(const char *s, int *out) {
    if (s == NULL || *s == '\0' || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < INT_MIN || v > INT_MAX) return false;
    *out = (int)v;
    return true;
}

bool cli_parse_double(const char *s, double *out) {
    if (s == NULL || *s == '\0' || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v)) return false;
    *out = v;
    return true;
}

bool cli_parse_bytes(const char *s, uint64_t *out) {
    if (s == NULL || *s < '0' || *s > '9') return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0) return false;
    static const struct {
        const char *suffix;
        int shift;
    } suffixes[] = {{"", 0},     {"K", 10},   {"M", 20},   {"G", 30},  {"T", 40},
                    {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}};
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); ++i) {
        if (strcasecmp(end, suffixes[i].suffix) != 0) continue;
        if (suffixes[i].shift > 0 && v > (UINT64_MAX >> suffixes[i].shift)) return false;
        *out = (uint64_t)v << suffixes[i].shift;
        return true;
    }
    return false;
}

bool cli_parse_dtype(const char *s, tide_dtype_t *out) {
    /* fp16 parses so that the library, not the command line, says it is unsupported. */
    if (strcmp(s, "bf16") == 0)
        *out = TIDE_DTYPE_BF16;
    else if (strcmp(s, "fp32") == 0)
        *out = TIDE_DTYPE_FP32;
    else if (strcmp(s, "fp16") == 0)
        *out = TIDE_DTYPE_FP16;
    else
        return false;
    return true;
}

bool cli_parse_mode(const char *s, tide_rs_mode_t *out) {
    if (strcmp(s, "in-place") == 0)
        *out = TIDE_RS_IN_PLACE;
    else if (strcmp(s, "slot-reuse") == 0)
        *out = TIDE_RS_SLOT_REUSE;
    else
        return false;
    return true;
}

bool cli_parse_lane(const char *s, tide_lane_t *out) {
    if (strcmp(s, "auto") == 0)
        *out = TIDE_LANE_AUTO;
    else if (strcmp(s, "generic") == 0)
        *out = TIDE_LANE_GENERIC;
    else if (strcmp(s, "rail") == 0)
        *out = TIDE_LANE_RAIL;
    else
        return false;
    return true;
}

const char *cli_lane_name(tide_lane_t lane) {
    switch (lane) {
    case TIDE_LANE_AUTO:
        return "auto";
    case TIDE_LANE_GENERIC:
        return "generic";
    case TIDE_LANE_RAIL:
        return "rail";
    default:
        return "unknown";
    }
}

const char *cli_dtype_name(tide_dtype_t dtype) {
    switch (dtype) {
    case TIDE_DTYPE_BF16:
        return "bf16";
    case TIDE_DTYPE_FP32:
        return "fp32";
    case TIDE_DTYPE_FP16:
        return "fp16";
    default:
        return "unknown";
    }
}

const char *cli_mode_name(tide_rs_mode_t mode) {
    return mode == TIDE_RS_SLOT_REUSE ? "slot-reuse" : "in-place";
}

int main(int argc, char **argv) {
    /* The CLI prints the library's last error itself; the library's own log line would say
     * the same thing twice.  An explicit TIDE_DEBUG still wins. */
    setenv("TIDE_DEBUG", "NONE", 0);
    if (argc < 2) return cli_usage_error(NULL, "missing command");
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        cli_usage(NULL, false);
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("tide-plan %d.%d.%d\n", TIDE_MAJOR, TIDE_MINOR, TIDE_PATCH);
        return CLI_EXIT_OK;
    }
    for (int i = 0; i < NUM_COMMANDS; ++i)
        if (strcmp(cmd, commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    return cli_usage_error(NULL, "unknown command '%s'", cmd);
}
