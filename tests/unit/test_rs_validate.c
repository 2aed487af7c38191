/* test_rs_validate.c - the TIDE-RS validator: it accepts every schedule the builder accepts,
 * reports collisions like the raw partition scan, and catches corrupted zero masks, wave
 * generations, wave ranges, rounds and outbox depths. */
#include "test_util.h"

#include "core/checks.h"
#include "plan/plan.h"

#include <time.h>

static tide_rs_schedule_t build_ok(int M, int L, int W_wave, int k, tide_rs_mode_t mode,
                                   int passes) {
    tide_topo_t t;
    assert_tide(TIDE_SUCCESS, tide_topo_init(M, L, &t));
    tide_rs_schedule_t s;
    assert_tide(TIDE_SUCCESS, tide_rs_schedule_build(&t, NULL, W_wave, k, mode, passes, 1, &s));
    return s;
}

static tide_validation_t validate(const tide_rs_schedule_t *s) {
    tide_validation_t rep;
    memset(&rep, 0x7f, sizeof(rep));
    assert_tide(TIDE_SUCCESS, tide_rs_validate(s, &rep));
    return rep;
}

/* Every (M, L, W_wave, k, mode, n_part) with M <= 48: accepted iff the partition does not
 * collide, with the scan's report otherwise, and 2 calls x (destination nodes 0 and M-1) x
 * n_part M L block landings simulated. */
static void test_accepts_every_accepted_schedule(void **state) {
    (void)state;
    for (int M = 1; M <= 48; ++M)
        for (int L = 1; L <= TIDE_MAX_GPUS_PER_NODE; ++L)
            for (int W_wave = 1; W_wave <= L; ++W_wave) {
                tide_validation_t scan;
                bool collides = tide_rs_find_collision(M, L, W_wave, &scan);
                for (int k = 1; k <= TIDE_MAX_ROUND_WIDTH; ++k)
                    for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode)
                        for (int passes = 1; passes <= TIDE_MAX_PASSES; ++passes) {
                            tide_validation_t rep;
                            assert_tide(TIDE_SUCCESS,
                                        tide_validate_schedule(M, L, W_wave, k,
                                                               (tide_rs_mode_t)mode, passes, &rep));
                            assert_int_equal(rep.accepted, !collides);
                            if (collides) {
                                assert_int_equal(rep.wave, scan.wave);
                                assert_int_equal(rep.contributor0, scan.contributor0);
                                assert_int_equal(rep.contributor1, scan.contributor1);
                                continue;
                            }
                            uint64_t dests = M > 1 ? 2 : 1;
                            assert_int_equal(rep.blocks_checked,
                                             2 * dests * (uint64_t)(passes * M * L));
                        }
            }
}

/* The sweep `tide-plan validate` runs at L = 8, thinned to one k and two pass counts; all
 * W_wave dividing 8 are accepted and exactly 1023 (M, W_wave) pairs collide. */
static void test_sweep_l8(void **state) {
    (void)state;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int colliding_pairs = 0;
    for (int M = 2; M <= 1024; ++M)
        for (int W_wave = 1; W_wave <= 8; ++W_wave) {
            int rejected = 0;
            const int passes[2] = {1, 3};
            for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode)
                for (int pi = 0; pi < 2; ++pi) {
                    tide_validation_t rep;
                    assert_tide(TIDE_SUCCESS,
                                tide_validate_schedule(M, 8, W_wave, 2, (tide_rs_mode_t)mode,
                                                       passes[pi], &rep));
                    if (8 % W_wave == 0) assert_int_equal(rep.accepted, 1);
                    rejected += !rep.accepted;
                }
            assert_true(rejected == 0 || rejected == 4);
            colliding_pairs += rejected == 4;
        }
    clock_gettime(CLOCK_MONOTONIC, &b);
    assert_int_equal(colliding_pairs, 1023);
    print_message("sweep of %d calls: %.2f s\n", 1023 * 8 * 4,
                  (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec));
}

/* App. D: M = 9, L = 8, W_wave = 3 is an ordinary rejection: a verdict, no logged error. */
static void test_app_d_rejection_is_quiet(void **state) {
    (void)state;
    tide_validation_t rep;
    assert_tide(TIDE_SUCCESS, tide_validate_schedule(9, 8, 3, 2, TIDE_RS_SLOT_REUSE, 2, &rep));
    assert_int_equal(rep.accepted, 0);
    assert_int_equal(rep.wave, 2);
    assert_true((rep.contributor0 == 8 && rep.contributor1 == 9) ||
                (rep.contributor0 == 9 && rep.contributor1 == 8));
    assert_int_equal(rep.gpu, tide_rs_dest_gpu(9, 8, rep.subslice, 8));
    assert_string_equal(tide_get_last_error(), "");
}

/* M = 20, L = 8, W_wave = 8: waves {1..8}, {9..16}, {17..20} on generations 0, 1, 0, so the
 * last wave must zero what the first one left in generation 0 and does not overwrite. */
static void test_corrupt_zero_mask_stale(void **state) {
    (void)state;
    tide_rs_schedule_t s = build_ok(20, 8, 8, 2, TIDE_RS_IN_PLACE, 1);
    assert_int_equal(validate(&s).accepted, 1);
    assert_int_equal(s.waves[2].generation, 0);
    int sub = 0;
    while (s.waves[2].zero_mask[sub] == 0)
        ++sub;
    int j = __builtin_ctz(s.waves[2].zero_mask[sub]);
    s.waves[2].zero_mask[sub] &= (uint16_t) ~(1u << j);
    tide_validation_t rep = validate(&s);
    assert_int_equal(rep.accepted, 0);
    assert_int_equal(rep.wave, 2);
    assert_int_equal(rep.subslice, sub);
    assert_int_equal(rep.gpu, j);
    tide_rs_schedule_free(&s);
}

/* A mask bit on a block the wave writes would zero fresh data: c = 17 writes block s on GPU
 * j(s, 17) in wave 2. */
static void test_corrupt_zero_mask_clobber(void **state) {
    (void)state;
    const int configs[][3] = {{20, 8, 8}, {12, 4, 2}, {7, 8, 2}};
    for (int i = 0; i < 3; ++i) {
        int M = configs[i][0], L = configs[i][1], W_wave = configs[i][2];
        tide_rs_schedule_t s = build_ok(M, L, W_wave, 1, TIDE_RS_SLOT_REUSE, 2);
        int g = s.num_waves - 1, sub = L - 1, c = s.waves[g].first;
        int j = tide_rs_dest_gpu(M, L, sub, c);
        assert_int_equal(s.waves[g].zero_mask[sub] & (1u << j), 0);
        s.waves[g].zero_mask[sub] |= (uint16_t)(1u << j);
        tide_validation_t rep = validate(&s);
        assert_int_equal(rep.accepted, 0);
        assert_int_equal(rep.wave, g);
        assert_int_equal(rep.subslice, sub);
        assert_int_equal(rep.gpu, j);
        tide_rs_schedule_free(&s);
    }
}

/* Generations: two consecutive waves on one generation (the next wave's puts race the
 * landing), or a generation that does not exist. */
static void test_corrupt_generation(void **state) {
    (void)state;
    tide_rs_schedule_t s = build_ok(20, 8, 8, 2, TIDE_RS_IN_PLACE, 2);
    s.waves[1].generation = 0;
    tide_validation_t rep = validate(&s);
    assert_int_equal(rep.accepted, 0);
    assert_int_equal(rep.wave, 1);
    tide_rs_schedule_free(&s);

    s = build_ok(20, 8, 8, 2, TIDE_RS_IN_PLACE, 1);
    s.waves[2].generation = 2;
    assert_int_equal(validate(&s).accepted, 0);
    tide_rs_schedule_free(&s);

    /* One generation for waves {1, 2}, {3, 4}, {5, 6} at L = 8: each wave writes 16 of 64
     * blocks and its zero mask was made for the alternating generations, so wave 1 lands on
     * the blocks wave 0 left behind. */
    s = build_ok(6, 8, 2, 2, TIDE_RS_IN_PLACE, 1);
    for (int g = 0; g < s.num_waves; ++g)
        s.waves[g].generation = 0;
    s.inbox_generations = 1;
    rep = validate(&s);
    assert_int_equal(rep.accepted, 0);
    assert_int_equal(rep.wave, 1);
    tide_rs_schedule_free(&s);
}

/* Contributor ranges: a wave that skips or repeats a contributor. */
static void test_corrupt_waves(void **state) {
    (void)state;
    tide_rs_schedule_t s = build_ok(16, 8, 4, 2, TIDE_RS_IN_PLACE, 1);
    s.waves[1].count -= 1; /* contributor 8 never lands */
    tide_validation_t rep = validate(&s);
    assert_int_equal(rep.accepted, 0);
    assert_int_equal(rep.contributor0, 8);
    tide_rs_schedule_free(&s);

    s = build_ok(16, 8, 4, 2, TIDE_RS_IN_PLACE, 2);
    s.waves[5].first -= 1; /* pass 1 lands contributor 8 twice */
    s.waves[5].count += 1;
    rep = validate(&s);
    assert_int_equal(rep.accepted, 0);
    assert_int_equal(rep.wave, 5);
    assert_int_equal(rep.contributor0, 4);
    assert_int_equal(rep.contributor1, 4);
    tide_rs_schedule_free(&s);

    /* M = 9, L = 8, W_wave = 2: merge the last two waves into {7, 8, 9}, App. D's collision */
    s = build_ok(9, 8, 2, 2, TIDE_RS_IN_PLACE, 1);
    assert_int_equal(s.num_waves, 5);
    s.waves[3].count = 3;
    s.num_waves = 4;
    rep = validate(&s);
    assert_int_equal(rep.accepted, 0);
    assert_int_equal(rep.wave, 3);
    assert_int_equal(rep.contributor0, 8);
    assert_int_equal(rep.contributor1, 9);
    assert_int_equal(rep.gpu, tide_rs_dest_gpu(9, 8, rep.subslice, 9));
    s.num_waves = 5;
    tide_rs_schedule_free(&s);

    s = build_ok(16, 8, 4, 2, TIDE_RS_IN_PLACE, 1);
    s.waves[3].count = 9; /* wider than L */
    assert_int_equal(validate(&s).accepted, 0);
    tide_rs_schedule_free(&s);
}

/* Rounds and outbox: a round wider than k, a round that leaves its wave, and a Slot-Reuse
 * outbox one block short of eq. 9. */
static void test_corrupt_rounds_and_outbox(void **state) {
    (void)state;
    tide_rs_schedule_t s = build_ok(64, 8, 8, 4, TIDE_RS_SLOT_REUSE, 1);
    assert_int_equal(s.outbox_depth, 8);
    assert_int_equal(validate(&s).accepted, 1);
    s.outbox_depth = 7;
    assert_int_equal(validate(&s).accepted, 0);
    s.outbox_depth = 64; /* more than D_rem = 63 */
    assert_int_equal(validate(&s).accepted, 0);
    s.outbox_depth = 8;
    s.round_width = 3;
    assert_int_equal(validate(&s).accepted, 0);
    tide_rs_schedule_free(&s);

    s = build_ok(16, 8, 4, 2, TIDE_RS_SLOT_REUSE, 1);
    s.rounds[1].count = 3; /* wave 0 = {1..4}: rounds {1,2}, {3,4} -> {3,4,5} */
    s.round_width = 4;
    assert_int_equal(validate(&s).accepted, 0);
    tide_rs_schedule_free(&s);

    /* In-Place: a full outbox never needs a send before the next sum. */
    s = build_ok(33, 8, 8, 4, TIDE_RS_IN_PLACE, 3);
    assert_int_equal(s.outbox_depth, 3 * 32);
    assert_int_equal(validate(&s).accepted, 1);
    tide_rs_schedule_free(&s);
}

static void test_single_node(void **state) {
    (void)state;
    tide_validation_t rep;
    assert_tide(TIDE_SUCCESS, tide_validate_schedule(1, 8, 8, 1, TIDE_RS_SLOT_REUSE, 4, &rep));
    assert_int_equal(rep.accepted, 1);
    assert_int_equal(rep.blocks_checked, 2 * 4 * 8);
    assert_tide(TIDE_SUCCESS, tide_validate_schedule(1, 1, 1, 1, TIDE_RS_IN_PLACE, 1, &rep));
    assert_int_equal(rep.accepted, 1);
}

static void test_bad_arguments(void **state) {
    (void)state;
    tide_validation_t rep;
    memset(&rep, 0x33, sizeof(rep));
    const tide_rs_mode_t ip = TIDE_RS_IN_PLACE;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(0, 8, 8, 2, ip, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(-3, 8, 8, 2, ip, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_validate_schedule(TIDE_MAX_NODES + 1, 8, 8, 2, ip, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(4, 0, 1, 2, ip, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(4, 9, 8, 2, ip, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(4, 8, 0, 2, ip, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(4, 8, 9, 2, ip, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(4, 4, 5, 2, ip, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(4, 8, 8, 0, ip, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(4, 8, 8, 5, ip, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(4, 8, 8, 2, ip, 0, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(4, 8, 8, 2, ip, 5, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_validate_schedule(4, 8, 8, 2, TIDE_RS_MODE_COUNT, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_validate_schedule(4, 8, 8, 2, (tide_rs_mode_t)-1, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_validate_schedule(4, 8, 8, 2, ip, 1, NULL));
    assert_int_equal(rep.accepted, 0x33333333); /* untouched by failing calls */

    tide_rs_schedule_t s = build_ok(4, 4, 4, 2, ip, 1);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_validate(NULL, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_validate(&s, NULL));
    s.inbox_generations = 3;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_rs_validate(&s, &rep));
    tide_rs_schedule_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepts_every_accepted_schedule),
        cmocka_unit_test(test_sweep_l8),
        cmocka_unit_test(test_app_d_rejection_is_quiet),
        cmocka_unit_test(test_corrupt_zero_mask_stale),
        cmocka_unit_test(test_corrupt_zero_mask_clobber),
        cmocka_unit_test(test_corrupt_generation),
        cmocka_unit_test(test_corrupt_waves),
        cmocka_unit_test(test_corrupt_rounds_and_outbox),
        cmocka_unit_test(test_single_node),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
