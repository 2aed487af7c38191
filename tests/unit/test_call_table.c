/*
 * test_call_table.c - call signatures compared across ranks without waiting
 * (src/fabric/call_table.h), the check of the single-process CUDA fabric.
 */
#include "test_util.h"

#include "fabric/call_table.h"

typedef struct {
    int verdict, other;
    uint64_t other_sig;
} post_t;

static post_t post(tide_call_table_t *t, int rank, uint64_t seq, uint64_t sig) {
    post_t p = {-1, -2, 1};
    assert_tide(TIDE_SUCCESS,
                tide_call_table_post(t, rank, seq, sig, &p.verdict, &p.other, &p.other_sig));
    return p;
}

static void assert_post(post_t p, int verdict, int other, uint64_t other_sig) {
    assert_int_equal(p.verdict, verdict);
    assert_int_equal(p.other, other);
    assert_int_equal(p.other_sig, other_sig);
}

/* One thread, rank 0 to N - 1 per call: agreeing calls close their checks; in call 2 rank 2
 * passes another signature: it and rank 3 after it are told (each against the side it
 * differs from), ranks 0 and 1, told nothing at the time, are refused at their next post. */
static void test_one_thread(void **state) {
    (void)state;
    tide_call_table_t t;
    tide_call_table_init(&t, 4);
    for (uint64_t seq = 0; seq < 2; ++seq)
        for (int r = 0; r < 4; ++r)
            assert_post(post(&t, r, seq, 7), TIDE_CALL_TABLE_AGREE, -1, 0);
    assert_int_equal(t.count, 0); /* every check closed */
    assert_post(post(&t, 0, 2, 7), TIDE_CALL_TABLE_AGREE, -1, 0);
    assert_post(post(&t, 1, 2, 7), TIDE_CALL_TABLE_AGREE, -1, 0);
    assert_post(post(&t, 2, 2, 9), TIDE_CALL_TABLE_DIFFERS, 0, 7);
    assert_post(post(&t, 3, 2, 7), TIDE_CALL_TABLE_DIFFERS, 2, 9);
    assert_true(t.refused);
    assert_post(post(&t, 0, 3, 7), TIDE_CALL_TABLE_REFUSED, -1, 0);
    assert_post(post(&t, 1, 3, 7), TIDE_CALL_TABLE_REFUSED, -1, 0);
    assert_int_equal(t.rank_a, 0);
    assert_int_equal(t.sig_a, 7);
    assert_int_equal(t.rank_b, 2);
    assert_int_equal(t.sig_b, 9);
    /* A rank that posts a third signature is named against the reference. */
    assert_post(post(&t, 3, 2, 11), TIDE_CALL_TABLE_DIFFERS, 0, 7);
    tide_call_table_free(&t);
}

/* A thread per rank: rank 0 runs ahead by several checks (a set of groups shares one check
 * sequence); each check closes when its last rank posts, whatever the order. */
static void test_ranks_ahead(void **state) {
    (void)state;
    tide_call_table_t t;
    tide_call_table_init(&t, 3);
    for (uint64_t seq = 0; seq < 10; ++seq)
        assert_post(post(&t, 0, seq, 100 + seq), TIDE_CALL_TABLE_AGREE, -1, 0);
    assert_int_equal(t.count, 10);
    for (uint64_t seq = 0; seq < 10; ++seq)
        assert_post(post(&t, 2, seq, 100 + seq), TIDE_CALL_TABLE_AGREE, -1, 0);
    for (uint64_t seq = 10; seq-- > 0;)
        assert_post(post(&t, 1, seq, 100 + seq), TIDE_CALL_TABLE_AGREE, -1, 0);
    assert_int_equal(t.count, 0);
    assert_false(t.refused);
    /* The first poster is the reference, not rank 0. */
    assert_post(post(&t, 2, 10, 5), TIDE_CALL_TABLE_AGREE, -1, 0);
    assert_post(post(&t, 0, 10, 6), TIDE_CALL_TABLE_DIFFERS, 2, 5);
    tide_call_table_free(&t);
}

/* One rank: nothing to compare, nothing kept. */
static void test_one_rank(void **state) {
    (void)state;
    tide_call_table_t t;
    tide_call_table_init(&t, 1);
    for (uint64_t seq = 0; seq < 5; ++seq)
        assert_post(post(&t, 0, seq, seq), TIDE_CALL_TABLE_AGREE, -1, 0);
    assert_int_equal(t.count, 0);
    tide_call_table_free(&t);
}

static void test_describe(void **state) {
    (void)state;
    char buf[128];
    tide_call_describe(TIDE_COLL_ALL_GATHER, 1, buf, sizeof(buf));
    assert_string_equal(buf, "slot 1");
    tide_call_describe(TIDE_COLL_ALL_GATHER, (uint64_t)3 << 8 | 0, buf, sizeof(buf));
    assert_string_equal(buf, "group 2 of the set, slot 0");
    const float half = 0.5f;
    uint32_t bits;
    memcpy(&bits, &half, sizeof(bits));
    tide_call_describe(TIDE_COLL_REDUCE_SCATTER, (uint64_t)bits << 32 | 1u << 1 | 1u, buf,
                       sizeof(buf));
    assert_string_equal(buf, "alpha 0.5 (bits 3f000000), accumulate 1, mode slot-reuse");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_thread),
        cmocka_unit_test(test_ranks_ahead),
        cmocka_unit_test(test_one_rank),
        cmocka_unit_test(test_describe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
