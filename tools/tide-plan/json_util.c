/* json_util.c - cJSON helpers for tide-plan: add fields, remember allocation failures. */
#include "tide-plan/cli.h"

#include <stdio.h>
#include <stdlib.h>

/* Set when any add failed; the document is then incomplete and must not be printed. */
static bool json_failed;

static cJSON *track(cJSON *item) {
    if (item == NULL) json_failed = true;
    return item;
}

/* Attach item to obj under name (or append to an array when name is NULL). */
static void attach(cJSON *obj, const char *name, cJSON *item) {
    if (obj == NULL || item == NULL) {
        json_failed = true;
        cJSON_Delete(item);
        return;
    }
    if (name == NULL ? !cJSON_AddItemToArray(obj, item) : !cJSON_AddItemToObject(obj, name, item)) {
        json_failed = true;
        cJSON_Delete(item);
    }
}

cJSON *cli_json_object(cJSON *parent, const char *name) {
    cJSON *o = track(cJSON_CreateObject());
    if (parent == NULL) return o;
    attach(parent, name, o);
    return o;
}

cJSON *cli_json_array(cJSON *parent, const char *name) {
    cJSON *a = track(cJSON_CreateArray());
    attach(parent, name, a);
    return a;
}

cJSON *cli_json_array_object(cJSON *array) {
    cJSON *o = track(cJSON_CreateObject());
    attach(array, NULL, o);
    return o;
}

void cli_json_int(cJSON *obj, const char *name, long long v) {
    attach(obj, name, track(cJSON_CreateNumber((double)v)));
}

void cli_json_u64(cJSON *obj, const char *name, uint64_t v) {
    attach(obj, name, track(cJSON_CreateNumber((double)v)));
}

void cli_json_double(cJSON *obj, const char *name, double v) {
    attach(obj, name, track(cJSON_CreateNumber(v)));
}

void cli_json_bool(cJSON *obj, const char *name, bool v) {
    attach(obj, name, track(cJSON_CreateBool(v)));
}

void cli_json_string(cJSON *obj, const char *name, const char *v) {
    attach(obj, name, track(v == NULL ? cJSON_CreateNull() : cJSON_CreateString(v)));
}

void cli_json_array_int(cJSON *array, long long v) {
    attach(array, NULL, track(cJSON_CreateNumber((double)v)));
}

int cli_json_print(const char *cmd, cJSON *root) {
    char *text = json_failed || root == NULL ? NULL : cJSON_Print(root);
    cJSON_Delete(root);
    if (text == NULL) {
        fprintf(stderr, "tide-plan %s: out of memory while building the JSON output\n", cmd);
        return CLI_EXIT_ERROR;
    }
    puts(text);
    cJSON_free(text);
    return CLI_EXIT_OK;
}
