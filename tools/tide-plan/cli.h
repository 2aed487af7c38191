/*
 * cli.h - shared pieces of the tide-plan commands: exit codes, argument parsing, error
 * reporting and JSON output.
 *
 * Exit codes: 0 success, 1 a library call failed (its last error is printed), 2 the command
 * line is malformed (a one-line reason and the usage are printed).
 */
#ifndef TIDE_PLAN_CLI_H_
#define TIDE_PLAN_CLI_H_

#include "tide.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#define CLI_EXIT_OK 0
#define CLI_EXIT_ERROR 1
#define CLI_EXIT_USAGE 2

/* Commands: argv[0] is the command name, options follow. */
int cli_cmd_show(int argc, char **argv);
int cli_cmd_validate(int argc, char **argv);
int cli_cmd_memory(int argc, char **argv);
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

/* Strict parsers: the whole string must be consumed; false on garbage or overflow. */
bool cli_parse_int(const char *s, int *out);
bool cli_parse_double(const char *s, double *out);
/* Bytes with an optional binary suffix: K, M, G, T, KiB, MiB, GiB, TiB (case-insensitive). */
bool cli_parse_bytes(const char *s, uint64_t *out);
bool cli_parse_dtype(const char *s, tide_dtype_t *out);
bool cli_parse_mode(const char *s, tide_rs_mode_t *out);
const char *cli_dtype_name(tide_dtype_t dtype);
const char *cli_mode_name(tide_rs_mode_t mode);

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
