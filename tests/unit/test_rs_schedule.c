/* test_rs_schedule.c - TIDE-RS schedule: Latin-square placement, waves, rounds, zero masks,
 * outbox depth, sub-slices and Level-1 descriptor counts, each against a brute-force
 * definition. */
#include "test_util.h"

#include "core/checks.h"
#include "plan/plan.h"

#include <stdbool.h>

static tide_topo_t topo_of(int M, int L) {
    tide_topo_t t;
    assert_tide(TIDE_SUCCESS, tide_topo_init(M, L, &t));
    return t;
}

static tide_result_t build(int M, int L, int W_wave, int k, tide_rs_mode_t mode, int passes,
                           tide_rs_schedule_t *s) {
    tide_topo_t t = topo_of(M, L);
    return tide_rs_schedule_build(&t, NULL, W_wave, k, mode, passes, 2, s);
}

/* c̄ of eq. 6 written out: (m - n) mod M, 0 for the own node. */
static int cbar(int M, int m, int n) {
    return ((m - n) % M + M) % M;
}

/* Pairwise definition of a collision: two contributors of one wave on one GPU for some s. */
static bool collides_brute(int M, int L, int W_wave) {
    for (int first = 1; first <= M; first += W_wave) {
        int last = first + W_wave - 1 < M ? first + W_wave - 1 : M;
        for (int c0 = first; c0 <= last; ++c0)
            for (int c1 = c0 + 1; c1 <= last; ++c1)
                for (int s = 0; s < L; ++s)
                    if (tide_rs_dest_gpu(M, L, s, c0) == tide_rs_dest_gpu(M, L, s, c1)) return true;
    }
    return false;
}

/* Every sender's partial for destination t travels on its own rail j: eq. 7 (sender side) and
 * eq. 8 (receiver side) agree, and the L ranks of a sender fill L distinct sub-slices. */
static void test_rail_alignment_bruteforce(void **state) {
    (void)state;
    for (int M = 1; M <= 40; ++M) {
        for (int L = 1; L <= TIDE_MAX_GPUS_PER_NODE; ++L) {
            for (int n = 0; n < M; ++n) {
                for (int c = 1; c <= M; ++c) {
                    int t = c == M ? n : (n + c) % M; /* step c targets t; c = M: own node */
                    assert_int_equal(tide_rs_contributor(M, t, n), c);
                    int filled = 0;
                    for (int j = 0; j < L; ++j) {
                        int s = tide_rs_subslice(M, L, j, c);
                        assert_int_equal(s, (j + cbar(M, t, n)) % L);
                        /* the block lands on local rank j of node t: the sender's rail */
                        assert_int_equal(tide_rs_dest_gpu(M, L, s, c), j);
                        filled |= 1 << s;
                    }
                    assert_int_equal(filled, (1 << L) - 1);
                }
            }
        }
    }
}

/* For every destination node m of accepted schedules: within a wave no inbox block (s, j) is
 * written twice, and over a pass every (s) receives all M contributors. */
static void test_waves_collision_free_all_nodes(void **state) {
    (void)state;
    for (int M = 1; M <= 40; ++M) {
        for (int L = 1; L <= TIDE_MAX_GPUS_PER_NODE; ++L) {
            for (int W_wave = 1; W_wave <= L; ++W_wave) {
                tide_rs_schedule_t s;
                tide_result_t r = build(M, L, W_wave, 2, TIDE_RS_IN_PLACE, 1, &s);
                assert_int_equal(r == TIDE_SUCCESS, !collides_brute(M, L, W_wave));
                if (r != TIDE_SUCCESS) continue;
                for (int m = 0; m < M; ++m) {
                    int per_s[TIDE_MAX_GPUS_PER_NODE] = {0};
                    for (int g = 0; g < s.num_waves; ++g) {
                        uint8_t hit[TIDE_MAX_GPUS_PER_NODE][TIDE_MAX_GPUS_PER_NODE] = {{0}};
                        for (int n = 0; n < M; ++n) {
                            int c = tide_rs_contributor(M, m, n);
                            if (c < s.waves[g].first || c >= s.waves[g].first + s.waves[g].count)
                                continue;
                            for (int j = 0; j < L; ++j) {
                                int sub = (j + cbar(M, m, n)) % L;
                                assert_int_equal(hit[sub][j], 0);
                                hit[sub][j] = 1;
                                per_s[sub]++;
                            }
                        }
                    }
                    for (int sub = 0; sub < L; ++sub)
                        assert_int_equal(per_s[sub], M);
                }
                tide_rs_schedule_free(&s);
            }
        }
    }
}

/* Proposition 4.1: W_wave dividing L never collides, for all M in [2, 1024]. */
static void test_latin_square_divisors(void **state) {
    (void)state;
    const int Ls[] = {4, 8};
    for (int li = 0; li < 2; ++li) {
        int L = Ls[li];
        for (int W_wave = 1; W_wave <= L; ++W_wave) {
            if (L % W_wave != 0) continue;
            for (int M = 2; M <= 1024; ++M) {
                tide_validation_t rep;
                assert_false(tide_rs_find_collision(M, L, W_wave, &rep));
                tide_rs_schedule_t s;
                assert_tide(TIDE_SUCCESS, build(M, L, W_wave, 4, TIDE_RS_SLOT_REUSE, 1, &s));
                tide_rs_schedule_free(&s);
            }
        }
    }
}

/* The fast scan agrees with the pairwise definition; at L = 8, M in [2, 1024] exactly one
 * (M, W_wave) pair in eight collides (1023 of 8184, App. D's 65,472 rejected plans / 64). */
static void test_find_collision_vs_bruteforce(void **state) {
    (void)state;
    for (int M = 1; M <= 64; ++M)
        for (int L = 1; L <= TIDE_MAX_GPUS_PER_NODE; ++L)
            for (int W_wave = 1; W_wave <= L; ++W_wave)
                assert_int_equal(tide_rs_find_collision(M, L, W_wave, NULL),
                                 collides_brute(M, L, W_wave));
    int colliding = 0;
    for (int M = 2; M <= 1024; ++M)
        for (int W_wave = 1; W_wave <= 8; ++W_wave) {
            tide_validation_t rep;
            if (!tide_rs_find_collision(M, 8, W_wave, &rep)) continue;
            ++colliding;
            assert_int_equal(rep.accepted, 0);
            /* the two contributors share c̄ mod 8 and the reported GPU is eq. 8's */
            assert_int_equal((rep.contributor0 % M) % 8, (rep.contributor1 % M) % 8);
            assert_int_equal(rep.gpu, tide_rs_dest_gpu(M, 8, rep.subslice, rep.contributor0));
            assert_int_equal((rep.contributor0 - 1) / W_wave, rep.wave);
            assert_int_equal((rep.contributor1 - 1) / W_wave, rep.wave);
        }
    assert_int_equal(colliding, 1023);
}

/* App. D: M = 9, L = 8, W_wave = 3, wave 2 = {7, 8, 9}, c = 8 and 9 both on c̄ mod 8 = 0. */
static void test_app_d_example(void **state) {
    (void)state;
    tide_validation_t rep;
    assert_true(tide_rs_find_collision(9, 8, 3, &rep));
    assert_int_equal(rep.accepted, 0);
    assert_int_equal(rep.wave, 2);
    assert_int_equal(rep.contributor0, 8);
    assert_int_equal(rep.contributor1, 9);
    assert_int_equal(rep.gpu, tide_rs_dest_gpu(9, 8, rep.subslice, 8));
    tide_rs_schedule_t s;
    memset(&s, 0x5a, sizeof(s));
    assert_tide(TIDE_ERR_PLAN_REJECTED, build(9, 8, 3, 2, TIDE_RS_IN_PLACE, 1, &s));
    const char *msg = tide_get_last_error();
    assert_non_null(strstr(msg, "M = 9"));
    assert_non_null(strstr(msg, "L = 8"));
    assert_non_null(strstr(msg, "W_wave = 3"));
    assert_non_null(strstr(msg, "wave 2"));
    assert_non_null(strstr(msg, "c0 = 8"));
    assert_non_null(strstr(msg, "c1 = 9"));
    assert_non_null(strstr(msg, "s = 0"));
    assert_non_null(strstr(msg, "j = 0"));
    assert_int_equal(s.nodes, 0x5a5a5a5a); /* output untouched on failure */
}

/* Waves partition 1..M per pass in order; generations alternate; rounds respect k, stay in
 * their wave, cover its remote contributors, and match tide_rs_count_rounds. */
static void test_waves_and_rounds(void **state) {
    (void)state;
    for (int M = 1; M <= 70; ++M) {
        for (int W_wave = 1; W_wave <= 8; ++W_wave) {
            if (collides_brute(M, 8, W_wave)) continue;
            for (int k = 1; k <= TIDE_MAX_ROUND_WIDTH; ++k) {
                for (int passes = 1; passes <= TIDE_MAX_PASSES; ++passes) {
                    tide_rs_schedule_t s;
                    assert_tide(TIDE_SUCCESS,
                                build(M, 8, W_wave, k, TIDE_RS_SLOT_REUSE, passes, &s));
                    int W = (M + W_wave - 1) / W_wave;
                    assert_int_equal(s.waves_per_pass, W);
                    assert_int_equal(s.num_waves, passes * W);
                    assert_int_equal(s.inbox_generations, W == 1 ? 1 : 2);
                    int brute_rounds = 0; /* one pass, by definition */
                    for (int w = 0; w < W; ++w) {
                        int first = w * W_wave + 1;
                        int last = first + W_wave - 1 < M ? first + W_wave - 1 : M;
                        int remote = last - first + 1 - (last == M);
                        brute_rounds += (remote + k - 1) / k;
                    }
                    assert_int_equal(tide_rs_count_rounds(M, W_wave, k), brute_rounds);
                    assert_int_equal(s.num_rounds, passes * brute_rounds);
                    int next_c[TIDE_MAX_PASSES] = {1, 1, 1, 1}, next_round = 0;
                    for (int g = 0; g < s.num_waves; ++g) {
                        const tide_rs_wave_t *wv = &s.waves[g];
                        assert_int_equal(wv->pass, g / W);
                        assert_int_equal(wv->generation, g % s.inbox_generations);
                        assert_int_equal(wv->first, next_c[wv->pass]);
                        assert_true(wv->count >= 1 && wv->count <= W_wave);
                        next_c[wv->pass] += wv->count;
                        assert_int_equal(wv->has_own, wv->first + wv->count - 1 == M);
                        assert_int_equal(wv->first_round, next_round);
                        int c = wv->first;
                        for (int i = wv->first_round; i < wv->first_round + wv->num_rounds; ++i) {
                            const tide_rs_round_t *rd = &s.rounds[i];
                            assert_int_equal(rd->wave, g);
                            assert_int_equal(rd->first, c);
                            assert_true(rd->count >= 1 && rd->count <= k);
                            assert_true(rd->first + rd->count - 1 < M); /* remote only */
                            assert_true(rd->first + rd->count <= wv->first + wv->count);
                            c += rd->count;
                        }
                        assert_int_equal(c, wv->first + wv->count - (wv->has_own ? 1 : 0));
                        next_round += wv->num_rounds;
                    }
                    for (int p = 0; p < passes; ++p)
                        assert_int_equal(next_c[p], M + 1);
                    assert_int_equal(next_round, s.num_rounds);
                    tide_rs_schedule_free(&s);
                }
            }
        }
    }
    assert_int_equal(tide_rs_count_rounds(0, 1, 1), -1);
    assert_int_equal(tide_rs_count_rounds(4, 0, 1), -1);
    assert_int_equal(tide_rs_count_rounds(4, 1, 0), -1);
    assert_int_equal(tide_rs_count_rounds(1, 8, 2), 0);
    assert_int_equal(tide_rs_count_rounds(64, 8, 4), 16); /* 7 waves x 2 + ceil(7/4) */
}

/* Zero masks against the definition, with explicit block sets from eq. 8 and prev(g) found by
 * walking back through the call and wrapping into the previous one. */
static void test_zero_masks_definition(void **state) {
    (void)state;
    const int Ls[] = {2, 3, 4, 6, 8};
    for (int li = 0; li < 5; ++li) {
        int L = Ls[li];
        for (int M = 1; M <= 37; ++M) {
            for (int W_wave = 1; W_wave <= L; ++W_wave) {
                if (collides_brute(M, L, W_wave)) continue;
                for (int passes = 1; passes <= 3; ++passes) {
                    tide_rs_schedule_t s;
                    assert_tide(TIDE_SUCCESS, build(M, L, W_wave, 1, TIDE_RS_IN_PLACE, passes, &s));
                    int G = s.num_waves, nonzero = 0;
                    for (int g = 0; g < G; ++g) {
                        int prev = -1;
                        for (int back = 1; back <= G && prev < 0; ++back) {
                            int h = ((g - back) % G + G) % G;
                            if (s.waves[h].generation == s.waves[g].generation) prev = h;
                        }
                        assert_true(prev >= 0);
                        for (int sub = 0; sub < L; ++sub) {
                            int w_prev = 0, w_cur = 0;
                            for (int c = s.waves[prev].first;
                                 c < s.waves[prev].first + s.waves[prev].count; ++c)
                                w_prev |= 1 << tide_rs_dest_gpu(M, L, sub, c);
                            for (int c = s.waves[g].first; c < s.waves[g].first + s.waves[g].count;
                                 ++c)
                                w_cur |= 1 << tide_rs_dest_gpu(M, L, sub, c);
                            assert_int_equal(s.waves[g].zero_mask[sub], w_prev & ~w_cur);
                            nonzero += s.waves[g].zero_mask[sub] != 0;
                        }
                    }
                    /* a 3-wave pass with a short last wave needs zeroing: M = 20, L = 8 */
                    if (L == 8 && M == 20 && W_wave == 8) assert_true(nonzero > 0);
                    tide_rs_schedule_free(&s);
                }
            }
        }
    }
}

/* Outbox depth: In-Place holds every remote destination; Slot-Reuse two consecutive rounds
 * (eq. 9), computed here from an independently built round list. */
static void test_outbox_depth(void **state) {
    (void)state;
    for (int M = 1; M <= 80; ++M) {
        for (int W_wave = 1; W_wave <= 8; ++W_wave) {
            if (collides_brute(M, 8, W_wave)) continue;
            for (int k = 1; k <= 4; ++k) {
                for (int passes = 1; passes <= 4; ++passes) {
                    int depth = 0, prev = 0;
                    for (int p = 0; p < passes; ++p)
                        for (int first = 1; first <= M; first += W_wave) {
                            int last = first + W_wave - 1 < M ? first + W_wave - 1 : M;
                            int remote = last - first + 1 - (last == M);
                            for (int left = remote; left > 0; left -= k) {
                                int ki = left < k ? left : k;
                                if (ki + prev > depth) depth = ki + prev;
                                prev = ki;
                            }
                        }
                    tide_rs_schedule_t s;
                    assert_tide(TIDE_SUCCESS,
                                build(M, 8, W_wave, k, TIDE_RS_SLOT_REUSE, passes, &s));
                    assert_int_equal(s.outbox_depth, depth);
                    assert_true(s.outbox_depth <= 2 * k);
                    tide_rs_schedule_free(&s);
                    assert_tide(TIDE_SUCCESS, build(M, 8, W_wave, k, TIDE_RS_IN_PLACE, passes, &s));
                    assert_int_equal(s.outbox_depth, passes * (M - 1));
                    assert_int_equal(s.mode, TIDE_RS_IN_PLACE);
                    assert_int_equal(s.staging_slots, 2);
                    tide_rs_schedule_free(&s);
                }
            }
        }
    }
    tide_rs_schedule_t s;
    assert_tide(TIDE_SUCCESS, build(64, 8, 8, 4, TIDE_RS_SLOT_REUSE, 1, &s));
    assert_int_equal(s.outbox_depth, 8);
    tide_rs_schedule_free(&s);
    assert_tide(TIDE_SUCCESS, build(64, 8, 8, 4, TIDE_RS_IN_PLACE, 1, &s));
    assert_int_equal(s.outbox_depth, 63);
    tide_rs_schedule_free(&s);
    assert_tide(TIDE_SUCCESS, build(1, 8, 8, 2, TIDE_RS_SLOT_REUSE, 2, &s));
    assert_int_equal(s.outbox_depth, 0);
    assert_int_equal(s.num_rounds, 0);
    assert_int_equal(s.num_waves, 2);
    tide_rs_schedule_free(&s);
}

/* ------------------------------------------------------------ sub-slices and descriptors */

/* A geometry filled by hand from the §2.1 definitions (bf16 AG and gradients). */
static void make_geom(tide_geom_t *g, tide_geom_param_t *params, int N, int P,
                      const uint64_t (*shapes)[2]) {
    memset(g, 0, sizeof(*g));
    uint64_t off = 0, elems = 0;
    for (int p = 0; p < P; ++p) {
        tide_geom_param_t *q = &params[p];
        q->dim0 = shapes[p][0];
        q->inner = shapes[p][1];
        q->rows = (q->dim0 + (uint64_t)N - 1) / (uint64_t)N;
        q->shard_elems = q->rows * q->inner;
        q->shard_bytes = 2 * q->shard_elems;
        q->offset = off;
        q->elem_offset = elems;
        off += q->shard_bytes;
        elems += q->shard_elems;
    }
    g->num_params = P;
    g->ranks = N;
    g->ag_item = g->grad_item = 2;
    g->params = params;
    g->shard_bytes = off;
    g->shard_elems = elems;
}

/* Paper §4.1: (L, M, P) = (8, 64, 30), 8192 x 8192 parameters, N = 512, no padding. */
static void test_descriptors_paper_figures(void **state) {
    (void)state;
    uint64_t shapes[30][2];
    tide_geom_param_t params[30];
    for (int p = 0; p < 30; ++p) {
        shapes[p][0] = 8192;
        shapes[p][1] = 8192;
    }
    tide_geom_t g;
    make_geom(&g, params, 512, 30, (const uint64_t(*)[2])shapes);
    tide_topo_t t = topo_of(64, 8);
    tide_rs_schedule_t s;
    assert_tide(TIDE_SUCCESS, tide_rs_schedule_build(&t, &g, 8, 4, TIDE_RS_IN_PLACE, 1, 2, &s));
    assert_int_equal(s.descriptors_flat, 107520);     /* (L-1) P M L */
    assert_int_equal(s.descriptors_coalesced, 13440); /* (L-1) P M */
    assert_int_equal(s.subslice_elems, 30 * 16384);   /* E_p = 16 x 8192, split in 8 */
    for (int sub = 0; sub < 8; ++sub)
        assert_int_equal(s.num_pieces[sub], 30);
    tide_rs_schedule_free(&s);
}

typedef struct {
    uint64_t flat, coal;
} counts_t;

/* The pieces' definition: sub-slices of a_p = round_up(ceil(E_p / L), 4) elements, each cut
 * into n_part pieces of e_p = round_up(ceil(a_p / n_part), 4); piece (pass, sub) covers
 * [sub a_p + pass e_p, sub a_p + min((pass + 1) e_p, a_p)) clipped to E_p.  False if empty. */
static uint64_t piece_width(uint64_t E, int L, int passes) {
    uint64_t a = ((E + L - 1) / L + 3) / 4 * 4;
    return ((a + passes - 1) / passes + 3) / 4 * 4;
}

static bool piece_of(uint64_t E, int L, int passes, int pass, int sub, uint64_t *begin,
                     uint64_t *len) {
    uint64_t a = ((E + L - 1) / L + 3) / 4 * 4, e = piece_width(E, L, passes);
    uint64_t off = (uint64_t)pass * e, first = (uint64_t)sub * a;
    if (off >= a || first + off >= E) return false;
    uint64_t end = first + (off + e < a ? off + e : a);
    if (end > E) end = E;
    *begin = first + off;
    *len = end - *begin;
    return true;
}

/* Per-element definition of the Level-1 descriptors rank (n, i) issues per call. */
static counts_t brute_rank(const tide_geom_t *g, int M, int L, int passes, int n, int i) {
    counts_t out = {0, 0};
    for (int pass = 0; pass < passes; ++pass)
        for (int t = 0; t < M; ++t)
            for (int j = 0; j < L; ++j) {
                if (j == i) continue;
                int sub = (j + cbar(M, t, n)) % L;
                for (int p = 0; p < g->num_params; ++p) {
                    const tide_geom_param_t *q = &g->params[p];
                    uint64_t E = q->shard_elems, begin, len;
                    if (!piece_of(E, L, passes, pass, sub, &begin, &len)) continue;
                    bool in_prefix = true, strided = false;
                    int tails = 0;
                    for (int l = 0; l < L; ++l) {
                        uint64_t r = (uint64_t)t * L + l, valid = 0;
                        for (uint64_t x = begin; x < begin + len; ++x)
                            if ((r * E + x) / q->inner < q->dim0) ++valid; /* row < D_p */
                        if (valid > 0) out.flat++;
                        if (valid == len) {
                            assert_true(in_prefix); /* full ranks form a prefix in l */
                            strided = true;
                        } else {
                            in_prefix = false;
                            if (valid > 0) ++tails;
                        }
                    }
                    assert_true(tails <= 1);
                    out.coal += (strided ? 1 : 0) + (uint64_t)tails;
                }
            }
    return out;
}

static void check_against_bruteforce(int M, int L, int passes, int P, const uint64_t (*shapes)[2],
                                     counts_t *max_out, bool *uneven_out) {
    tide_geom_param_t params[8];
    tide_geom_t g;
    make_geom(&g, params, M * L, P, shapes);
    tide_topo_t t = topo_of(M, L);
    tide_rs_schedule_t s;
    assert_tide(TIDE_SUCCESS,
                tide_rs_schedule_build(&t, &g, L, 2, TIDE_RS_IN_PLACE, passes, 2, &s));
    /* pieces: every parameter is covered exactly once, columns follow the e_p widths */
    uint64_t col = 0;
    for (int p = 0; p < P; ++p) {
        uint64_t E = params[p].shard_elems, covered = 0;
        uint64_t e = piece_width(E, L, passes);
        for (int idx = 0; idx < passes * L; ++idx) {
            uint64_t begin = 0, len = 0;
            bool want = piece_of(E, L, passes, idx / L, idx % L, &begin, &len);
            bool found = false;
            for (int k = 0; k < s.num_pieces[idx]; ++k) {
                const tide_rs_piece_t *pc = &s.pieces[idx][k];
                if (pc->param != p) continue;
                assert_false(found);
                found = true;
                assert_int_equal(pc->begin, begin);
                assert_int_equal(pc->len, len);
                assert_true(pc->len >= 1 && pc->len <= e);
                assert_int_equal(pc->col, col);
                covered += pc->len;
            }
            assert_int_equal(found, want);
        }
        assert_int_equal(covered, E);
        col += e;
    }
    assert_int_equal(s.subslice_elems, col);
    assert_int_equal(s.subslice_elems % 4, 0);

    counts_t best = {0, 0}, first = brute_rank(&g, M, L, passes, 0, 0);
    bool uneven = false;
    for (int n = 0; n < M; ++n)
        for (int i = 0; i < L; ++i) {
            counts_t c = brute_rank(&g, M, L, passes, n, i);
            if (c.flat > best.flat) best.flat = c.flat;
            if (c.coal > best.coal) best.coal = c.coal;
            uneven |= c.flat != first.flat || c.coal != first.coal;
        }
    assert_int_equal(s.descriptors_flat, best.flat);
    assert_int_equal(s.descriptors_coalesced, best.coal);
    tide_rs_schedule_free(&s);
    if (max_out) *max_out = best;
    if (uneven_out) *uneven_out = uneven;
}

/* Padded shapes: rows past D_p are not copied; the counts are checked against a per-element
 * brute force over every rank. */
static void test_descriptors_padded_bruteforce(void **state) {
    (void)state;
    const uint64_t shapes[6][2] = {{7, 3}, {1, 5}, {13, 1}, {2, 9}, {40, 2}, {23, 6}};
    const int Ms[] = {1, 2, 3, 5}, Ls[] = {1, 2, 3, 4};
    int uneven_seen = 0;
    for (int mi = 0; mi < 4; ++mi)
        for (int li = 0; li < 4; ++li)
            for (int passes = 1; passes <= 3; ++passes) {
                bool uneven;
                check_against_bruteforce(Ms[mi], Ls[li], passes, 6, shapes, NULL, &uneven);
                uneven_seen += uneven;
            }
    /* the per-rank count does depend on the rank, so the maximum must cover all of them */
    assert_true(uneven_seen > 0);
    /* one tiny parameter, M = 1, L = 2: only sub-slice 0 has a piece, so rank 0 (its owner)
     * pushes nothing and rank 1 pushes one row per destination rank that holds data */
    const uint64_t tiny[1][2] = {{1, 4}};
    counts_t c;
    check_against_bruteforce(1, 2, 1, 1, tiny, &c, NULL);
    assert_int_equal(c.flat, 1);
    assert_int_equal(c.coal, 1);
    /* unpadded, every piece non-empty: (L-1) P M L and (L-1) P M per pass */
    const uint64_t even[2][2] = {{24, 32}, {48, 16}};
    check_against_bruteforce(3, 4, 2, 2, even, &c, NULL);
    assert_int_equal(c.flat, 2 * 3 * 2 * 3 * 4);
    assert_int_equal(c.coal, 2 * 3 * 2 * 3);
}

static void test_bad_arguments(void **state) {
    (void)state;
    tide_topo_t t = topo_of(4, 4);
    tide_rs_schedule_t s;
    const tide_rs_mode_t ip = TIDE_RS_IN_PLACE;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_schedule_build(NULL, NULL, 4, 2, ip, 1, 2, &s));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_schedule_build(&t, NULL, 4, 2, ip, 1, 2, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_schedule_build(&t, NULL, 0, 2, ip, 1, 2, &s));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_schedule_build(&t, NULL, 5, 2, ip, 1, 2, &s));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_schedule_build(&t, NULL, 4, 0, ip, 1, 2, &s));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_rs_schedule_build(&t, NULL, 4, TIDE_MAX_ROUND_WIDTH + 1, ip, 1, 2, &s));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_schedule_build(&t, NULL, 4, 2, ip, 0, 2, &s));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_rs_schedule_build(&t, NULL, 4, 2, ip, TIDE_MAX_PASSES + 1, 2, &s));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_rs_schedule_build(&t, NULL, 4, 2, TIDE_RS_MODE_COUNT, 1, 2, &s));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_rs_schedule_build(&t, NULL, 4, 2, (tide_rs_mode_t)-1, 1, 2, &s));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_schedule_build(&t, NULL, 4, 2, ip, 1, 0, &s));
    tide_topo_t bad = {0, 4, 0};
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_schedule_build(&bad, NULL, 4, 2, ip, 1, 2, &s));
    /* a geometry for another rank count */
    const uint64_t shapes[1][2] = {{16, 16}};
    tide_geom_param_t params[1];
    tide_geom_t g;
    make_geom(&g, params, 8, 1, shapes);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_schedule_build(&t, &g, 4, 2, ip, 1, 2, &s));
    tide_rs_schedule_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rail_alignment_bruteforce),
        cmocka_unit_test(test_waves_collision_free_all_nodes),
        cmocka_unit_test(test_latin_square_divisors),
        cmocka_unit_test(test_find_collision_vs_bruteforce),
        cmocka_unit_test(test_app_d_example),
        cmocka_unit_test(test_waves_and_rounds),
        cmocka_unit_test(test_zero_masks_definition),
        cmocka_unit_test(test_outbox_depth),
        cmocka_unit_test(test_descriptors_paper_figures),
        cmocka_unit_test(test_descriptors_padded_bruteforce),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
