/* The small deterministic generators behind the tool's random tensors and generated test data and
 * the evaluation's bootstrap resampling (client/eval and client/tool use the same ones).
 * Header-only; every function is deterministic in *state. */
#ifndef DQUANT_EVAL_RNG_H
#define DQUANT_EVAL_RNG_H

#include <math.h>
#include <stdint.h>

/* splitmix64: advances *state and returns the next output. Any state is valid. */
static inline uint64_t rng_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* xorshift64 (13, 7, 17): advances *state and returns it. *state must not be 0. */
static inline uint64_t rng_xorshift64(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* A uniform double in (0, 1) from the top 53 bits of x (never 0, so log() of it is finite). */
static inline double rng_unit_open(uint64_t x)
{
    return ((double)(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* One N(0, 1) draw from the xorshift64 stream in *state: Box–Muller, cosine branch, two steps of
 * the stream per draw. */
static inline double rng_gauss(uint64_t *state)
{
    const double u = rng_unit_open(rng_xorshift64(state));
    const double w = (double)(rng_xorshift64(state) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

#endif
