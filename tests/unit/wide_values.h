/*
 * wide_values.h - test data that exposes rounding: values over a wide exponent range
 * (2^-40 .. 2^40), either sign, sometimes +-0, and (with specials) rarely NaN or an infinity,
 * so that sums of them round at every add.  A xorshift64 generator on the caller's state.
 */
#ifndef TIDE_TESTS_WIDE_VALUES_H
#define TIDE_TESTS_WIDE_VALUES_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

static inline uint64_t wide_rng_next(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static inline float wide_value_next(uint64_t *state, bool specials) {
    const uint64_t x = wide_rng_next(state);
    if (specials && x % 97 == 0) return NAN;
    if (specials && x % 89 == 0) return (x & 1) ? INFINITY : -INFINITY;
    if (x % 31 == 0) return (x & 2) ? -0.0f : 0.0f;
    const double mant = 1.0 + (double)((x >> 8) & 0xffff) / 65536.0;
    const int e = (int)((x >> 32) % 81) - 40;
    return (float)((x & 4 ? -1.0 : 1.0) * ldexp(mant, e));
}

#endif
