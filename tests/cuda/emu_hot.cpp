/* cuda/src/hot_lanes.cuh on the CPU against libdquant's hot layout (dquant/hot.h), for every code
 * width b = 1..8 of keys and values, without a GPU.
 *
 * For fixed-width profiles fixedkAvB (every width, the smallest and largest M of each), one window
 * of random tokens is encoded and transcoded by libdquant (dq_hot_transcode); then the device
 * functions, compiled for the host, must read every code back as dq_hot_levels gives it:
 *   - dqcu_hot_code (the rebuild's reader), for every channel of every token;
 *   - hot_lane_code (the attention kernels' operands): keys' byte lanes (channels 4k .. 4k + 3 as
 *     four bytes), values' half-word lanes (a channel's codes of two tokens 16 bits apart);
 *   - hot_key_pairs: the block kernel's fp16 operands (m - c), exactly, for c = (M - 1) / 2
 *     (half-integers included: what an fp16 constant 1024 + c gets wrong); the warp kernel's
 *     value operand hot_value_operand: a half-word lane's codes as the fp16 subnormals
 *     (2m - (M - 1))·2^-24, exactly;
 * and dqcu_hot_group_put/store (the transcoders' writer) must write the code regions byte for byte.
 * The warp kernel's integer scores: hot_query_digits must split every query value exactly into
 * digits that fit its s8 operands, and the exact integer products (the IMMA's, with their starting
 * values) combined by hot_digit_dot must give Σ q·(m - c) within the digits' rounding bound.
 * The warp kernel's sub-tile (check_warp_tile, G = 1, 2, 4, 8): its fragments gathered from a ring
 * stage the way the kernel gathers them, multiplied as PTX lays out mma.m16n8k32 and m16n8k16,
 * must give every lane's score products exactly and its value accumulators (through the weights'
 * transpose buffer) to double's rounding. The kernels' grid (check_grid): every split and KV head
 * of a plan attended by exactly one row of blocks, with either placement of the tail's.
 * checkcuda is the test on a GPU; this one catches a layout drift between lib and the device code
 * on any machine. Exit status 0, or 1 with the first mismatches printed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "dquant/dquant.h"
#include "dquant/hot.h"
#include "hot_lanes.cuh"

static int failures = 0;

#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            if (failures++ < 12) {                                                                                     \
                fprintf(stderr, "emu_hot: ");                                                                          \
                fprintf(stderr, __VA_ARGS__);                                                                          \
                fputc('\n', stderr);                                                                                   \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* The fp16 halves of x as floats, against the levels' (m - c). */
static bool halves_are(uint32_t x, float lo, float hi)
{
    return dqcu_f16_float(x & 0xffffu) == lo && dqcu_f16_float(x >> 16) == hi;
}

template <int BK, int BV>
static void check_profile(uint32_t MK, uint32_t MV)
{
    char name[32];
    snprintf(name, sizeof name, "fixedk%uv%u", MK, MV);
    const uint32_t kvh = 2, hd = 64, n = kvh * hd, G = n / 32;
    dq_profile p;
    dq_codec *codec = NULL;
    dq_workspace *ws = NULL;
    if (dq_profile_fixed(name, kvh, hd, &p) != 0 || dq_codec_create(&p, NULL, &codec) != 0 ||
        dq_workspace_create(codec, &ws) != 0) {
        EXPECT(false, "%s: no codec", name);
        return;
    }
    EXPECT(dq_hot_bits(codec, DQ_KIND_K) == BK && dq_hot_bits(codec, DQ_KIND_V) == BV, "%s: widths %u + %u", name,
           dq_hot_bits(codec, DQ_KIND_K), dq_hot_bits(codec, DQ_KIND_V));
    const uint32_t W = p.window, P = (W + 1) / 2;
    std::vector<float> k((size_t)W * n), v((size_t)W * n);
    for (size_t i = 0; i < k.size(); i++) {
        k[i] = 3.0f * uniform();
        v[i] = 3.0f * uniform();
    }
    std::vector<uint8_t> win(dq_codec_window_bytes(codec)), hot(dq_hot_window_bytes(codec));
    size_t off[4];
    dq_hot_offsets(codec, off);
    if (dq_window_encode(codec, ws, k.data(), v.data(), DQ_DTYPE_F32, win.data(), NULL) != 0 ||
        dq_hot_transcode(codec, win.data(), hot.data()) != 0) {
        EXPECT(false, "%s: encode or transcode failed", name);
        return;
    }
    std::vector<uint8_t> lev[2];
    for (int kind = 0; kind < 2; kind++) {
        lev[kind].resize((size_t)W * n);
        for (uint32_t t = 0; t < W; t++)
            dq_hot_levels(codec, hot.data(), (dq_kind)kind, t, lev[kind].data() + (size_t)t * n);
    }
    const uint32_t *kc = (const uint32_t *)(const void *)(hot.data() + off[2]);
    const uint32_t *vc = (const uint32_t *)(const void *)(hot.data() + off[3]);
    const float ck = 0.5f * (float)(MK - 1);
    const uint32_t c2k = dqcu_float_f16(512.0f + ck) * 0x00010001u;

    /* the rebuild's reader */
    for (int kind = 0; kind < 2; kind++)
        for (uint32_t t = 0; t < W; t++)
            for (uint32_t j = 0; j < n; j++) {
                const uint32_t got = dqcu_hot_code(kind ? vc : kc, kind, kind ? BV : BK, W, t, j);
                EXPECT(got == lev[kind][(size_t)t * n + j], "%s kind %d token %u channel %u: dqcu_hot_code %u, lib %u",
                       name, kind, t, j, got, lev[kind][(size_t)t * n + j]);
            }
    /* keys: byte lanes and their fp16 pairs */
    for (uint32_t t = 0; t < W; t++)
        for (uint32_t g = 0; g < G; g++) {
            uint32_t w[BK];
            for (int i = 0; i < BK; i++)
                w[i] = kc[((size_t)g * BK + (uint32_t)i) * W + t];
            for (int kk = 0; kk < 8; kk++) {
                const uint8_t *m = lev[0].data() + (size_t)t * n + 32 * g + 4 * (uint32_t)kk;
                const uint32_t x = hot_lane_code<BK, 8>(w, kk);
                EXPECT(x == ((uint32_t)m[0] | (uint32_t)m[1] << 8 | (uint32_t)m[2] << 16 | (uint32_t)m[3] << 24),
                       "%s key token %u group %u lane code %d: %08x", name, t, g, kk, x);
                if (BK <= 7) {
                    uint32_t p01, p23;
                    hot_key_pairs<BK>(w, kk, c2k, p01, p23);
                    EXPECT(halves_are(p01, (float)m[0] - ck, (float)m[1] - ck) &&
                               halves_are(p23, (float)m[2] - ck, (float)m[3] - ck),
                           "%s key token %u group %u pairs %d: %08x %08x (c %.1f)", name, t, g, kk, p01, p23, ck);
                }
            }
        }
    /* values: half-word lanes of token pairs and their fp16 pairs */
    for (uint32_t pr = 0; pr < P; pr++)
        for (uint32_t g = 0; g < G; g++)
            for (uint32_t h = 0; h < 2; h++) {
                uint32_t u[BV];
                for (int i = 0; i < BV; i++)
                    u[i] = vc[((size_t)g * 2 * BV + BV * h + (uint32_t)i) * P + pr];
                for (int kk = 0; kk < 16; kk++) {
                    const uint32_t j = 32 * g + 16 * h + (uint32_t)kk, t0 = 2 * pr, t1 = t0 + 1;
                    const uint32_t m0 = lev[1][(size_t)t0 * n + j], m1 = t1 < W ? lev[1][(size_t)t1 * n + j] : 0;
                    const uint32_t x = hot_lane_code<BV, 16>(u, kk);
                    EXPECT(x == (m0 | m1 << 16), "%s value pair %u group %u half %u lane code %d: %08x", name, pr, g, h,
                           kk, x);
                    /* the warp kernel's value operand: the fp16 subnormals (2m - (M - 1))·2^-24 */
                    const uint32_t vp = hot_value_operand<BV>(u, kk, (MV - 1) * 0x00010001u);
                    EXPECT(t1 >= W || halves_are(vp, ldexpf(2.0f * (float)m0 - (float)(MV - 1), -24),
                                                 ldexpf(2.0f * (float)m1 - (float)(MV - 1), -24)),
                           "%s value pair %u channel %u: %08x (M %u)", name, pr, j, vp, MV);
                    /* read in place: the same, 2^z higher (z = hot_value_scale) */
                    const uint32_t cm = (MV - 1) * 0x00010001u;
                    const uint32_t vs = hot_value_operand_scaled<BV>(u, kk, cm, cm | 0x80008000u);
                    const int sc = hot_value_scale<BV>(kk);
                    const float c1 = (float)(MV - 1);
                    EXPECT(sc >= 0 && sc <= 9 &&
                               (t1 >= W || halves_are(vs, ldexpf(2.0f * (float)m0 - c1, sc - 24),
                                                      ldexpf(2.0f * (float)m1 - c1, sc - 24))),
                           "%s value pair %u channel %u: scaled %08x (M %u, scale %d)", name, pr, j, vs, MV, sc);
                }
            }
    /* the transcoders' writer */
    for (int kind = 0; kind < 2; kind++) {
        const uint32_t b = kind ? BV : BK;
        const size_t bytes = kind ? hot.size() - off[3] : off[3] - off[2];
        std::vector<uint32_t> codes((bytes + 3) / 4, 0u);
        for (uint32_t t = 0; t < W; t++)
            for (uint32_t g = 0; g < G; g++) {
                dqcu_hot_group grp;
                dqcu_hot_group_clear(grp);
                for (uint32_t c = 0; c < 32; c++)
                    dqcu_hot_group_put(grp, kind, b, c, lev[kind][(size_t)t * n + 32 * g + c]);
                dqcu_hot_group_store(grp, codes.data(), kind, b, W, g, t);
            }
        EXPECT(memcmp(codes.data(), hot.data() + off[2 + kind], bytes) == 0, "%s kind %d: group store differs", name,
               kind);
    }
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* The warp kernel's score arithmetic for random 128-channel queries (magnitudes 2^-30 .. 2^30)
 * and codes of M levels, against Σ q·(m - c) in double. */
static void check_digits(void)
{
    const uint32_t Ms[] = {2, 3, 6, 8, 16};
    for (int rep = 0; rep < 4000; rep++) {
        const uint32_t M = Ms[rep % 5];
        const double c = 0.5 * (double)(M - 1);
        const float mag = ldexpf(1.0f, rep % 61 - 30);
        float y[128];
        uint32_t m[128];
        float mx = 0.0f;
        for (int i = 0; i < 128; i++) {
            y[i] = mag * uniform() * (rep % 7 == 0 && i == 5 ? 1.0f : 0.5f);
            m[i] = (uint32_t)((uniform() * 0.5f + 0.5f) * (float)M) % M;
            mx = fmaxf(mx, fabsf(y[i]));
        }
        int ex;
        frexpf(mx, &ex);
        ex = ex < -100 ? -100 : ex > 120 ? 120 : ex; /* the kernel's clamp */
        const float up = ldexpf(1.0f, 19 - ex);
        long long D[3] = {0, 0, 0}, S[3] = {0, 0, 0};
        double ref = 0.0, bound = 0.0;
        for (int i = 0; i < 128; i++) {
            int d[3];
            hot_query_digits(y[i], up, d[0], d[1], d[2]);
            const long q = lrintf(y[i] * up);
            EXPECT(16384L * d[0] + 128L * d[1] + d[2] == q, "digits of %g·2^%d: %d %d %d != %ld", (double)y[i],
                   19 - ex, d[0], d[1], d[2], q);
            EXPECT(abs(d[0]) <= 33 && d[1] >= -64 && d[1] <= 63 && d[2] >= -64 && d[2] <= 63, "digits %d %d %d",
                   d[0], d[1], d[2]);
            for (int l = 0; l < 3; l++) {
                D[l] += 2LL * d[l] * (long long)m[i];
                S[l] += d[l];
            }
            ref += (double)y[i] * ((double)m[i] - c);
            bound += fabs((double)m[i] - c);
        }
        for (int l = 0; l < 3; l++)
            D[l] -= (long long)(M - 1) * S[l]; /* the products' starting values */
        const float dot = hot_digit_dot((int)D[0], (int)D[1], (int)D[2]);
        const double got = ldexp((double)dot, ex - 20);
        /* each q' off by at most half a step 2^(e - 19), and fp32's rounding of the sum */
        const double tol = ldexp(bound + 1.0, ex - 20) + ldexp(fabs((double)dot), ex - 20 - 22);
        EXPECT(fabs(got - ref) <= tol, "scores: %.9g vs %.9g (tolerance %.3g, M %u, 2^%d)", got, ref, tol, M, ex);
    }
}

/* The warp kernel's sub-tile (attend_hot.cu, hw_subtile) at the level of its matrices: the
 * fragments built from a ring stage as the kernel builds them (hot_lane_code, hot_score_column,
 * hot_tile_dot, hot_pt_at, hot_value_operand), multiplied as mma.m16n8k32 and mma.m16n8k16
 * multiply PTX's fragment layouts, against the direct sums: every lane's score products exactly,
 * every lane's value accumulators to double's rounding. */
template <int G, int BK, int BV>
static void check_warp_tile(uint32_t MK, uint32_t MV)
{
    constexpr int HL = G <= 4 ? 1 : 2, NS = G <= 4 ? 2 : 3;
    uint32_t mk[16][128], mv[16][128];
    /* the sub-tile's codes as the transcoder lays out a window of 16 tokens (key codes [group][word][16],
     * value codes [group][word][8 pairs]), then copied into the ring stage's order chunk by chunk as
     * hw_sources maps them (hot_stage_key_chunk, hot_stage_value_chunk) */
    std::vector<uint32_t> plain(64 * BK + 64 * BV, 0u), stg(64 * BK + 64 * BV, 0u);
    for (uint32_t tok = 0; tok < 16; tok++)
        for (uint32_t grp = 0; grp < 4; grp++) {
            dqcu_hot_group gk, gv;
            dqcu_hot_group_clear(gk);
            dqcu_hot_group_clear(gv);
            for (uint32_t c = 0; c < 32; c++) {
                mk[tok][32 * grp + c] = (uint32_t)((uniform() * 0.5f + 0.5f) * (float)MK) % MK;
                mv[tok][32 * grp + c] = (uint32_t)((uniform() * 0.5f + 0.5f) * (float)MV) % MV;
                dqcu_hot_group_put(gk, 0, BK, c, mk[tok][32 * grp + c]);
                dqcu_hot_group_put(gv, 1, BV, c, mv[tok][32 * grp + c]);
            }
            dqcu_hot_group_store(gk, plain.data(), 0, BK, 16, grp, tok);
            dqcu_hot_group_store(gv, plain.data() + 64 * BK, 1, BV, 16, grp, tok);
        }
    for (uint32_t q = 0; q < 16 * BK + 16 * BV; q++) {
        uint32_t r, i, c, src;
        if (q < 16 * BK) {
            hot_stage_key_chunk(q, r, i, c);
            src = (r * BK + i) * 16 + 4 * c;
        } else {
            hot_stage_value_chunk(q - 16 * BK, r, i, c);
            src = 64 * BK + (BV * r + i) * 8 + 4 * c;
        }
        memcpy(&stg[4 * q], &plain[src], 16);
    }
    /* the kernel's stage loads: key word i of tokens g + 8r, value word i of pairs t + 4r, one bank
     * a lane */
    for (uint32_t i = 0; i < BK || i < BV; i++)
        for (uint32_t r = 0; r < 2; r++) {
            uint32_t kb = 0, vb = 0;
            for (uint32_t ln = 0; ln < 32; ln++) {
                kb |= 1u << (hot_stage_key_at(ln & 3u, i, (ln >> 2) + 8 * r) % 32);
                vb |= 1u << (hot_stage_value_at(ln >> 2, i, (ln & 3u) + 4 * r) % 32);
            }
            EXPECT((i >= BK || kb == 0xffffffffu) && (i >= BV || vb == 0xffffffffu),
                   "stage loads of word %u, half %u: banks %08x (keys) %08x (values)", i, r, kb, vb);
        }
    /* the queries' digits (one exponent a head, as the kernel) */
    static int8_t qd[3][8][128];
    int qds[3][8] = {};
    for (int h = 0; h < G; h++) {
        float y[128], mx = 0.0f;
        for (int i = 0; i < 128; i++) {
            y[i] = ldexpf(uniform(), h % 5 - 2);
            mx = fmaxf(mx, fabsf(y[i]));
        }
        int ex;
        frexpf(mx, &ex);
        for (int i = 0; i < 128; i++) {
            int d[3];
            hot_query_digits(y[i], ldexpf(1.0f, 19 - ex), d[0], d[1], d[2]);
            for (int l = 0; l < 3; l++) {
                qd[l][h][i] = (int8_t)d[l];
                qds[l][h] += d[l];
            }
        }
    }
    /* scores: C = init + Σ_ks A·B over the 4 k-steps, A and B gathered from the lanes' fragments */
    int C[NS][16][8];
    for (int s = 0; s < NS; s++)
        for (uint32_t ln = 0; ln < 32; ln++) {
            const uint32_t g = ln >> 2, t = ln & 3u;
            int in[2];
            for (uint32_t e = 0; e < 2; e++) {
                uint32_t dg, h;
                in[e] = hot_score_column(G, s, 2 * t + e, dg, h) ? -(int)(MK - 1) * qds[dg][h] : 0;
            }
            C[s][g][2 * t] = C[s][g + 8][2 * t] = in[0];
            C[s][g][2 * t + 1] = C[s][g + 8][2 * t + 1] = in[1];
        }
    for (int ks = 0; ks < 4; ks++) {
        uint8_t A[16][32];
        int8_t B[NS][32][8];
        for (uint32_t ln = 0; ln < 32; ln++) {
            const uint32_t g = ln >> 2, t = ln & 3u;
            uint32_t w0[BK], w1[BK];
            for (int i = 0; i < BK; i++) {
                w0[i] = stg[hot_stage_key_at(t, (uint32_t)i, g)];
                w1[i] = stg[hot_stage_key_at(t, (uint32_t)i, g + 8)];
            }
            const uint32_t a[4] = {hot_lane_code<BK, 8>(w0, 2 * ks), hot_lane_code<BK, 8>(w1, 2 * ks),
                                   hot_lane_code<BK, 8>(w0, 2 * ks + 1), hot_lane_code<BK, 8>(w1, 2 * ks + 1)};
            for (int j = 0; j < 4; j++) {
                A[g][4 * t + j] = (uint8_t)(a[0] >> (8 * j));
                A[g + 8][4 * t + j] = (uint8_t)(a[1] >> (8 * j));
                A[g][16 + 4 * t + j] = (uint8_t)(a[2] >> (8 * j));
                A[g + 8][16 + 4 * t + j] = (uint8_t)(a[3] >> (8 * j));
            }
            for (int s = 0; s < NS; s++) {
                uint32_t dg, h, b[2] = {0u, 0u};
                if (hot_score_column(G, s, g, dg, h))
                    for (int hf = 0; hf < 2; hf++) {
                        uint32_t x;
                        memcpy(&x, &qd[dg][h][32 * t + 8 * ks + 4 * hf], 4);
                        b[hf] = (x << 1) & 0xfefefefeu; /* the kernel's doubling of four s8 digits */
                    }
                for (int j = 0; j < 4; j++) {
                    B[s][4 * t + j][g] = (int8_t)(uint8_t)(b[0] >> (8 * j));
                    B[s][16 + 4 * t + j][g] = (int8_t)(uint8_t)(b[1] >> (8 * j));
                }
            }
        }
        for (int s = 0; s < NS; s++)
            for (int row = 0; row < 16; row++)
                for (int col = 0; col < 8; col++)
                    for (int k = 0; k < 32; k++)
                        C[s][row][col] += (int)A[row][k] * (int)B[s][k][col];
    }
    for (uint32_t ln = 0; ln < 32; ln++) {
        const uint32_t g = ln >> 2, t = ln & 3u;
        int Cl[NS][4];
        for (int s = 0; s < NS; s++) {
            Cl[s][0] = C[s][g][2 * t];
            Cl[s][1] = C[s][g][2 * t + 1];
            Cl[s][2] = C[s][g + 8][2 * t];
            Cl[s][3] = C[s][g + 8][2 * t + 1];
        }
        for (int e = 0; e < HL; e++)
            for (int r = 0; r < 2; r++) {
                const uint32_t h = HL * t + (uint32_t)e, tok = g + 8 * (uint32_t)r;
                if (h >= (uint32_t)G)
                    continue;
                long long D[3] = {0, 0, 0};
                for (int l = 0; l < 3; l++)
                    for (int i = 0; i < 128; i++)
                        D[l] += (long long)qd[l][h][i] * (2LL * mk[tok][i] - (long long)(MK - 1));
                const float got = hot_tile_dot<G>(Cl, r, e), want = hot_digit_dot((int)D[0], (int)D[1], (int)D[2]);
                EXPECT(got == want, "G %d tile score lane %u head %u token %u: %.9g vs %.9g", G, ln, h, tok,
                       (double)got, (double)want);
            }
    }
    /* values: weights (fp16 hi + lo) through the transpose buffer; O^T = A·B per m-tile */
    float w[16][8];
    for (int tok = 0; tok < 16; tok++)
        for (int h = 0; h < 8; h++)
            w[tok][h] = ldexpf(uniform() * 0.5f + 0.5f, -(tok % 13)) * 128.0f;
    std::vector<uint16_t> pt((size_t)HL * 8 * DQCU_HOT_PSTR, 0);
    /* G <= 4: lane (g, t)'s pairs (hi, lo) of token g + 8r, moved by movmatrix.trans (PTX: the 8 x 8
     * matrix whose row g, columns 2t, 2t + 1 lane (g, t) holds; lane (g, t) receives elements
     * (2t, g) and (2t + 1, g)) */
    uint32_t wp[2][32], bt[2][32];
    for (uint32_t ln = 0; ln < 32; ln++)
        for (uint32_t r = 0; r < 2; r++)
            wp[r][ln] = hot_weight_pair(w[(ln >> 2) + 8 * r][ln & 3u]);
    for (uint32_t ln = 0; ln < 32; ln++) {
        const uint32_t g = ln >> 2, t = ln & 3u;
        for (uint32_t r = 0; r < 2; r++)
            bt[r][ln] = ((wp[r][4 * (2 * t) + g / 2] >> (16 * (g % 2))) & 0xffffu) |
                        ((wp[r][4 * (2 * t + 1) + g / 2] >> (16 * (g % 2))) & 0xffffu) << 16;
    }
    for (uint32_t ln = 0; ln < 32; ln++) {
        const uint32_t g = ln >> 2, t = ln & 3u;
        for (int e = 0; e < HL; e++)
            for (uint32_t r = 0; r < 2; r++) {
                const uint32_t hl = hot_weight_pair(w[g + 8 * r][HL * t + (uint32_t)e]);
                uint16_t *col = pt.data() + hot_pt_at(e, 2 * t, g + 8 * r);
                col[0] = (uint16_t)hl;
                col[DQCU_HOT_PSTR] = (uint16_t)(hl >> 16);
            }
    }
    const uint32_t cm = (MV - 1) * 0x00010001u;
    for (int i = 0; i < 8; i++) {
        double A[16][16], B[HL][16][8];
        for (uint32_t ln = 0; ln < 32; ln++) {
            const uint32_t g = ln >> 2, t = ln & 3u;
            const uint32_t *vst = stg.data() + 64 * BK;
            uint32_t u0[BV], u4[BV];
            for (int k = 0; k < BV; k++) {
                u0[k] = vst[hot_stage_value_at(g, (uint32_t)k, t)];
                u4[k] = vst[hot_stage_value_at(g, (uint32_t)k, t + 4)];
            }
            const uint32_t ncm = cm | 0x80008000u;
            const uint32_t a[4] = {hot_value_operand_scaled<BV>(u0, 2 * i, cm, ncm),
                                   hot_value_operand_scaled<BV>(u0, 2 * i + 1, cm, ncm),
                                   hot_value_operand_scaled<BV>(u4, 2 * i, cm, ncm),
                                   hot_value_operand_scaled<BV>(u4, 2 * i + 1, cm, ncm)};
            for (int hf = 0; hf < 2; hf++) {
                A[g][2 * t + hf] = dqcu_f16_float((a[0] >> (16 * hf)) & 0xffffu);
                A[g + 8][2 * t + hf] = dqcu_f16_float((a[1] >> (16 * hf)) & 0xffffu);
                A[g][2 * t + 8 + hf] = dqcu_f16_float((a[2] >> (16 * hf)) & 0xffffu);
                A[g + 8][2 * t + 8 + hf] = dqcu_f16_float((a[3] >> (16 * hf)) & 0xffffu);
            }
            for (int e = 0; e < HL; e++) {
                const uint16_t *col = pt.data() + hot_pt_at(e, g, 2 * t);
                for (int hf = 0; hf < 2; hf++) {
                    B[e][2 * t + hf][g] = HL == 1 ? dqcu_f16_float((bt[0][ln] >> (16 * hf)) & 0xffffu)
                                                  : dqcu_f16_float(col[hf]);
                    B[e][2 * t + 8 + hf][g] = HL == 1 ? dqcu_f16_float((bt[1][ln] >> (16 * hf)) & 0xffffu)
                                                      : dqcu_f16_float(col[8 + hf]);
                }
            }
        }
        for (uint32_t ln = 0; ln < 32; ln++) {
            const uint32_t g = ln >> 2, t = ln & 3u;
            for (int e = 0; e < HL; e++) {
                const uint32_t h = HL * t + (uint32_t)e;
                if (h >= (uint32_t)G)
                    continue;
                for (int rr = 0; rr < 2; rr++) { /* rows g (c0 hi + c1 lo), g + 8 (c2 + c3) */
                    const uint32_t row = g + 8 * (uint32_t)rr, ch = 16 * g + 2 * (uint32_t)i + (uint32_t)rr;
                    double got = 0.0, want = 0.0, mag = 0.0;
                    for (int k = 0; k < 16; k++)
                        got += A[row][k] * (B[e][k][2 * t] + B[e][k][2 * t + 1]);
                    got = ldexp(got, -hot_value_scale<BV>(2 * i + rr)); /* the row's 2^z */
                    for (int tok = 0; tok < 16; tok++) {
                        const double v = ldexp(2.0 * mv[tok][ch] - (double)(MV - 1), -24);
                        want += (double)w[tok][h] * v;
                        mag += fabs((double)w[tok][h] * v);
                    }
                    EXPECT(fabs(got - want) <= mag * 0x1p-21, "G %d tile value lane %u head %u channel %u: %.9g vs %.9g",
                           G, ln, h, ch, got, want);
                }
            }
        }
    }
}

/* The hot kernels' grid (hot_block_role): every (split, KV head) of every plan shape attended by
 * exactly one row, window rows with their head group's hpb heads and tail rows with one head each,
 * the tail's rows [tail0, tail0 + kv_heads) for both placements, and the rows counted by
 * hot_grid_rows. */
static void check_grid(void)
{
    const uint32_t kvhs[] = {1, 2, 8, 16};
    for (uint32_t kvh : kvhs)
        for (uint32_t nhg = 1; nhg <= kvh; nhg *= 2)
            for (uint32_t nsplit : {0u, 1u, 3u, 17u})
                for (int last = 0; last < 2; last++) {
                    const uint32_t hpb = kvh / nhg, tail0 = last ? nsplit * nhg : 0u;
                    const uint32_t rows = hot_grid_rows(nsplit, nhg, kvh);
                    std::vector<int> seen((size_t)(nsplit + 1) * kvh, 0);
                    for (uint32_t y = 0; y < rows; y++) {
                        uint32_t split, kv0, kv1;
                        hot_block_role(nsplit, nhg, hpb, kvh, tail0, y, split, kv0, kv1);
                        const bool tail = y >= tail0 && y < tail0 + kvh;
                        EXPECT(split <= nsplit && kv0 < kv1 && kv1 <= kvh, "grid: row %u of %u -> split %u, heads [%u, %u)",
                               y, rows, split, kv0, kv1);
                        EXPECT((split == nsplit) == tail && kv1 - kv0 == (tail ? 1u : hpb),
                               "grid: kvh %u nhg %u nsplit %u tail0 %u: row %u -> split %u, heads [%u, %u)", kvh, nhg,
                               nsplit, tail0, y, split, kv0, kv1);
                        for (uint32_t h = kv0; h < kv1 && h < kvh && split <= nsplit; h++)
                            seen[(size_t)split * kvh + h]++;
                    }
                    for (size_t i = 0; i < seen.size(); i++)
                        EXPECT(seen[i] == 1, "grid: kvh %u nhg %u nsplit %u tail0 %u: split %zu head %zu attended %d times",
                               kvh, nhg, nsplit, tail0, i / kvh, i % kvh, seen[i]);
                }
}

int main(void)
{
    check_grid();
    check_digits();
    /* the warp kernel's fragments: every GQA group it takes, dq226's and the fixed-width widths */
    check_warp_tile<1, 3, 3>(8, 6);
    check_warp_tile<2, 3, 3>(8, 6);
    check_warp_tile<4, 3, 3>(8, 6);
    check_warp_tile<8, 3, 3>(8, 6);
    check_warp_tile<4, 4, 4>(16, 9);
    check_warp_tile<4, 3, 2>(6, 3);
    check_warp_tile<8, 2, 1>(3, 2);
    /* every width of keys and values, at the smallest and the largest M it holds */
    check_profile<1, 8>(2, 256);
    check_profile<2, 7>(3, 65);
    check_profile<2, 7>(4, 128);
    check_profile<3, 6>(5, 33);
    check_profile<3, 6>(8, 64);
    check_profile<4, 5>(9, 17);
    check_profile<4, 5>(16, 32);
    check_profile<5, 4>(17, 9);
    check_profile<5, 4>(32, 16);
    check_profile<6, 3>(33, 5);
    check_profile<6, 3>(64, 8);
    check_profile<7, 2>(65, 3);
    check_profile<7, 2>(128, 4);
    check_profile<8, 1>(256, 2);
    check_profile<3, 3>(6, 6);
    printf("emu_hot: %d failures\n", failures);
    return failures ? 1 : 0;
}
