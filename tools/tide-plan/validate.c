/*
 * validate.c - `tide-plan validate`: the exhaustive planner validation of App. D.
 *
 * For every (M, W_wave) with M in [2, Mmax] and W_wave in [1, L], every plan (k in {1, 2, 4},
 * both RS modes, n_part in [1, 4]) is simulated by tide_validate_schedule.  The verdicts are
 * then checked against a brute-force scan that uses only the Latin-square maps of plan.h:
 *
 *   - a pair is collision-free iff no wave holds two contributors c0 != c1 with
 *     j(s, c0) == j(s, c1) for some sub-slice s;
 *   - every accepted plan must come from a collision-free pair and report simulated landings;
 *   - every rejected plan must name a real collision: c0 != c1 in one wave, same s, same GPU.
 *
 * `verified` is true only if all of that holds, so a bug in either the simulator or the
 * schedule builder shows up as a failed run rather than as a silently accepted plan.
 */
#include "tide-plan/cli.h"

#include "plan/plan.h"

#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CMD "validate"

static const int round_widths[] = {1, 2, 4};
#define NUM_ROUND_WIDTHS 3
#define PLANS_PER_PAIR (NUM_ROUND_WIDTHS * TIDE_RS_MODE_COUNT * TIDE_MAX_PASSES)

typedef struct {
    long long accepted, rejected; /* plans */
    long long accepted_pairs, rejected_pairs;
    bool verified;
    int fail_m, fail_w;      /* the smallest failing (M, W_wave), for order */
    char first_failure[256]; /* why verified is false */
    tide_result_t lib_error; /* a failing tide_validate_schedule call */
    char lib_message[512];
} validate_result_t;

/* Work shared by the threads: each takes every jobs-th M, so M's O(M) costs spread evenly. */
typedef struct {
    int l, mmax, jobs;
    bool *pair_accepted; /* (M - 2) L + (W - 1) */
    atomic_bool stop;    /* a library error: every thread stops */
} validate_work_t;

typedef struct {
    validate_work_t *work;
    int first_m;
    validate_result_t result;
} validate_thread_t;

static void fail(validate_result_t *r, int m, int w, const char *why, int k, int mode, int n) {
    /* Keep the smallest (M, W_wave): the report does not depend on the thread count. */
    if (!r->verified && (m > r->fail_m || (m == r->fail_m && w >= r->fail_w))) return;
    r->verified = false;
    r->fail_m = m;
    r->fail_w = w;
    snprintf(r->first_failure, sizeof(r->first_failure),
             "M = %d, W_wave = %d, k = %d, mode = %s, n_part = %d: %s", m, w, k,
             cli_mode_name((tide_rs_mode_t)mode), n, why);
}

/* Brute force: does some wave map two contributors to one destination GPU? */
static bool pair_collides(int m, int l, int w) {
    for (int first = 1; first <= m; first += w) {
        int last = first + w - 1 < m ? first + w - 1 : m;
        for (int s = 0; s < l; ++s) {
            unsigned seen = 0;
            for (int c = first; c <= last; ++c) {
                unsigned bit = 1u << tide_rs_dest_gpu(m, l, s, c);
                if (seen & bit) return true;
                seen |= bit;
            }
        }
    }
    return false;
}

/* A rejection must name two distinct contributors of one wave that share (s, j). */
static bool collision_is_real(int m, int l, int w, const tide_validation_t *v) {
    int c0 = v->contributor0, c1 = v->contributor1, s = v->subslice;
    if (c0 < 1 || c0 > m || c1 < 1 || c1 > m || c0 == c1 || s < 0 || s >= l) return false;
    int wave = (c0 - 1) / w;
    int waves_per_pass = (m + w - 1) / w;
    if ((c1 - 1) / w != wave) return false;
    /* The report may count waves over all passes; the pass-local index must agree. */
    if (v->wave < 0 || v->wave % waves_per_pass != wave) return false;
    int j0 = tide_rs_dest_gpu(m, l, s, c0), j1 = tide_rs_dest_gpu(m, l, s, c1);
    return j0 == j1 && j0 == v->gpu;
}

static bool validate_pair(int m, int l, int w, bool *pair_accepted, validate_result_t *r) {
    bool collides = pair_collides(m, l, w);
    bool all_accepted = true;
    for (int ki = 0; ki < NUM_ROUND_WIDTHS; ++ki)
        for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode)
            for (int n = 1; n <= TIDE_MAX_PASSES; ++n) {
                int k = round_widths[ki];
                tide_validation_t v;
                tide_result_t res = tide_validate_schedule(m, l, w, k, (tide_rs_mode_t)mode, n, &v);
                if (res != TIDE_SUCCESS) {
                    r->lib_error = res;
                    snprintf(r->lib_message, sizeof(r->lib_message),
                             "M = %d, W_wave = %d, k = %d, n_part = %d: %s", m, w, k, n,
                             tide_get_last_error());
                    return false;
                }
                if (v.accepted) {
                    ++r->accepted;
                    if (collides)
                        fail(r, m, w, "accepted, but a wave collides", k, mode, n);
                    else if (v.blocks_checked == 0)
                        fail(r, m, w, "accepted without simulating any landing", k, mode, n);
                } else {
                    ++r->rejected;
                    all_accepted = false;
                    if (!collision_is_real(m, l, w, &v))
                        fail(r, m, w, "rejected, but the reported collision does not exist", k,
                             mode, n);
                }
            }
    pair_accepted[(size_t)(m - 2) * (size_t)l + (size_t)(w - 1)] = all_accepted;
    if (all_accepted)
        ++r->accepted_pairs;
    else
        ++r->rejected_pairs;
    return true;
}

static void *validate_thread(void *arg) {
    validate_thread_t *t = arg;
    validate_work_t *wk = t->work;
    for (int m = t->first_m; m <= wk->mmax; m += wk->jobs)
        for (int w = 1; w <= wk->l; ++w) {
            if (atomic_load(&wk->stop)) return NULL;
            if (!validate_pair(m, wk->l, w, wk->pair_accepted, &t->result)) {
                atomic_store(&wk->stop, true);
                return NULL;
            }
        }
    return NULL;
}

/* Run the threads and merge their counts into *out; false on a library error (reported). */
static bool run_threads(validate_work_t *wk, validate_result_t *out) {
    validate_thread_t *threads = calloc((size_t)wk->jobs, sizeof(*threads));
    pthread_t *ids = calloc((size_t)wk->jobs, sizeof(*ids));
    bool ok = threads != NULL && ids != NULL;
    int started = 0;
    for (int i = 0; ok && i < wk->jobs; ++i) {
        threads[i].work = wk;
        threads[i].first_m = 2 + i;
        threads[i].result.verified = true;
        /* Thread 0 runs on the calling thread, so one job needs no thread at all. */
        if (i > 0 && pthread_create(&ids[i], NULL, validate_thread, &threads[i]) != 0) {
            atomic_store(&wk->stop, true);
            ok = false;
            break;
        }
        started = i + 1;
    }
    if (ok) validate_thread(&threads[0]);
    for (int i = 1; i < started; ++i)
        pthread_join(ids[i], NULL);
    if (!ok) {
        fprintf(stderr, "tide-plan " CMD ": cannot start %d threads\n", wk->jobs);
        free(threads);
        free(ids);
        return false;
    }
    memset(out, 0, sizeof(*out));
    out->verified = true;
    for (int i = 0; i < wk->jobs; ++i) {
        const validate_result_t *r = &threads[i].result;
        if (r->lib_error != TIDE_SUCCESS) {
            fprintf(stderr, "tide-plan " CMD ": tide_validate_schedule: %s: %s\n",
                    tide_get_error_string(r->lib_error), r->lib_message);
            ok = false;
            break;
        }
        out->accepted += r->accepted;
        out->rejected += r->rejected;
        out->accepted_pairs += r->accepted_pairs;
        out->rejected_pairs += r->rejected_pairs;
        if (!r->verified && (out->verified || r->fail_m < out->fail_m ||
                             (r->fail_m == out->fail_m && r->fail_w < out->fail_w))) {
            out->verified = false;
            out->fail_m = r->fail_m;
            out->fail_w = r->fail_w;
            memcpy(out->first_failure, r->first_failure, sizeof(out->first_failure));
        }
    }
    free(threads);
    free(ids);
    return ok;
}

static int print_json(int l, int mmax, const bool *pair_accepted, const validate_result_t *r,
                      const cli_programs_result_t *pr) {
    cJSON *root = cli_json_object(NULL, NULL);
    if (pr != NULL) {
        cJSON *o = cli_json_object(root, "programs");
        cli_json_int(o, "checked", pr->checked);
        cli_json_int(o, "failed", pr->failed);
        cli_json_string(o, "first_failure", pr->failed ? pr->first_failure : NULL);
    }
    cli_json_int(root, "gpus_per_node", l);
    cli_json_int(root, "max_nodes", mmax);
    cli_json_int(root, "accepted", r->accepted);
    cli_json_int(root, "rejected", r->rejected);
    cli_json_int(root, "accepted_pairs", r->accepted_pairs);
    cli_json_int(root, "rejected_pairs", r->rejected_pairs);
    cli_json_bool(root, "verified", r->verified);
    cJSON *pairs = cli_json_array(root, "pairs");
    for (int m = 2; m <= mmax; ++m)
        for (int w = 1; w <= l; ++w) {
            cJSON *o = cli_json_array_object(pairs);
            cli_json_int(o, "nodes", m);
            cli_json_int(o, "wave_width", w);
            cli_json_bool(o, "accepted", pair_accepted[(size_t)(m - 2) * l + (w - 1)]);
        }
    return cli_json_print(CMD, root);
}

static void print_text(int l, int mmax, const bool *pair_accepted, const validate_result_t *r,
                       int jobs, double seconds, const cli_programs_result_t *pr) {
    printf("TIDE-RS schedule validation: L = %d, M in [2, %d], W_wave in [1, %d], k in {1, 2, 4}, "
           "both modes, n_part in [1, %d]\n",
           l, mmax, l, TIDE_MAX_PASSES);
    printf("  plans: %lld accepted, %lld rejected; (M, W_wave) pairs: %lld accepted, %lld "
           "rejected\n",
           r->accepted, r->rejected, r->accepted_pairs, r->rejected_pairs);
    printf("  %7s %15s %15s %16s\n", "W_wave", "accepted pairs", "rejected pairs",
           "first rejected M");
    for (int w = 1; w <= l; ++w) {
        int acc = 0, rej = 0, first = 0;
        for (int m = 2; m <= mmax; ++m) {
            if (pair_accepted[(size_t)(m - 2) * l + (w - 1)])
                ++acc;
            else {
                ++rej;
                if (first == 0) first = m;
            }
        }
        if (first)
            printf("  %7d %15d %15d %16d\n", w, acc, rej, first);
        else
            printf("  %7d %15d %15d %16s\n", w, acc, rej, "-");
    }
    if (pr != NULL)
        printf("  programs (static checker, M in [1, %d], 3 calls): %lld checked, %lld failed\n",
               mmax, pr->checked, pr->failed);
    printf("  verified: %s (%.2f s, %d threads)\n", r->verified ? "yes" : "NO", seconds, jobs);
    if (!r->verified) printf("  first failure: %s\n", r->first_failure);
}

enum { OPT_GPUS = 256, OPT_MAX_NODES, OPT_JOBS, OPT_PROGRAMS, OPT_JSON, OPT_HELP };

static const struct option long_options[] = {
    {"gpus-per-node", required_argument, NULL, OPT_GPUS},
    {"max-nodes", required_argument, NULL, OPT_MAX_NODES},
    {"jobs", required_argument, NULL, OPT_JOBS},
    {"programs", no_argument, NULL, OPT_PROGRAMS},
    {"json", no_argument, NULL, OPT_JSON},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

#define VALIDATE_MAX_JOBS 64

static int default_jobs(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > VALIDATE_MAX_JOBS ? VALIDATE_MAX_JOBS : (int)n);
}

int cli_cmd_validate(int argc, char **argv) {
    int l = 0, mmax = 0, jobs = 0;
    bool have_l = false, have_m = false, json = false, programs = false;
    opterr = 0;
    int c, li = -1, rc;
    while ((c = getopt_long(argc, argv, ":", long_options, &li)) != -1) {
        int *target;
        switch (c) {
        case OPT_GPUS:
            target = &l;
            have_l = true;
            break;
        case OPT_MAX_NODES:
            target = &mmax;
            have_m = true;
            break;
        case OPT_JOBS:
            target = &jobs;
            break;
        case OPT_JSON:
            json = true;
            continue;
        case OPT_PROGRAMS:
            programs = true;
            continue;
        case OPT_HELP:
            cli_usage(CMD, false);
            return CLI_EXIT_OK;
        default:
            return cli_bad_option(CMD, c, argv);
        }
        rc = cli_int_option(CMD, long_options[li].name, optarg, target);
        if (rc >= 0) return rc;
    }
    rc = cli_no_operands(CMD, argc, argv);
    if (rc >= 0) return rc;
    if (!have_l) return cli_usage_error(CMD, "--gpus-per-node is required");
    if (!have_m) return cli_usage_error(CMD, "--max-nodes is required");
    if (l < 1 || l > TIDE_MAX_GPUS_PER_NODE)
        return cli_usage_error(CMD, "--gpus-per-node %d outside [1, %d]", l,
                               TIDE_MAX_GPUS_PER_NODE);
    if (mmax < 2 || mmax > TIDE_MAX_NODES)
        return cli_usage_error(CMD, "--max-nodes %d outside [2, %d]", mmax, TIDE_MAX_NODES);
    if (jobs < 0 || jobs > VALIDATE_MAX_JOBS)
        return cli_usage_error(CMD, "--jobs %d outside [1, %d] (0 = one per CPU)", jobs,
                               VALIDATE_MAX_JOBS);
    if (programs && (int64_t)mmax * l > CLI_PROGRAMS_MAX_RANKS)
        return cli_usage_error(CMD, "--programs checks up to N = M L = %d ranks; --max-nodes %d x "
                                    "--gpus-per-node %d is %lld",
                               CLI_PROGRAMS_MAX_RANKS, mmax, l, (long long)mmax * l);
    if (jobs == 0) jobs = default_jobs();
    if (jobs > mmax - 1) jobs = mmax - 1;

    validate_work_t work = {.l = l, .mmax = mmax, .jobs = jobs};
    atomic_init(&work.stop, false);
    work.pair_accepted = calloc((size_t)(mmax - 1) * (size_t)l, sizeof(bool));
    if (work.pair_accepted == NULL) {
        fprintf(stderr, "tide-plan " CMD ": out of memory\n");
        return CLI_EXIT_ERROR;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    validate_result_t r;
    cli_programs_result_t pr = {0};
    rc = run_threads(&work, &r) ? CLI_EXIT_OK : CLI_EXIT_ERROR;
    if (rc == CLI_EXIT_OK && programs) {
        if (!cli_validate_programs(l, mmax, &pr)) rc = CLI_EXIT_ERROR;
        if (pr.failed > 0 && r.verified) {
            r.verified = false;
            snprintf(r.first_failure, sizeof(r.first_failure), "program check: %.200s",
                     pr.first_failure);
        }
        if (rc != CLI_EXIT_OK) fprintf(stderr, "tide-plan " CMD ": %s\n", pr.first_failure);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == CLI_EXIT_OK) {
        double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (json)
            rc = print_json(l, mmax, work.pair_accepted, &r, programs ? &pr : NULL);
        else
            print_text(l, mmax, work.pair_accepted, &r, jobs, seconds, programs ? &pr : NULL);
        if (rc == CLI_EXIT_OK && !r.verified) {
            fprintf(stderr, "tide-plan " CMD ": verification failed: %s\n", r.first_failure);
            rc = CLI_EXIT_ERROR;
        }
    }
    free(work.pair_accepted);
    return rc;
}
