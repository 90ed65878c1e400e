/* Format version 2 (lib/src/rans2.h, where its format is specified): joint two-symbol rANS at 12-bit precision.
 * The pair table, the coder against an independent encoder written from the text (plain
 * division, no reciprocal), round trips for several M, C and n, the drift's pair assignment
 * against a brute-force argmin, the fixed-container guarantee through the public stream API,
 * determinism, pinned bytes of one small v2 stream, corrupt containers, and the profile field. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dqtest_util.h"
#include "drift.h"
#include "rans2.h"

static dq_profile pairs_profile(uint32_t kv_heads, uint32_t head_dim, uint32_t ck, uint32_t cv, uint32_t mk,
                                uint32_t mv)
{
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = kv_heads;
    pp.head_dim = head_dim;
    pp.container_bytes[0] = ck;
    pp.container_bytes[1] = cv;
    pp.levels[0] = mk;
    pp.levels[1] = mv;
    pp.format_version = DQ_FORMAT_VERSION_PAIRS;
    pp.name = "pairs";
    dq_profile p;
    cr_assert_eq(dq_profile_make(&pp, &p), DQ_OK, "profile n=%u C=%u/%u M=%u/%u", kv_heads * head_dim, ck, cv, mk, mv);
    return p;
}

/* The encoder of rans2.h written out with plain division. */
static uint32_t ref_encode(const uint16_t *pair, uint32_t M, const uint8_t *syms, uint32_t n, uint8_t *out,
                           uint32_t cap)
{
    uint32_t cum[1024], c = 0;
    for (uint32_t s = 0; s < M * M; s++) {
        cum[s] = c;
        c += pair[s];
    }
    cr_assert_eq(c, 4096u);
    uint8_t *tmp = malloc(n + 1);
    uint32_t x = 1u << 23, k = 0;
    for (uint32_t i = n / 2; i-- > 0;) {
        uint32_t s = syms[2 * i] * M + syms[2 * i + 1], f = pair[s];
        while ((uint64_t)x >= ((uint64_t)1 << 19) * f) {
            tmp[k++] = (uint8_t)x;
            x >>= 8;
        }
        x = (x / f) * 4096u + x % f + cum[s];
    }
    uint32_t used = 4 + k;
    if (used <= cap) {
        memset(out, 0, cap);
        for (int b = 0; b < 4; b++)
            out[b] = (uint8_t)(x >> (8 * b));
        for (uint32_t j = 0; j < k; j++)
            out[4 + j] = tmp[k - 1 - j];
    }
    free(tmp);
    return used;
}

Test(rans2, pair_table)
{
    for (uint32_t M = 2; M <= 32; M++) {
        for (int a = 0; a < 3; a++) {
            const float alpha[] = {1.0f, 1.4f, 2.0f};
            uint16_t f[32], pair[1024];
            cr_assert_eq(dq_model_freq_table(1024, M, alpha[a], f), DQ_OK);
            dq__rans2_pair_freq(f, M, pair);
            uint32_t sum = 0;
            double kl = 0;
            for (uint32_t s = 0; s < M * M; s++) {
                cr_assert_geq(pair[s], 1);
                sum += pair[s];
                const double t = f[s / M] * (double)f[s % M] / 65536.0;
                kl += t * log2(t / (pair[s] / 4096.0));
            }
            cr_assert_eq(sum, 4096u, "M=%u sum %u", M, sum);
            /* the pair table follows the product of the marginals closely (bits per pair) */
            cr_assert_lt(kl, M <= 16 ? 0.02 : 0.2, "M=%u alpha %.1f: KL %.4f bits", M, alpha[a], kl);
            dq__rans2_enc enc;
            static dq__rans2_dec dec;
            dq__rans2_tables(pair, M, &enc, &dec);
            for (uint32_t z = 0; z < 4096; z++) {
                const dq__rans2_entry e = dec.entry[z];
                const uint32_t s = e.m1 * M + e.m2;
                cr_assert(e.m1 < M && e.m2 < M);
                cr_assert_eq(e.f, pair[s]);
                cr_assert_eq(e.bias, z - enc.cum[s]);
            }
        }
    }
}

/* Random streams for several M, n and frequency shapes: the library's bytes equal the reference's,
 * the decoder gives the symbols back from a container of exactly the used size and from a larger
 * one, and one byte less is not enough. */
Test(rans2, round_trip)
{
    dqt_rng r;
    dqt_rng_seed(&r, 2024);
    const uint32_t Ms[] = {2, 3, 5, 6, 8, 16, 32};
    const uint32_t ns[] = {2, 4, 32, 256, 1024, 4096};
    static dq__rans2_dec dec;
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        const uint32_t M = Ms[mi];
        uint16_t f[32], pair[1024];
        cr_assert_eq(dq_model_freq_table(1024, M, 1.4f, f), DQ_OK);
        dq__rans2_pair_freq(f, M, pair);
        dq__rans2_enc enc;
        dq__rans2_tables(pair, M, &enc, &dec);
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const uint32_t n = ns[ni];
            for (int trial = 0; trial < 6; trial++) {
                uint8_t *syms = malloc(n), *back = malloc(n), *scratch = malloc(n);
                const uint32_t cap = 4 + n + 8;
                uint8_t *out = malloc(cap), *ref = malloc(cap);
                for (uint32_t i = 0; i < n; i++) /* trial 0: the model's distribution; then uniform, skewed */
                    syms[i] = trial == 0  ? dqt_draw_symbol(&r, f, M)
                              : trial < 3 ? (uint8_t)dqt_below(&r, M)
                                          : (uint8_t)(dqt_below(&r, 4) ? M - 1 : dqt_below(&r, M));
                const uint32_t used = dq__rans2_encode(&enc, syms, n, scratch, out, cap);
                cr_assert_eq(ref_encode(pair, M, syms, n, ref, cap), used, "M=%u n=%u: length", M, n);
                cr_assert_leq(used, 4 + n, "at most one byte per level");
                cr_assert_eq(memcmp(out, ref, cap), 0, "M=%u n=%u trial %d: bytes differ from the reference", M, n,
                             trial);
                cr_assert_eq(dq__rans2_decode(&dec, out, cap, n, back), DQ_OK);
                cr_assert_eq(memcmp(back, syms, n), 0, "M=%u n=%u: levels differ", M, n);
                uint8_t *exact = dqt_xmalloc(used);
                memcpy(exact, out, used);
                memset(back, 0xff, n);
                cr_assert_eq(dq__rans2_decode(&dec, exact, used, n, back), DQ_OK);
                cr_assert_eq(memcmp(back, syms, n), 0);
                if (used > 4)
                    cr_assert_eq(dq__rans2_decode(&dec, exact, used - 1, n, back), DQ_CORRUPT,
                                 "M=%u n=%u: a container one byte short accepted", M, n);
                /* too small a cap: the length is still reported */
                if (used > 4)
                    cr_assert_eq(dq__rans2_encode(&enc, syms, n, scratch, out, used - 1), used);
                free(exact);
                free(syms);
                free(back);
                free(scratch);
                free(out);
                free(ref);
            }
        }
    }
}

/* The drift's version-2 assignment is the argmin over the M² pairs of D + λ·r_ab for the λ it
 * reports, and the bisection picks the smallest λ of the grid whose cost fits the budget. */
Test(rans2, drift_pair_argmin)
{
    dqt_rng r;
    dqt_rng_seed(&r, 7);
    const dq_profile p = pairs_profile(2, 64, 60, 40, 8, 6);
    dq_codec *codec;
    cr_assert_eq(dq_codec_create(&p, NULL, &codec), DQ_OK);
    const uint32_t n = 128;
    float x[128], xs[128], tmp[128];
    uint8_t lev[128];
    for (int kind = 0; kind < 2; kind++) {
        const dq__kind_tables *kt = &codec->kt[kind];
        const uint32_t M = kt->levels;
        cr_assert_eq(kt->pairs, 1u);
        for (int trial = 0; trial < 20; trial++) {
            for (uint32_t i = 0; i < n; i++)
                x[i] = (float)dqt_normal(&r);
            dq__sort_floats(x, n, xs, (uint32_t *)(void *)tmp);
            const float o = xs[0], s = (xs[n - 1] - xs[0]) / (float)(M - 1);
            const int64_t budget = (int64_t)kt->budget_q16 - (int64_t)trial * (20 << 16);
            const dq__drift_result res = dq__drift(kt, x, xs, n, s, o, budget, lev);
            /* recompute: hi from the result's λ is not exposed, so check the argmin property with
             * the λ that the grid index and any exponent give: find the exponent that reproduces
             * the assignment's cost */
            int64_t cost = 0;
            for (uint32_t i = 0; i < n; i++)
                cr_assert_lt(lev[i], M);
            for (uint32_t i = 0; i < n; i += 2)
                cost += kt->pair_cost_q16[lev[i] * M + lev[i + 1]];
            cr_assert_eq(cost, res.cost_q16);
            cr_assert_eq(res.feasible, cost <= budget);
            int matched = 0;
            for (int hi = -40; hi <= 40 && !matched; hi++) {
                const float lam = dq__drift_lambda(hi, res.j);
                int ok = 1;
                for (uint32_t i = 0; i < n && ok; i += 2) {
                    float best = INFINITY;
                    uint32_t arg = 0;
                    for (uint32_t a = 0; a < M; a++)
                        for (uint32_t b = 0; b < M; b++) {
                            const float e1 = (x[i] - o) - s * (float)a, e2 = (x[i + 1] - o) - s * (float)b;
                            const float c = (e1 * e1 + e2 * e2) + lam * kt->pair_cost[a * M + b];
                            if (c < best) {
                                best = c;
                                arg = a * M + b;
                            }
                        }
                    ok = arg == lev[i] * M + lev[i + 1];
                }
                matched = ok;
            }
            cr_assert(matched, "kind %d trial %d: the assignment is no pair argmin for the grid's lambda", kind, trial);
        }
    }
    dq_codec_free(codec);
}

/* Through the public stream API: every stream fits its container (used bytes <= C), the decoded
 * levels are the encoder's, the record decodes to o + s·m, and the encoder is deterministic. Many
 * shapes, containers near the all-cheapest floor included. */
Test(rans2, streams_fit_and_decode)
{
    dqt_rng r;
    dqt_rng_seed(&r, 99);
    static const struct {
        uint32_t kvh, d, ck, cv, mk, mv;
    } sh[] = {
        {8, 128, 331, 231, 8, 6}, {8, 128, 287, 199, 7, 5}, {1, 16, 11, 9, 8, 6},
        {2, 32, 60, 16, 32, 2},   {1, 2, 6, 6, 8, 6},       {4, 16, 40, 14, 16, 3},
    };
    for (size_t k = 0; k < sizeof sh / sizeof sh[0]; k++) {
        const dq_profile p = pairs_profile(sh[k].kvh, sh[k].d, sh[k].ck, sh[k].cv, sh[k].mk, sh[k].mv);
        dq_codec *codec;
        dq_workspace *ws;
        cr_assert_eq(dq_codec_create(&p, NULL, &codec), DQ_OK);
        cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
        const uint32_t n = sh[k].kvh * sh[k].d;
        float *y = malloc(n * sizeof *y), *back = malloc(n * sizeof *back);
        uint8_t *lev = malloc(n), *dec = malloc(n);
        for (int kind = 0; kind < 2; kind++) {
            const size_t rb = dq_codec_record_bytes(codec, (dq_kind)kind);
            uint8_t *rec = dqt_xmalloc(rb), *rec2 = dqt_xmalloc(rb);
            dq_encode_stats st;
            memset(&st, 0, sizeof st);
            for (int t = 0; t < 150; t++) {
                const double scale = t % 3 == 0 ? 1.0 : t % 3 == 1 ? 40.0 : 0.01;
                for (uint32_t i = 0; i < n; i++)
                    y[i] = (float)(scale * (t % 5 == 4 ? dqt_uniform(&r) : dqt_normal(&r)));
                if (t == 7)
                    for (uint32_t i = 0; i < n; i++)
                        y[i] = 0.5f; /* s = 0 */
                cr_assert_eq(dq__stream_encode_ex(codec, ws, (dq_kind)kind, y, rec, &st, lev), DQ_OK);
                cr_assert_eq(dq_stream_decode_levels(codec, (dq_kind)kind, rec, dec), DQ_OK);
                cr_assert_eq(memcmp(lev, dec, n), 0, "shape %zu kind %d stream %d: levels differ", k, kind, t);
                cr_assert_eq(dq_stream_decode(codec, (dq_kind)kind, rec, back), DQ_OK);
                const float s = dq_f16_to_f32((uint16_t)(rec[0] | rec[1] << 8)),
                            o = dq_f16_to_f32((uint16_t)(rec[2] | rec[3] << 8));
                for (uint32_t i = 0; i < n; i++)
                    cr_assert_eq(back[i], o + s * (float)lev[i]);
                cr_assert_eq(dq_stream_encode(codec, ws, (dq_kind)kind, y, rec2, NULL), DQ_OK);
                cr_assert_eq(memcmp(rec, rec2, rb), 0, "not deterministic");
            }
            cr_assert_leq(st.max_payload_bytes, p.container_bytes[kind]);
            cr_assert_eq(st.streams, 150u);
            free(rec);
            free(rec2);
        }
        free(y);
        free(back);
        free(lev);
        free(dec);
        dq_workspace_free(ws);
        dq_codec_free(codec);
    }
}

/* The bytes of one small v2 stream per kind, computed once with this implementation (commit of
 * this test) and pinned: a change of the pair table, the coder or the pair drift shows up here. */
Test(rans2, golden_stream)
{
    dq_profile p;
    cr_assert_eq(dq_profile_builtin("dq226p", 1, 32, &p), DQ_OK);
    cr_assert_eq(p.format_version, (uint32_t)DQ_FORMAT_VERSION_PAIRS);
    dq_codec *codec;
    dq_workspace *ws;
    cr_assert_eq(dq_codec_create(&p, NULL, &codec), DQ_OK);
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    float y[32];
    uint64_t z = 12345;
    for (int i = 0; i < 32; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        y[i] = ((int32_t)(z >> 33) / 2147483648.0f) * 2.0f + (i % 4 == 0 ? 0.75f : 0.0f);
    }
    uint64_t h = DQT_FNV_INIT;
    for (int kind = 0; kind < 2; kind++) {
        uint8_t rec[64];
        const size_t rb = dq_codec_record_bytes(codec, (dq_kind)kind);
        cr_assert_leq(rb, sizeof rec);
        cr_assert_eq(dq_stream_encode(codec, ws, (dq_kind)kind, y, rec, NULL), DQ_OK);
        h = dqt_fnv1a64(rec, rb, h);
        if (getenv("DQT_PRINT_GOLDEN")) {
            for (size_t i = 0; i < rb; i++)
                fprintf(stderr, "%02x", rec[i]);
            fprintf(stderr, "\n");
        }
    }
    if (getenv("DQT_PRINT_GOLDEN"))
        fprintf(stderr, "golden 0x%016llxull\n", (unsigned long long)h);
    cr_assert_eq(h, 0x67df1fb9e49d415cull, "v2 stream bytes changed: 0x%016llx", (unsigned long long)h);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* Corrupt containers: random bytes, bit flips and cuts of valid ones decode to levels below M and
 * 0 or DQ_CORRUPT, never reading outside a buffer of exactly the container's size (ASan builds);
 * an initial state out of range and nonzero padding are DQ_CORRUPT. */
Test(rans2, corrupt_containers)
{
    dqt_rng r;
    dqt_rng_seed(&r, 31337);
    dq_codec *codec = dqt_codec_builtin("dq226p", 2, 64);
    dq_workspace *ws;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = 128;
    float y[128];
    uint8_t lev[128];
    size_t bad = 0, trials = 0;
    for (int kind = 0; kind < 2; kind++) {
        const uint32_t M = codec->kt[kind].levels, C = codec->kt[kind].container;
        const size_t rb = dq_codec_record_bytes(codec, (dq_kind)kind);
        uint8_t *rec = dqt_xmalloc(rb), *good = dqt_xmalloc(rb);
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)dqt_normal(&r);
        cr_assert_eq(dq_stream_encode(codec, ws, (dq_kind)kind, y, good, NULL), DQ_OK);
        /* zero state */
        memcpy(rec, good, rb);
        memset(rec + 4, 0, 4);
        cr_assert_eq(dq_stream_decode_levels(codec, (dq_kind)kind, rec, lev), DQ_CORRUPT);
        /* nonzero last byte (the padding, or the last emitted byte) */
        memcpy(rec, good, rb);
        rec[rb - 1] ^= 0x40;
        cr_assert_eq(dq_stream_decode_levels(codec, (dq_kind)kind, rec, lev), DQ_CORRUPT);
        for (int t = 0; t < 4000; t++, trials++) {
            memcpy(rec, good, rb);
            if (t % 3 == 0) {
                for (size_t i = 4; i < rb; i++)
                    rec[i] = (uint8_t)dqt_next(&r);
            } else {
                const uint32_t flips = 1 + dqt_below(&r, 3);
                for (uint32_t f = 0; f < flips; f++)
                    rec[4 + dqt_below(&r, C)] ^= (uint8_t)(1u << dqt_below(&r, 8));
            }
            const int rc = dq_stream_decode_levels(codec, (dq_kind)kind, rec, lev);
            cr_assert(rc == DQ_OK || rc == DQ_CORRUPT);
            bad += rc == DQ_CORRUPT;
            for (uint32_t i = 0; i < n; i++)
                cr_assert_lt(lev[i], M);
            /* the scalar decoder on a container cut short (exact-size buffer) */
            const uint32_t cut = dqt_below(&r, C + 1);
            uint8_t *part = dqt_xmalloc(cut ? cut : 1);
            memcpy(part, rec + 4, cut);
            const int rc2 = dq__rans2_decode(&codec->kt[kind].dec2, part, cut, n, lev);
            cr_assert(rc2 == DQ_OK || rc2 == DQ_CORRUPT);
            free(part);
        }
        free(rec);
        free(good);
    }
    cr_assert_gt(bad, trials / 2, "most corruptions detected (%zu of %zu)", bad, trials);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* The profile field: version 2 serializes with its version and round-trips; a version-1
 * profile's bytes do not depend on the version-2 code (same bytes as its dq226 twin except the
 * version word and the name); version 2 needs D-Quant and an even n; unknown versions fail. */
Test(rans2, profile_version)
{
    dq_profile a, b, back;
    cr_assert_eq(dq_profile_builtin("dq226", 8, 128, &a), DQ_OK);
    cr_assert_eq(dq_profile_builtin("dq226p", 8, 128, &b), DQ_OK);
    cr_assert_eq(a.format_version, 1u);
    cr_assert_eq(b.format_version, 2u);
    cr_assert_eq(memcmp(a.freq, b.freq, sizeof a.freq), 0);
    cr_assert_eq(a.container_bytes[0], b.container_bytes[0]);
    cr_assert_eq(a.container_bytes[1], b.container_bytes[1]);
    uint8_t ba[DQ_PROFILE_SERIALIZED_MAX], bb[DQ_PROFILE_SERIALIZED_MAX];
    size_t la, lb;
    cr_assert_eq(dq_profile_serialize(&a, ba, sizeof ba, &la), DQ_OK);
    cr_assert_eq(dq_profile_serialize(&b, bb, sizeof bb, &lb), DQ_OK);
    cr_assert_eq(la, lb);
    cr_assert_eq(ba[4], 1);
    cr_assert_eq(bb[4], 2);
    cr_assert_eq(memcmp(ba + 40, bb + 40, la - 44), 0, "only version, name and checksum differ");
    cr_assert_eq(dq_profile_deserialize(bb, lb, &back), DQ_OK);
    cr_assert_eq(back.format_version, 2u);
    cr_assert_eq(dq_profile_bits_per_value_mean(&a), dq_profile_bits_per_value_mean(&b));
    dq_profile c = b;
    c.format_version = 3;
    cr_assert_eq(dq_profile_validate(&c), DQ_VERSION);
    cr_assert_eq(dq_profile_builtin("dq226q", 8, 128, &c), DQ_PROFILE);
    cr_assert_eq(dq_profile_builtin("dq226pp", 8, 128, &c), DQ_PROFILE);
    cr_assert_eq(dq_profile_builtin("int2", 8, 128, &c), DQ_OK);
    c.format_version = 2;
    cr_assert_eq(dq_profile_validate(&c), DQ_VERSION, "version 2 is D-Quant only");
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = 3;
    pp.head_dim = 1;
    pp.container_bytes[0] = pp.container_bytes[1] = 8;
    pp.format_version = 2;
    cr_assert_eq(dq_profile_make(&pp, &c), DQ_PROFILE, "odd n");
    pp.format_version = 1;
    cr_assert_eq(dq_profile_make(&pp, &c), DQ_OK);
    pp.format_version = 3;
    cr_assert_eq(dq_profile_make(&pp, &c), DQ_VERSION);
    /* the all-cheapest pair must fit: too small a container is refused */
    pp.kv_heads = 8;
    pp.head_dim = 128;
    pp.format_version = 2;
    pp.container_bytes[0] = 40;
    cr_assert_eq(dq_profile_make(&pp, &c), DQ_CONTAINER_TOO_SMALL);
}
