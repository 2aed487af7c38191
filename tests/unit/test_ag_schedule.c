/* test_ag_schedule.c - TIDE-AG: Bruck rounds, stage slots, landing copy groups, descriptors. */
#include "test_util.h"

#include "core/checks.h"
#include "plan/plan.h"

static tide_topo_t make_topo(int nodes, int gpus_per_node) {
    tide_topo_t t = {
        .nodes = nodes, .gpus_per_node = gpus_per_node, .ranks = nodes * gpus_per_node};
    return t;
}

static int pos_mod(int a, int m) {
    return ((a % m) + m) % m;
}

/*
 * Brute-force Bruck on one rail: every node starts with its own shard and, each round, fetches
 * from the node `len` ahead the prefix of its list that it still misses (all lists have the
 * same length len before a round).  Appending in place is a faithful simultaneous round: the
 * prefix any node reads (< len entries) is never written during the round.
 */
static void check_bruck(int m) {
    tide_topo_t topo = make_topo(m, 1);
    tide_ag_schedule_t sched;
    assert_tide(TIDE_SUCCESS, tide_ag_schedule_build(&topo, &sched));
    assert_int_equal(sched.stage_slots, (uint64_t)(m - 1));

    int *list = malloc((size_t)m * (size_t)m * sizeof(int));
    int *seen = calloc((size_t)m, sizeof(int));
    assert_non_null(list);
    assert_non_null(seen);
    for (int n = 0; n < m; ++n)
        list[(size_t)n * m] = n;

    int len = 1, rounds = 0, received = 0;
    while (len < m) {
        int c = len < m - len ? len : m - len;
        assert_true(rounds < sched.num_rounds);
        const tide_ag_round_t *rd = &sched.rounds[rounds];
        assert_int_equal(rd->distance, len);
        assert_int_equal(rd->count, c);
        assert_int_equal(rd->first_slot, len);
        for (int n = 0; n < m; ++n) {
            const int *from = &list[(size_t)pos_mod(n + len, m) * m];
            memcpy(&list[(size_t)n * m + len], from, (size_t)c * sizeof(int));
        }
        /* The slots that arrived this round are [len, len + c) and hold nodes (n + i) mod M. */
        for (int n = 0; n < m; ++n)
            for (int i = len; i < len + c; ++i)
                assert_int_equal(list[(size_t)n * m + i], (n + i) % m);
        len += c;
        received += c;
        ++rounds;
    }
    assert_int_equal(sched.num_rounds, rounds);
    assert_int_equal(received, m - 1);
    /* R = ceil(log2 M): 2^(R-1) < M <= 2^R. */
    assert_true((1 << rounds) >= m);
    if (m > 1) assert_true((1 << (rounds - 1)) < m);
    /* Every node holds every shard exactly once. */
    for (int n = 0; n < m; ++n) {
        for (int i = 0; i < m; ++i)
            seen[i] = 0;
        for (int i = 0; i < m; ++i)
            seen[list[(size_t)n * m + i]]++;
        for (int i = 0; i < m; ++i)
            assert_int_equal(seen[i], 1);
    }
    free(seen);
    free(list);
    tide_ag_schedule_free(&sched);
}

static void test_bruck_all_m(void **state) {
    (void)state;
    for (int m = 1; m <= 1024; ++m)
        check_bruck(m);
    check_bruck(TIDE_MAX_NODES / 16); /* 4096: a larger power of two */
}

/* Figure 5a: M = 5 gathers in 3 rounds of 1, 2 and 1 slots. */
static void test_figure5_example(void **state) {
    (void)state;
    tide_topo_t topo = make_topo(5, 2);
    tide_ag_schedule_t sched;
    assert_tide(TIDE_SUCCESS, tide_ag_schedule_build(&topo, &sched));
    assert_int_equal(sched.num_rounds, 3);
    assert_int_equal(sched.stage_slots, 4);
    const int counts[3] = {1, 2, 1};
    for (int d = 0; d < 3; ++d) {
        assert_int_equal(sched.rounds[d].distance, 1 << d);
        assert_int_equal(sched.rounds[d].count, counts[d]);
        assert_int_equal(sched.rounds[d].first_slot, 1 << d);
    }
    /* Run the schedule's rounds on explicit lists and compare with the figure: node 0 holds
     * [0,1], [0,1,2,3], [0,1,2,3,4] after rounds 0, 1, 2; node 2 ends with [2,3,4,0,1]. */
    int list[5][5], len = 1;
    for (int n = 0; n < 5; ++n)
        list[n][0] = n;
    const int node0[3][5] = {{0, 1}, {0, 1, 2, 3}, {0, 1, 2, 3, 4}};
    const int after[3] = {2, 4, 5};
    for (int d = 0; d < 3; ++d) {
        int next[5][5];
        memcpy(next, list, sizeof(list));
        for (int n = 0; n < 5; ++n)
            for (int i = 0; i < sched.rounds[d].count; ++i)
                next[n][len + i] = list[(n + sched.rounds[d].distance) % 5][i];
        memcpy(list, next, sizeof(list));
        len += sched.rounds[d].count;
        assert_int_equal(len, after[d]);
        for (int i = 0; i < len; ++i)
            assert_int_equal(list[0][i], node0[d][i]);
    }
    const int node2[5] = {2, 3, 4, 0, 1};
    for (int i = 0; i < 5; ++i)
        assert_int_equal(list[2][i], node2[i]);
    /* Node 2 receives slot 3 (node 0) in round 1 together with slot 2 (node 4): a wrap. */
    tide_ag_group_t *g = NULL;
    int ng = 0;
    assert_tide(TIDE_SUCCESS, tide_ag_groups(&topo, &sched, 2, &g, &ng));
    assert_int_equal(ng, 4);
    const int first[4] = {1, 2, 3, 4}, rnd[4] = {0, 1, 1, 2};
    for (int i = 0; i < 4; ++i) {
        assert_int_equal(g[i].first_slot, first[i]);
        assert_int_equal(g[i].num_slots, 1);
        assert_int_equal(g[i].round, rnd[i]);
        assert_false(g[i].strided);
    }
    free(g);
    tide_ag_schedule_free(&sched);
}

/* Round containing stage slot i, found by scanning the schedule's slot ranges. */
static int round_of_slot(const tide_ag_schedule_t *s, int slot) {
    for (int d = 0; d < s->num_rounds; ++d)
        if (slot >= s->rounds[d].first_slot && slot < s->rounds[d].first_slot + s->rounds[d].count)
            return d;
    return -1;
}

/* Groups a run of len slots splits into, at most limit, each keeping >= 4 slots when split. */
static int parts_of(int len, int limit) {
    int k = len / 4;
    if (k > limit) k = limit;
    return k > 0 ? k : 1;
}

static void test_groups(void **state) {
    (void)state;
    for (int m = 1; m <= 300; ++m) {
        tide_topo_t topo = make_topo(m, 4);
        tide_ag_schedule_t sched;
        assert_tide(TIDE_SUCCESS, tide_ag_schedule_build(&topo, &sched));
        int last = sched.num_rounds - 1;
        for (int n = 0; n < m; ++n) {
            tide_ag_group_t *g = NULL;
            int ng = -1;
            assert_tide(TIDE_SUCCESS, tide_ag_groups(&topo, &sched, n, &g, &ng));
            int next = 1;
            int per_round[32] = {0};
            for (int k = 0; k < ng; ++k) {
                assert_true(g[k].num_slots >= 1);
                /* Arrival order: the groups continue each other slot by slot. */
                assert_int_equal(g[k].first_slot, next);
                for (int i = 0; i < g[k].num_slots; ++i)
                    assert_int_equal(round_of_slot(&sched, next + i), g[k].round);
                /* No wrap: source nodes strictly consecutive, never M-1 -> 0. */
                for (int i = 1; i < g[k].num_slots; ++i)
                    assert_int_equal((n + next + i) % m, (n + next + i - 1) % m + 1);
                assert_int_equal(g[k].strided, g[k].num_slots >= 4);
                per_round[g[k].round]++;
                next += g[k].num_slots;
            }
            assert_int_equal(next, m); /* slots 1..M-1, each once */
            for (int d = 0; d < sched.num_rounds; ++d) {
                int first = sched.rounds[d].first_slot, cnt = sched.rounds[d].count;
                int wrap = m - n;
                bool wraps = first < wrap && wrap < first + cnt;
                if (d != last) {
                    /* Split only at the wrap point. */
                    assert_int_equal(per_round[d], wraps ? 2 : 1);
                } else {
                    assert_true(per_round[d] <= 4);
                    /* Pipelining: as many groups as the limit allows while every part of a
                     * split run keeps >= 4 slots (stays one strided copy per parameter). */
                    int a = wraps ? wrap - first : cnt, b = wraps ? first + cnt - wrap : 0;
                    int want = wraps ? parts_of(a, 2) + (b > 0 ? parts_of(b, 2) : 0)
                                     : parts_of(cnt, 4);
                    assert_int_equal(per_round[d], want);
                }
            }
            /* Near-equal: in the last round, groups of one run differ by at most one slot. */
            for (int k = 1; k < ng; ++k) {
                if (g[k].round != last || g[k - 1].round != last) continue;
                bool same_run = (n + g[k].first_slot) % m != 0;
                if (!same_run) continue;
                int diff = g[k - 1].num_slots - g[k].num_slots;
                assert_true(diff >= -1 && diff <= 1);
            }
            free(g);
        }
        tide_ag_schedule_free(&sched);
    }
}

/* Small random geometry: P params of 1..13 bytes each, packed. */
static tide_geom_param_t *random_params(int num_params, uint64_t *shard_bytes, unsigned *seed) {
    tide_geom_param_t *p = calloc((size_t)num_params, sizeof(*p));
    assert_non_null(p);
    uint64_t off = 0;
    for (int i = 0; i < num_params; ++i) {
        *seed = *seed * 1103515245u + 12345u;
        p[i].shard_bytes = 1 + (*seed >> 16) % 13;
        p[i].offset = off;
        off += p[i].shard_bytes;
    }
    *shard_bytes = off;
    return p;
}

static void test_landing_coverage(void **state) {
    (void)state;
    const int ms[] = {1, 2, 3, 5, 8, 9, 17};
    const int ls[] = {1, 2, 4, 8};
    unsigned seed = 12345u;
    for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); ++mi) {
        for (size_t li = 0; li < sizeof(ls) / sizeof(ls[0]); ++li) {
            int m = ms[mi], L = ls[li], N = m * L;
            int P = 1 + (int)(mi + li) % 4;
            uint64_t S = 0;
            tide_geom_param_t *par = random_params(P, &S, &seed);
            tide_geom_t geom = {.num_params = P,
                                .ranks = N,
                                .params = par,
                                .shard_bytes = S,
                                .group_bytes = (uint64_t)N * S};
            tide_topo_t topo = make_topo(m, L);
            tide_ag_schedule_t sched;
            assert_tide(TIDE_SUCCESS, tide_ag_schedule_build(&topo, &sched));
            unsigned char *hits = malloc((size_t)N * S);
            assert_non_null(hits);
            for (int n = 0; n < m; ++n) {
                memset(hits, 0, (size_t)N * S);
                tide_ag_group_t *g = NULL;
                int ng = 0;
                assert_tide(TIDE_SUCCESS, tide_ag_groups(&topo, &sched, n, &g, &ng));
                for (int l = 0; l < L; ++l) {
                    /* Own shard of local rank (n, l). */
                    int own = n * L + l;
                    for (int p = 0; p < P; ++p) {
                        uint64_t dst =
                            par[p].offset * (uint64_t)N + (uint64_t)own * par[p].shard_bytes;
                        for (uint64_t b = 0; b < par[p].shard_bytes; ++b)
                            hits[dst + b]++;
                    }
                    /* Stage slots of rail l, group by group. */
                    for (int k = 0; k < ng; ++k) {
                        for (int p = 0; p < P; ++p) {
                            uint64_t prev_dst = 0, prev_src = 0;
                            for (int i = 0; i < g[k].num_slots; ++i) {
                                int slot = g[k].first_slot + i;
                                int rank = ((n + slot) % m) * L + l;
                                uint64_t dst = par[p].offset * (uint64_t)N +
                                               (uint64_t)rank * par[p].shard_bytes;
                                uint64_t src = (uint64_t)(slot - 1) * S + par[p].offset;
                                assert_int_equal(dst, tide_geom_landing(&geom, p, rank));
                                if (g[k].strided && i > 0) {
                                    assert_int_equal(dst - prev_dst,
                                                     (uint64_t)L * par[p].shard_bytes);
                                    assert_int_equal(src - prev_src, S);
                                }
                                prev_dst = dst;
                                prev_src = src;
                                for (uint64_t b = 0; b < par[p].shard_bytes; ++b)
                                    hits[dst + b]++;
                            }
                        }
                    }
                }
                for (uint64_t b = 0; b < (uint64_t)N * S; ++b)
                    assert_int_equal(hits[b], 1);
                free(g);
            }
            free(hits);
            tide_ag_schedule_free(&sched);
            free(par);
        }
    }
}

/*
 * Brute-force descriptor count of node n: expand each group into its per-(param, slot) copies
 * (src in the stage, dst in the landing of rail 0), and merge a group's copies of one parameter
 * into one 2D copy only when there are at least 4 and their pitches are really constant.
 */
static uint64_t brute_descriptors(const tide_topo_t *topo, const tide_ag_schedule_t *sched,
                                  const tide_geom_param_t *par, int P, uint64_t S, int n) {
    int m = topo->nodes, L = topo->gpus_per_node, N = m * L;
    tide_ag_group_t *g = NULL;
    int ng = 0;
    assert_tide(TIDE_SUCCESS, tide_ag_groups(topo, sched, n, &g, &ng));
    uint64_t *dst = malloc((size_t)m * sizeof(uint64_t));
    uint64_t *src = malloc((size_t)m * sizeof(uint64_t));
    assert_non_null(dst);
    assert_non_null(src);
    uint64_t total = (uint64_t)P; /* own shard: one copy per parameter */
    for (int k = 0; k < ng; ++k) {
        int cnt = g[k].num_slots;
        for (int p = 0; p < P; ++p) {
            for (int i = 0; i < cnt; ++i) {
                int slot = g[k].first_slot + i;
                int rank = ((n + slot) % m) * L;
                dst[i] = par[p].offset * (uint64_t)N + (uint64_t)rank * par[p].shard_bytes;
                src[i] = (uint64_t)(slot - 1) * S + par[p].offset;
            }
            bool constant = true;
            for (int i = 2; i < cnt; ++i)
                if (dst[i] - dst[i - 1] != dst[1] - dst[0] ||
                    src[i] - src[i - 1] != src[1] - src[0])
                    constant = false;
            total += (constant && cnt >= 4) ? 1 : (uint64_t)cnt;
        }
    }
    free(src);
    free(dst);
    free(g);
    return total;
}

static void test_descriptor_counts(void **state) {
    (void)state;
    const int P = 30;
    unsigned seed = 777u;
    uint64_t S = 0;
    tide_geom_param_t *par = random_params(P, &S, &seed);
    const int ms[] = {1, 2, 7, 64, 100, 1000, 1024};
    for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); ++mi) {
        int m = ms[mi];
        for (int L = 1; L <= 8; L *= 2) {
            tide_topo_t topo = make_topo(m, L);
            tide_ag_schedule_t sched;
            assert_tide(TIDE_SUCCESS, tide_ag_schedule_build(&topo, &sched));
            uint64_t worst = 0;
            for (int n = 0; n < m; ++n) {
                uint64_t mc = 0, uc = 0;
                assert_tide(TIDE_SUCCESS, tide_ag_descriptors(&topo, &sched, P, n, 1, &mc));
                assert_tide(TIDE_SUCCESS, tide_ag_descriptors(&topo, &sched, P, n, 0, &uc));
                assert_int_equal(uc, (uint64_t)L * mc);
                assert_int_equal(mc, brute_descriptors(&topo, &sched, par, P, S, n));
                /* O(P log M): a few copies per parameter and round. */
                assert_true(mc <= (uint64_t)P * (uint64_t)(6 * sched.num_rounds + 10));
                if (mc > worst) worst = mc;
            }
            if (m == 1024) {
                /* A flat scatter costs M P copies; the strided one stays far below. */
                assert_true(worst * 10 <= (uint64_t)m * P);
            }
            if (m == 1) assert_int_equal(worst, (uint64_t)P);
            tide_ag_schedule_free(&sched);
        }
    }
    free(par);
}

static void test_bad_input(void **state) {
    (void)state;
    tide_topo_t topo = make_topo(6, 2);
    tide_ag_schedule_t sched = {.num_rounds = 77};
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_schedule_build(NULL, &sched));
    assert_int_equal(sched.num_rounds, 77); /* outputs untouched on failure */
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_schedule_build(&topo, NULL));
    tide_topo_t bad = make_topo(0, 2);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_schedule_build(&bad, &sched));
    bad = make_topo(4, 0);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_schedule_build(&bad, &sched));
    assert_int_equal(sched.num_rounds, 77);

    assert_tide(TIDE_SUCCESS, tide_ag_schedule_build(&topo, &sched));
    tide_ag_group_t *g = (tide_ag_group_t *)&topo;
    int ng = -5;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_groups(NULL, &sched, 0, &g, &ng));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_groups(&topo, NULL, 0, &g, &ng));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_groups(&topo, &sched, -1, &g, &ng));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_groups(&topo, &sched, 6, &g, &ng));
    assert_non_null(strstr(tide_get_last_error(), "node"));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_groups(&topo, &sched, 0, NULL, &ng));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_groups(&topo, &sched, 0, &g, NULL));
    /* A schedule built for another M is refused rather than misread. */
    tide_topo_t other = make_topo(9, 2);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_groups(&other, &sched, 0, &g, &ng));
    assert_ptr_equal(g, (tide_ag_group_t *)&topo);
    assert_int_equal(ng, -5);

    uint64_t count = 99;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_descriptors(NULL, &sched, 4, 0, 1, &count));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_descriptors(&topo, NULL, 4, 0, 1, &count));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_descriptors(&topo, &sched, 0, 0, 1, &count));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_descriptors(&topo, &sched, 257, 0, 1, &count));
    assert_non_null(strstr(tide_get_last_error(), "num_params"));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_descriptors(&topo, &sched, 4, 6, 1, &count));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_descriptors(&topo, &sched, 4, -1, 1, &count));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_descriptors(&topo, &sched, 4, 0, 1, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_descriptors(&other, &sched, 4, 0, 1, &count));
    assert_int_equal(count, 99);
    assert_tide(TIDE_SUCCESS, tide_ag_descriptors(&topo, &sched, 256, 5, 1, &count));

    /* M = 1: no rounds, no stage, no groups. */
    tide_ag_schedule_free(&sched);
    tide_ag_schedule_free(&sched); /* idempotent */
    tide_ag_schedule_free(NULL);
    tide_topo_t one = make_topo(1, 8);
    assert_tide(TIDE_SUCCESS, tide_ag_schedule_build(&one, &sched));
    assert_int_equal(sched.num_rounds, 0);
    assert_int_equal(sched.stage_slots, 0);
    assert_tide(TIDE_SUCCESS, tide_ag_groups(&one, &sched, 0, &g, &ng));
    assert_int_equal(ng, 0);
    free(g);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_ag_groups(&one, &sched, 1, &g, &ng));
    tide_ag_schedule_free(&sched);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bruck_all_m),
        cmocka_unit_test(test_figure5_example),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_landing_coverage),
        cmocka_unit_test(test_descriptor_counts),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
