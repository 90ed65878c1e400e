/* Helpers shared by the libdquant tests: a seeded generator, checksums, test-size knobs, and an
 * independent rANS written from DESIGN §2.3 (so the library's coder is checked against the
 * normative format, not against itself). */
#ifndef DQTEST_UTIL_H
#define DQTEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/dquant.h"

/* xorshift64* seeded through splitmix64; deterministic on every machine. */
typedef struct dqt_rng {
    uint64_t s;
} dqt_rng;

void dqt_rng_seed(dqt_rng *r, uint64_t seed);
uint64_t dqt_next(dqt_rng *r);
/* Uniform integer in [0, n), n >= 1. */
uint32_t dqt_below(dqt_rng *r, uint32_t n);
/* Uniform double in [0, 1). */
double dqt_uniform(dqt_rng *r);
/* Standard normal (Box–Muller). */
double dqt_normal(dqt_rng *r);
/* T tokens of keys and values, f32 [T, n]: keys with a Gaussian channel offset (so that a window's
 * key mean matters), values with channel-dependent spreads. */
void dqt_random_kv(dqt_rng *r, uint32_t n, size_t T, float *k, float *v);
/* Symbol drawn from an integer frequency table (sum 256). */
uint8_t dqt_draw_symbol(dqt_rng *r, const uint16_t *freq, uint32_t levels);

#define DQT_FNV_INIT 0xcbf29ce484222325ull
uint64_t dqt_fnv1a64(const void *p, size_t len, uint64_t h);

/* Integer knob from the environment (tests scale down under sanitizers through these). */
long dqt_env_long(const char *name, long dflt);
/* $DQ_DATA_DIR or "../shared/data". */
const char *dqt_data_dir(void);

/* Memory of exactly size bytes from malloc (so ASan catches any overread); aborts on failure. */
void *dqt_xmalloc(size_t size);

/* Builds a codec or fails the current test. */
dq_codec *dqt_codec_builtin(const char *name, uint32_t kv_heads, uint32_t head_dim);
dq_codec *dqt_codec_make(const dq_profile_params *params);

/* ---- the reference rANS of DESIGN §2.3 ---- */

/* Needed container bytes (4 + emitted); writes the container to out when it fits cap (rest zeroed). */
uint32_t dqt_ref_rans_encode(const uint16_t *freq, uint32_t levels, const uint8_t *syms, uint32_t n, uint8_t *out,
                             uint32_t cap);

typedef struct dqt_ref_decode {
    int valid; /* 1 when the state/padding rules hold */
    uint32_t initial_state;
    uint32_t final_state;
    uint32_t consumed; /* bytes read, state included */
    int overrun;       /* wanted a byte past C */
    int nonzero_tail;  /* a byte past the consumed ones is nonzero */
} dqt_ref_decode;

/* Decodes n symbols from a C-byte container with the table, never reading outside it. */
dqt_ref_decode dqt_ref_rans_decode(const uint16_t *freq, uint32_t levels, const uint8_t *in, uint32_t C, uint32_t n,
                                   uint8_t *syms);

/* Σ −log2(f_m / 256) over the symbols. */
double dqt_ideal_bits(const uint16_t *freq, const uint8_t *syms, uint32_t n);

/* fp16 helpers reading a record's metadata (little endian). */
float dqt_record_s(const uint8_t *record);
float dqt_record_o(const uint8_t *record);

/* Relative L2 error ||a − b|| / ||b|| (returns ||a|| when b is zero). */
double dqt_rel_l2_f(const float *a, const float *b, size_t n);

#endif
