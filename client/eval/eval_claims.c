/* The KVQuant++ claims table (eval_claims.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec_run.h"
#include "dquant/error.h"
#include "dquant/kvq.h"
#include "dquant/profile.h"
#include "eval_claims.h"
#include "eval_ppl.h"
#include "eval_rng.h"

const char *eval_verdict_name(eval_verdict v)
{
    switch (v) {
    case EVAL_AGREES:
        return "agrees";
    case EVAL_PARTLY:
        return "partly";
    case EVAL_DISAGREES:
        return "disagrees";
    default:
        return "not run";
    }
}

void eval_claims_opts_default(eval_claims_opts *o)
{
    memset(o, 0, sizeof *o);
    o->ppl_chunks = 8;
    o->bench_reps = 20;
    o->kmeans_samples = 100000;
    o->seed = 0x5eed2001;
}

enum {
    CLAIM_AWQ,
    CLAIM_DELTA,
    CLAIM_LOWRANK,
    CLAIM_PQ,
    CLAIM_KMEANS,
    CLAIM_KV_ASYM,
    CLAIM_BUCKETIZE,
    CLAIM_HUFFMAN,
    CLAIM_COUNT
};

uint32_t eval_claims_split(uint32_t tokens)
{
    return tokens / 2 < 256 && tokens >= 256 + 128 ? 256 : tokens / 2;
}

size_t eval_claims_count(void)
{
    return CLAIM_COUNT;
}

static const struct {
    const char *id, *claim, *paper;
} g_claims[CLAIM_COUNT] = {
    {"awq", "attention-weighted bit assignment cuts attention-weighted distortion at the same average bits",
     "-47% to -70% per layer (mean -56.5%)"},
    {"delta", "delta coding within windows lowers MSE for correlated streams", "1.1x to 2.2x lower MSE per layer"},
    {"lowrank", "rank-4 error correction of 2-bit keys", "-11% MSE at +7.4% storage; 96-97% of 2-bit dPPL recovered"},
    {"pq", "PQ (d/M = 4, b = 8) at 2 bits/dim matches 3-bit scalar quality", "2-bit storage, 3-bit quality"},
    {"kmeans", "k-means++ seeding lowers the initial MSE of 1-bit codebooks (d = 64, 100k samples)",
     "-75.1% at 1 bit, -58.5% at 2 bits"},
    {"kv_asym", "K/V asymmetric + delta + outlier values: V MSE at 0.5 fewer bits than 3-bit IP/IP",
     "-61.5% V MSE at 2.5 bits/dim; -95.4% vs 2-bit IP/IP"},
    {"bucketize", "binary-search bucketize vs argmin over centroids (N = 4096, d = 128)", "14x (2-bit) to 22x (4-bit)"},
    {"huffman", "Huffman coding of 4-bit Lloyd-Max indices (d = 128)", "-4% (entropy 3.816 bits)"},
};

static void add_value(eval_claim *r, const char *key, double v)
{
    if (r->nvalues == EVAL_CLAIM_VALUES)
        return;
    snprintf(r->values[r->nvalues].key, sizeof r->values[r->nvalues].key, "%s", key);
    r->values[r->nvalues++].value = v;
}

static void say(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *buf, size_t len, const char *fmt, ...)
{
    const size_t used = strlen(buf);
    if (used + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/* ---- coding one layer's slab with a named profile ---- */

typedef struct claim_ctx {
    const eval_data *d;
    size_t n;
    uint32_t half; /* calibration tokens [0, half), measured tokens [half, T) */
    uint64_t seed;
    char *err;
    size_t errlen;
} claim_ctx;

typedef struct coded_fig {
    double err2, ref2, bits;
} coded_fig;

/* Codes tokens [half, T) of data_kind in layer with the profile `name` as code_kind (a value slab
 * may be coded as keys: the IP quantizer on values). Calibrated profiles learn on [0, half). */
static int coded(const claim_ctx *c, const char *name, uint32_t layer, dq_kind data_kind, dq_kind code_kind,
                 coded_fig *f)
{
    const eval_data *d = c->d;
    dq_profile p;
    int rc = dq_profile_builtin(name, d->kv_heads, d->head_dim, &p);
    if (rc != DQ_OK)
        return eval_fail(c->err, c->errlen, rc, "profile %s at %u x %u: %s", name, d->kv_heads, d->head_dim,
                         dq_strerror(rc));
    dq_codec *codec = NULL;
    uint8_t *blob = NULL;
    size_t blob_len = 0;
    if (dq_profile_needs_calibration(&p)) {
        rc = dq_kvq_calibrate(&p, 1, eval_data_slab(d, DQ_KIND_K, 0, layer), eval_data_slab(d, DQ_KIND_V, 0, layer),
                              c->half, c->seed, &blob, &blob_len);
        if (rc == DQ_OK)
            rc = dq_codec_create_calibrated(&p, blob, blob_len, NULL, &codec);
        dq_kvq_free(blob);
    } else {
        rc = dq_codec_create(&p, NULL, &codec);
    }
    if (rc != DQ_OK)
        return eval_fail(c->err, c->errlen, rc, "codec %s: %s", name, dq_strerror(rc));
    const size_t ntok = d->tokens - c->half;
    const float *x = eval_data_slab(d, data_kind, 0, layer) + (size_t)c->half * c->n;
    float *xhat = malloc(ntok * c->n * sizeof *xhat);
    codec_rt_result rt;
    const dq_codec *view = dq_codec_layer(codec, 0);
    rc = xhat ? codec_roundtrip_codec(view ? view : codec, code_kind, x, ntok, xhat, NULL, &rt) : DQ_NOMEM;
    if (rc == DQ_OK) {
        memset(f, 0, sizeof *f);
        for (size_t i = 0; i < ntok * c->n; i++) {
            const double e = (double)xhat[i] - x[i];
            f->err2 += e * e;
            f->ref2 += (double)x[i] * x[i];
        }
        f->bits = rt.bits_per_value;
    } else {
        eval_fail(c->err, c->errlen, rc, "%s on layer %u: %s", name, layer, dq_strerror(rc));
    }
    free(xhat);
    dq_codec_free(codec);
    return rc;
}

static double nmse(const coded_fig *f)
{
    return f->ref2 > 0 ? f->err2 / f->ref2 : 0;
}

/* ---- the rows ---- */

static int key_coordinates(const claim_ctx *c, float *out, size_t count);

/* Every token of one layer's keys through the profile `name` (no calibration) into xhat. */
static int recon_all(const claim_ctx *c, const char *name, uint32_t layer, float *xhat)
{
    dq_profile p;
    dq_codec *codec = NULL;
    int rc = dq_profile_builtin(name, c->d->kv_heads, c->d->head_dim, &p);
    if (rc == DQ_OK)
        rc = dq_codec_create(&p, NULL, &codec);
    codec_rt_result rt;
    if (rc == DQ_OK)
        rc = codec_roundtrip_codec(codec, DQ_KIND_K, eval_data_slab(c->d, DQ_KIND_K, 0, layer), c->d->tokens, xhat,
                                   NULL, &rt);
    dq_codec_free(codec);
    if (rc != DQ_OK)
        return eval_fail(c->err, c->errlen, rc, "%s on layer %u: %s", name, layer, dq_strerror(rc));
    return DQ_OK;
}

/* Attention-weighted key distortion Σ_h Σ_t a_h,t ‖k_t − k̂_t‖² (KV head of h) for the query at
 * position T−1 over all T tokens: uniform lm3 vs dq_kvq_assign_bits' top half at lm4 and the rest
 * at lm2 (the same average bits: the records differ only in index bits). */
static int claim_awq(const claim_ctx *c, eval_claim *r)
{
    const eval_data *d = c->d;
    if (!d->q) {
        snprintf(r->ours, sizeof r->ours, "no queries in %s", d->name);
        say(r->note, sizeof r->note, "the dataset has no query file. ");
        return DQ_OK;
    }
    const uint32_t T = d->tokens, hd = d->head_dim, qh = d->q_heads, g = qh / d->kv_heads;
    const size_t n = c->n;
    float *k2 = malloc(T * n * sizeof *k2), *k3 = malloc(T * n * sizeof *k3), *k4 = malloc(T * n * sizeof *k4);
    double *a = malloc((size_t)qh * T * sizeof *a);
    uint8_t *tier = malloc(T);
    int rc = k2 && k3 && k4 && a && tier ? DQ_OK : eval_fail(c->err, c->errlen, DQ_NOMEM, "out of memory");
    double lo = INFINITY, hi = -INFINITY, sum = 0;
    for (uint32_t l = 0; rc == DQ_OK && l < d->layers; l++) {
        const float *K = eval_data_slab(d, DQ_KIND_K, 0, l);
        const float *q = d->q + ((size_t)l * T + (T - 1)) * qh * hd;
        if ((rc = dq_kvq_assign_bits(K, T, d->kv_heads, hd, q, qh, 1, 0.5f, tier)) != DQ_OK) {
            eval_fail(c->err, c->errlen, rc, "dq_kvq_assign_bits: %s", dq_strerror(rc));
            break;
        }
        if ((rc = recon_all(c, "lm2", l, k2)) != DQ_OK || (rc = recon_all(c, "lm3", l, k3)) != DQ_OK ||
            (rc = recon_all(c, "lm4", l, k4)) != DQ_OK)
            break;
        /* the query's attention per head (float64 softmax over all T tokens: the last query sees them all) */
        for (uint32_t h = 0; h < qh; h++) {
            const float *qv = q + (size_t)h * hd;
            double mx = -INFINITY, z = 0;
            for (uint32_t t = 0; t < T; t++) {
                const float *kv = K + (size_t)t * n + (size_t)(h / g) * hd;
                double s = 0;
                for (uint32_t j = 0; j < hd; j++)
                    s += (double)qv[j] * kv[j];
                a[(size_t)h * T + t] = s / sqrt((double)hd);
                mx = fmax(mx, a[(size_t)h * T + t]);
            }
            for (uint32_t t = 0; t < T; t++)
                z += a[(size_t)h * T + t] = exp(a[(size_t)h * T + t] - mx);
            for (uint32_t t = 0; t < T; t++)
                a[(size_t)h * T + t] /= z;
        }
        double du = 0, dw = 0;
        uint32_t nhi = 0;
        for (uint32_t t = 0; t < T; t++) {
            nhi += tier[t];
            const float *kw = tier[t] ? k4 : k2;
            for (uint32_t h = 0; h < qh; h++) {
                const size_t off = (size_t)t * n + (size_t)(h / g) * hd;
                double eu = 0, ew = 0;
                for (uint32_t j = 0; j < hd; j++) {
                    const double x = K[off + j];
                    eu += (x - k3[off + j]) * (x - k3[off + j]);
                    ew += (x - kw[off + j]) * (x - kw[off + j]);
                }
                du += a[(size_t)h * T + t] * eu;
                dw += a[(size_t)h * T + t] * ew;
            }
        }
        const double red = 1 - dw / du;
        lo = fmin(lo, red);
        hi = fmax(hi, red);
        sum += red;
        if (l == 0)
            add_value(r, "high_tier_fraction", (double)nhi / T);
    }
    free(k2);
    free(k3);
    free(k4);
    free(a);
    free(tier);
    if (rc != DQ_OK)
        return rc;
    const double mean = sum / d->layers;
    snprintf(r->ours, sizeof r->ours, "%+.1f%% to %+.1f%% per layer (mean %+.1f%%), lm4/lm2 split vs lm3, %u layers",
             -100 * hi, -100 * lo, -100 * mean, d->layers);
    add_value(r, "reduction_min", lo);
    add_value(r, "reduction_max", hi);
    add_value(r, "reduction_mean", mean);
    r->verdict = fabs(100 * mean - 56.5) <= 15 && lo > 0.3 ? EVAL_AGREES : mean > 0.2 ? EVAL_PARTLY : EVAL_DISAGREES;
    say(r->note, sizeof r->note,
        "The query at the last position (T = %u) ranks the tokens (dq_kvq_assign_bits: max over its %u heads) and "
        "weights the distortion (per head, its own softmax over all tokens); the top half gets 4 bits, the rest 2, "
        "against 3 bits for all (the same record size). ",
        T, qh);
    if (r->verdict != EVAL_AGREES)
        say(r->note, sizeof r->note,
            "The gain is bounded by how peaked attention is: with the mass on few tokens nearly all of it lands on "
            "4-bit tokens (2-bit MSE is about 16x 4-bit's). ");
    return DQ_OK;
}

/* Index frequencies of 4-bit Lloyd–Max codes: Shannon entropy and a length-limited Huffman code, on
 * the sphere marginal at d = 128 (the paper's setting) and on our rotated unit keys at d = head_dim. */
static int huffman_bits(const float *x, size_t count, uint32_t dim, double *entropy, double *huff)
{
    const float *cent, *bound;
    int rc = dq_kvq_codebook(4, dim, &cent, &bound);
    if (rc != DQ_OK)
        return rc;
    uint64_t freq[16] = {0}, bits = 0;
    for (size_t i = 0; i < count; i++)
        freq[dq_kvq_bucketize(x[i], bound, 15)]++;
    uint8_t len[16];
    if ((rc = dq_kvq_huffman_lengths(freq, 16, 24, len, &bits)) != DQ_OK)
        return rc;
    double h = 0;
    for (int s = 0; s < 16; s++)
        if (freq[s])
            h -= (double)freq[s] / (double)count * log2((double)freq[s] / (double)count);
    *entropy = h;
    *huff = (double)bits / (double)count;
    return DQ_OK;
}

static int claim_huffman(const claim_ctx *c, const eval_claims_opts *o, eval_claim *r)
{
    const size_t count = 2 * (size_t)o->kmeans_samples;
    float *syn = malloc(count * sizeof *syn), *real = malloc(count * sizeof *real);
    int rc = syn && real ? DQ_OK : DQ_NOMEM;
    uint64_t st = (c->seed ^ 0x9e37) | 1;
    for (size_t i = 0; rc == DQ_OK && i < count; i++) {
        double v[128], s = 0;
        for (int j = 0; j < 128; j++) {
            v[j] = rng_gauss(&st);
            s += v[j] * v[j];
        }
        syn[i] = (float)(v[0] / sqrt(s));
    }
    if (rc == DQ_OK)
        rc = key_coordinates(c, real, count);
    double h[2], b[2];
    if (rc == DQ_OK)
        rc = huffman_bits(syn, count, 128, &h[0], &b[0]);
    if (rc == DQ_OK)
        rc = huffman_bits(real, count, c->d->head_dim, &h[1], &b[1]);
    free(syn);
    free(real);
    if (rc != DQ_OK)
        return eval_fail(c->err, c->errlen, rc, "huffman: %s", dq_strerror(rc));
    snprintf(r->ours, sizeof r->ours,
             "sphere marginal d = 128: entropy %.3f, Huffman %.3f bits (%.1f%%); %s keys (d = %u): %.3f, %.3f "
             "(%.1f%%)",
             h[0], b[0], -100 * (1 - b[0] / 4), c->d->name, c->d->head_dim, h[1], b[1], -100 * (1 - b[1] / 4));
    add_value(r, "entropy_synthetic", h[0]);
    add_value(r, "huffman_synthetic", b[0]);
    add_value(r, "entropy_real", h[1]);
    add_value(r, "huffman_real", b[1]);
    const double save = 1 - b[1] / 4;
    r->verdict = save >= 0.02 && save <= 0.08 ? EVAL_AGREES : save > 0 ? EVAL_PARTLY : EVAL_DISAGREES;
    say(r->note, sizeof r->note,
        "%zu coordinates of unit head vectors after a Haar rotation, bucketized on the 4-bit Lloyd-Max codebook of "
        "their dimension; Huffman lengths by package-merge (<= 24 bits). The paper's 4%% is the entropy bound "
        "(3.816 bits); a Huffman code pays %.3f bits over our entropy. ",
        count, b[1] - h[1]);
    if (r->verdict != EVAL_AGREES)
        say(r->note, sizeof r->note, "Our indices are %s than the paper's marginal. ",
            save < 0.02 ? "closer to uniform" : "more skewed");
    return DQ_OK;
}

/* Ratio NMSE(lm3) / NMSE(lm3+d16) per layer, keys and values apart. */
static int claim_delta(const claim_ctx *c, eval_claim *r)
{
    double lo[2] = {INFINITY, INFINITY}, hi[2] = {0, 0};
    int same_v = 1;
    for (uint32_t l = 0; l < c->d->layers; l++)
        for (int k = 0; k < 2; k++) {
            coded_fig a, b;
            int rc = coded(c, "lm3", l, (dq_kind)k, (dq_kind)k, &a);
            if (rc == DQ_OK)
                rc = coded(c, "lm3+d16", l, (dq_kind)k, (dq_kind)k, &b);
            if (rc != DQ_OK)
                return rc;
            const double ratio = nmse(&a) / nmse(&b);
            lo[k] = fmin(lo[k], ratio);
            hi[k] = fmax(hi[k], ratio);
            if (k == 1 && a.err2 != b.err2)
                same_v = 0;
        }
    snprintf(r->ours, sizeof r->ours,
             "K %.2fx to %.2fx, V %.2fx to %.2fx per layer (%u layers, 3 bits, lm3 vs lm3+d16)", lo[0], hi[0], lo[1],
             hi[1], c->d->layers);
    add_value(r, "k_ratio_min", lo[0]);
    add_value(r, "k_ratio_max", hi[0]);
    add_value(r, "v_ratio_min", lo[1]);
    add_value(r, "v_ratio_max", hi[1]);
    const double best = fmax(hi[0], hi[1]), worst = fmin(lo[0], lo[1]);
    r->verdict = worst >= 1.05 && best <= 2.6 ? EVAL_AGREES : best >= 1.1 ? EVAL_PARTLY : EVAL_DISAGREES;
    say(r->note, sizeof r->note, "Anchors every 16 tokens and adaptively when |delta| > 0.5 |x| (the profile's tau). ");
    if (same_v)
        say(r->note, sizeof r->note,
            "Values: NMSE identical to lm3 in every layer: consecutive value vectors of %s are so weakly correlated "
            "that the tau rule re-anchors every value token (a delta is larger than half the vector). ",
            c->d->name);
    if (hi[0] < 1.1)
        say(r->note, sizeof r->note,
            "Keys: consecutive tokens of a byte-level model carry little shared structure, so the delta is about as "
            "large as the key and quantizing it gains little. ");
    else if (best > 2.2)
        say(r->note, sizeof r->note,
            "Keys of some layers gain more than the paper's 2.2x and others nothing: the gain is layer-specific. ");
    return DQ_OK;
}

/* lm2 vs lm2+lr4 keys; the ΔPPL part comes from the perplexity run. */
static int claim_lowrank_tensor(const claim_ctx *c, eval_claim *r, double *red_mean)
{
    double lo = INFINITY, hi = -INFINITY, sum = 0, bits0 = 0, bits1 = 0;
    for (uint32_t l = 0; l < c->d->layers; l++) {
        coded_fig a, b;
        int rc = coded(c, "lm2", l, DQ_KIND_K, DQ_KIND_K, &a);
        if (rc == DQ_OK)
            rc = coded(c, "lm2+lr4", l, DQ_KIND_K, DQ_KIND_K, &b);
        if (rc != DQ_OK)
            return rc;
        const double red = 1.0 - nmse(&b) / nmse(&a);
        lo = red < lo ? red : lo;
        hi = red > hi ? red : hi;
        sum += red;
        bits0 = a.bits;
        bits1 = b.bits;
    }
    *red_mean = sum / c->d->layers;
    /* the paper's 7.4% is r(T + d) / (T d): the factors against the float residual they replace */
    const double W = 128, nn = (double)c->n, R = 4;
    const double vs_float = R * (W + nn) / (W * nn);
    snprintf(r->ours, sizeof r->ours,
             "K MSE %+.1f%% to %+.1f%% (mean %+.1f%%) at %+.1f%% key storage (%.4f -> %.4f bits/value; r(W+n)/(Wn) = "
             "%.1f%%)",
             -100 * hi, -100 * lo, -100 * *red_mean, 100 * (bits1 / bits0 - 1), bits0, bits1, 100 * vs_float);
    add_value(r, "k_mse_reduction_mean", *red_mean);
    add_value(r, "k_storage_increase", bits1 / bits0 - 1);
    add_value(r, "storage_vs_float_residual", vs_float);
    say(r->note, sizeof r->note,
        "Storage: the paper's +7.4%% is r(T+d)/(Td) against the float residual (T = 360, d = 64); against the 2-bit "
        "cache itself our R x n fp16 factor per W = 128 tokens plus R fp16 per token is +%.0f%% of the key bits. ",
        100 * (bits1 / bits0 - 1));
    return DQ_OK;
}

/* pq(d/4)x8 vs lm2 / lm3, K and V. */
static int claim_pq_tensor(const claim_ctx *c, eval_claim *r, char *pqname, size_t pqlen, double nm[3][2],
                           double bits[3])
{
    snprintf(pqname, pqlen, "pq%ux8", c->d->head_dim / 4);
    const char *names[3] = {pqname, "lm2", "lm3"};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) {
            double e = 0, s = 0;
            for (uint32_t l = 0; l < c->d->layers; l++) {
                coded_fig f;
                int rc = coded(c, names[i], l, (dq_kind)k, (dq_kind)k, &f);
                if (rc != DQ_OK)
                    return rc;
                e += f.err2;
                s += f.ref2;
                bits[i] = f.bits;
            }
            nm[i][k] = e / s;
        }
    snprintf(r->ours, sizeof r->ours,
             "%s %.3f bits/value: K NMSE %.4f, V %.4f; lm2 %.3f bits: %.4f, %.4f; lm3 %.3f bits: %.4f, %.4f", pqname,
             bits[0], nm[0][0], nm[0][1], bits[1], nm[1][0], nm[1][1], bits[2], nm[2][0], nm[2][1]);
    add_value(r, "pq_nmse_k", nm[0][0]);
    add_value(r, "pq_nmse_v", nm[0][1]);
    add_value(r, "lm2_nmse_k", nm[1][0]);
    add_value(r, "lm3_nmse_k", nm[2][0]);
    add_value(r, "pq_bits", bits[0]);
    const double worst = fmax(nm[0][0] / nm[2][0], nm[0][1] / nm[2][1]);
    const double vs2 = fmax(nm[0][0] / nm[1][0], nm[0][1] / nm[1][1]);
    r->verdict = worst <= 1.25 ? EVAL_AGREES : vs2 < 1 ? EVAL_PARTLY : EVAL_DISAGREES;
    say(r->note, sizeof r->note,
        "Matched by sub-vector size (d/M = 4, 8-bit codes: 2 bits/dim of indices; the paper's M = 16 at d = 64); "
        "codebooks calibrated per layer on the calibration tokens, measured on the rest. 'Matches 3-bit' "
        "here: NMSE within 1.25x of lm3 for K and V. ");
    return DQ_OK;
}

/* Unit-norm head vectors of the keys, Haar-rotated: their coordinates, count samples evenly strided. */
static int key_coordinates(const claim_ctx *c, float *out, size_t count)
{
    const eval_data *d = c->d;
    const uint32_t hd = d->head_dim;
    float *rot = malloc((size_t)hd * hd * sizeof *rot), *y = malloc(hd * sizeof *y);
    int rc = rot && y ? dq_kvq_haar(hd, c->seed, rot) : DQ_NOMEM;
    const size_t vecs = (size_t)d->layers * d->tokens * d->kv_heads, total = vecs * hd;
    for (size_t i = 0; rc == DQ_OK && i < count; i++) {
        const size_t idx = (size_t)((double)i * (double)total / (double)count);
        const size_t vec = idx / hd, coord = idx % hd;
        const size_t layer = vec / ((size_t)d->tokens * d->kv_heads), rest = vec % ((size_t)d->tokens * d->kv_heads);
        const float *x = eval_data_slab(d, DQ_KIND_K, 0, (uint32_t)layer) + rest * hd;
        double nrm = 0;
        for (uint32_t j = 0; j < hd; j++)
            nrm += (double)x[j] * x[j];
        nrm = sqrt(nrm) + 1e-30;
        double s = 0;
        for (uint32_t j = 0; j < hd; j++)
            s += (double)rot[coord * hd + j] * x[j];
        out[i] = (float)(s / nrm);
    }
    free(rot);
    free(y);
    return rc;
}

/* Mean initial (seeding-only) MSE reduction of k-means++ over linspace for k centroids, 5 seeds. */
static int kmeans_reduction(const float *pts, size_t count, uint32_t k, uint64_t seed, double *red)
{
    float cent[256];
    double lin, pp, sum = 0;
    int rc = dq_kvq_kmeans_linspace(pts, count, 1, k, 0, cent, &lin);
    for (int s = 0; rc == DQ_OK && s < 5; s++) {
        rc = dq_kvq_kmeans(pts, count, 1, k, 0, seed + (uint64_t)s, cent, &pp);
        sum += pp;
    }
    *red = 1.0 - sum / 5 / lin;
    return rc;
}

static int claim_kmeans(const claim_ctx *c, const eval_claims_opts *o, eval_claim *r)
{
    const size_t count = o->kmeans_samples;
    float *syn = malloc(count * sizeof *syn), *real = malloc(count * sizeof *real);
    int rc = syn && real ? DQ_OK : DQ_NOMEM;
    /* the paper's setting: one coordinate of uniformly random unit vectors in R^64 */
    uint64_t st = c->seed | 1;
    for (size_t i = 0; rc == DQ_OK && i < count; i++) {
        double v[64], s = 0;
        for (int j = 0; j < 64; j++) {
            v[j] = rng_gauss(&st);
            s += v[j] * v[j];
        }
        syn[i] = (float)(v[0] / sqrt(s));
    }
    if (rc == DQ_OK)
        rc = key_coordinates(c, real, count);
    double red[2][2] = {{0}};
    for (int b = 0; rc == DQ_OK && b < 2; b++) {
        rc = kmeans_reduction(syn, count, 2u << b, c->seed, &red[0][b]);
        if (rc == DQ_OK)
            rc = kmeans_reduction(real, count, 2u << b, c->seed, &red[1][b]);
    }
    free(syn);
    free(real);
    if (rc != DQ_OK)
        return eval_fail(c->err, c->errlen, rc, "k-means: %s", dq_strerror(rc));
    snprintf(r->ours, sizeof r->ours,
             "d = 64 sphere marginal: %.1f%% at 1 bit, %.1f%% at 2 bits; %s keys (d = %u, rotated): %.1f%%, %.1f%%",
             -100 * red[0][0], -100 * red[0][1], c->d->name, c->d->head_dim, -100 * red[1][0], -100 * red[1][1]);
    add_value(r, "synthetic_1bit", red[0][0]);
    add_value(r, "synthetic_2bit", red[0][1]);
    add_value(r, "real_1bit", red[1][0]);
    add_value(r, "real_2bit", red[1][1]);
    const double gap = fabs(100 * red[0][0] - 75.1);
    r->verdict = gap <= 10 ? EVAL_AGREES : red[0][0] > 0 ? EVAL_PARTLY : EVAL_DISAGREES;
    say(r->note, sizeof r->note,
        "Initial MSE after seeding only (no Lloyd iteration), %zu samples, k-means++ averaged over 5 seeds; the "
        "'before' is centroids evenly spaced on [min, max]. ",
        count);
    if (r->verdict != EVAL_AGREES)
        say(r->note, sizeof r->note,
            "The size of the gain depends on the linspace baseline: [min, max] of 100k samples is set by the rare "
            "extremes, so its 2 centroids sit far out in the tails. ");
    return DQ_OK;
}

/* V: IP quantizer at 3 bits (ip3's key path on values: the paper's symmetric IP/IP) vs ol3+d16 values
 * (outliers at 4 bits, the rest at 2: 2.5 bits/dim, delta + outliers, MSE quantizer), and ip2. */
static int claim_kv_asym(const claim_ctx *c, eval_claim *r)
{
    const char *names[3] = {"ip3", "ol3+d16", "ip2"};
    const dq_kind as[3] = {DQ_KIND_K, DQ_KIND_V, DQ_KIND_K};
    double nm[3], bits[3];
    for (int i = 0; i < 3; i++) {
        double e = 0, s = 0;
        for (uint32_t l = 0; l < c->d->layers; l++) {
            coded_fig f;
            int rc = coded(c, names[i], l, DQ_KIND_V, as[i], &f);
            if (rc != DQ_OK)
                return rc;
            e += f.err2;
            s += f.ref2;
            bits[i] = f.bits;
        }
        nm[i] = e / s;
    }
    /* the same without deltas: does the delta part do anything for values? */
    double e_ol = 0, e_old = 0;
    for (uint32_t l = 0; l < c->d->layers; l++) {
        coded_fig f, g;
        int rc = coded(c, "ol3", l, DQ_KIND_V, DQ_KIND_V, &f);
        if (rc == DQ_OK)
            rc = coded(c, "ol3+d16", l, DQ_KIND_V, DQ_KIND_V, &g);
        if (rc != DQ_OK)
            return rc;
        e_ol += f.err2;
        e_old += g.err2;
    }
    if (e_ol == e_old)
        say(r->note, sizeof r->note,
            "The delta part changes nothing for these values (ol3 and ol3+d16 decode identically: every value "
            "token re-anchors, row 2), so the gain is the outlier split and the MSE quantizer. ");
    const double red3 = 1 - nm[1] / nm[0], red2 = 1 - nm[1] / nm[2];
    snprintf(r->ours, sizeof r->ours,
             "V NMSE: IP/IP 3-bit %.4f (%.3f bits/value), delta+outlier MSE 2.5-bit %.4f (%.3f) = %+.1f%%; vs IP/IP "
             "2-bit %.4f (%.3f): %+.1f%%",
             nm[0], bits[0], nm[1], bits[1], -100 * red3, nm[2], bits[2], -100 * red2);
    add_value(r, "v_nmse_ip3", nm[0]);
    add_value(r, "v_nmse_ol3_d16", nm[1]);
    add_value(r, "v_nmse_ip2", nm[2]);
    add_value(r, "reduction_vs_ip3", red3);
    add_value(r, "reduction_vs_ip2", red2);
    r->verdict = fabs(100 * red3 - 61.5) <= 15 ? EVAL_AGREES : red3 > 0 ? EVAL_PARTLY : EVAL_DISAGREES;
    say(r->note, sizeof r->note,
        "IP/IP values are the ipB key quantizer run on the values (lm at B-1 bits + 1-bit QJL); ol3+d16 keeps d/4 "
        "calibrated outlier channels at 4 bits and the rest at 2 (2.5 bits/dim before norms), deltas in windows. ");
    return DQ_OK;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int claim_bucketize(const claim_ctx *c, const eval_claims_opts *o, eval_claim *r)
{
    const size_t N = 4096 * 128;
    float *x = malloc(N * sizeof *x);
    if (!x)
        return eval_fail(c->err, c->errlen, DQ_NOMEM, "out of memory");
    uint64_t st = c->seed | 1;
    for (size_t i = 0; i < N; i++)
        x[i] = (float)(rng_gauss(&st) / sqrt(128.0));
    double speed[2];
    uint64_t check[2][2] = {{0}};
    for (int b = 0; b < 2; b++) {
        const uint32_t bits = b ? 4 : 2, k = 1u << bits;
        const float *cent, *bound;
        int rc = dq_kvq_codebook(bits, 128, &cent, &bound);
        if (rc != DQ_OK) {
            free(x);
            return eval_fail(c->err, c->errlen, rc, "codebook: %s", dq_strerror(rc));
        }
        double best[2] = {INFINITY, INFINITY};
        for (uint32_t rep = 0; rep < (o->bench_reps ? o->bench_reps : 1); rep++) {
            double t0 = now_s();
            uint64_t s0 = 0, s1 = 0;
            for (size_t i = 0; i < N; i++)
                s0 += dq_kvq_bucketize(x[i], bound, k - 1);
            double t1 = now_s();
            for (size_t i = 0; i < N; i++)
                s1 += dq_kvq_nearest_argmin(x[i], cent, k);
            double t2 = now_s();
            best[0] = fmin(best[0], t1 - t0);
            best[1] = fmin(best[1], t2 - t1);
            check[b][0] = s0;
            check[b][1] = s1;
        }
        speed[b] = best[1] / best[0];
    }
    free(x);
    snprintf(r->ours, sizeof r->ours, "%.2fx at 2 bits, %.2fx at 4 bits (C, one value per call, best of %u)", speed[0],
             speed[1], o->bench_reps);
    add_value(r, "speedup_2bit", speed[0]);
    add_value(r, "speedup_4bit", speed[1]);
    r->verdict = speed[0] >= 10 && speed[1] >= 10 ? EVAL_AGREES : speed[1] > 1.2 ? EVAL_PARTLY : EVAL_DISAGREES;
    say(r->note, sizeof r->note,
        "Both paths give the same indices (sums %llu/%llu at 4 bits). The paper's argmin built an (N, d, k) PyTorch "
        "tensor; a C argmin over k <= 16 centroids allocates nothing, so what is left is a branch-free search "
        "(log2 k conditional moves) against k exact distances with data-dependent branches; the ratio moves with "
        "the machine's branch predictor and load. ",
        (unsigned long long)check[1][0], (unsigned long long)check[1][1]);
    if (check[0][0] != check[0][1] || check[1][0] != check[1][1])
        say(r->note, sizeof r->note, "WARNING: the two paths disagree. ");
    return DQ_OK;
}

/* The ΔPPL figures of the low-rank and PQ rows: one protocol run of lm2, lm2+lr4, lm3 and the PQ. */
static int ppl_rows(const eval_model *m, const struct eval_text *t, const eval_claims_opts *o, const char *pqname,
                    eval_ppl_result res[4], uint32_t *chunks, char *err, size_t errlen)
{
    const eval_model_config *cfg = eval_model_cfg(m);
    const char *names[4] = {"lm2", "lm2+lr4", "lm3", pqname};
    eval_ppl_codec codecs[4];
    memset(codecs, 0, sizeof codecs);
    for (int i = 0; i < 4; i++) {
        int rc = eval_codec_parse(names[i], cfg->kv_heads, cfg->head_dim, &codecs[i].codec, err, errlen);
        if (rc != DQ_OK)
            return rc;
    }
    eval_ppl_opts po;
    eval_ppl_opts_default(&po);
    po.chunks = o->ppl_chunks;
    po.resamples = 1000;
    po.seed = o->seed;
    if (eval_ppl_fit(&po, t->len) != DQ_OK)
        return eval_fail(err, errlen, DQ_OUT_OF_BOUNDS, "the held-out text holds no chunk");
    *chunks = po.chunks;
    return eval_ppl_run(m, t, codecs, 4, &po, res, err, errlen);
}

int eval_claims_run(const eval_data *d, const eval_model *m, const struct eval_text *t, const eval_claims_opts *o,
                    eval_claim *rows, char *err, size_t errlen)
{
    memset(rows, 0, CLAIM_COUNT * sizeof *rows);
    for (int i = 0; i < CLAIM_COUNT; i++) {
        rows[i].id = g_claims[i].id;
        rows[i].claim = g_claims[i].claim;
        rows[i].paper = g_claims[i].paper;
        rows[i].verdict = EVAL_NOT_RUN;
    }
    if (o->kmeans_samples < 1000)
        return eval_fail(err, errlen, DQ_INVALID_ARGUMENT, "kmeans_samples %u: at least 1000", o->kmeans_samples);
    if (d->tokens < 128)
        return eval_fail(err, errlen, DQ_SHAPE, "%s: %u tokens, the claims need >= 128", d->name, d->tokens);
    /* PQ calibration wants at least 2^8 tokens */
    const uint32_t half = eval_claims_split(d->tokens);
    claim_ctx c = {.d = d, .n = eval_data_stream_len(d), .half = half, .seed = o->seed, .err = err, .errlen = errlen};
    int rc;
    if ((rc = claim_awq(&c, &rows[CLAIM_AWQ])) != DQ_OK)
        return rc;
    if ((rc = claim_huffman(&c, o, &rows[CLAIM_HUFFMAN])) != DQ_OK)
        return rc;
    if ((rc = claim_delta(&c, &rows[CLAIM_DELTA])) != DQ_OK)
        return rc;
    double lr_red;
    if ((rc = claim_lowrank_tensor(&c, &rows[CLAIM_LOWRANK], &lr_red)) != DQ_OK)
        return rc;
    char pqname[32];
    double pq_nm[3][2], pq_bits[3];
    if ((rc = claim_pq_tensor(&c, &rows[CLAIM_PQ], pqname, sizeof pqname, pq_nm, pq_bits)) != DQ_OK)
        return rc;
    if ((rc = claim_kmeans(&c, o, &rows[CLAIM_KMEANS])) != DQ_OK)
        return rc;
    if ((rc = claim_kv_asym(&c, &rows[CLAIM_KV_ASYM])) != DQ_OK)
        return rc;
    if ((rc = claim_bucketize(&c, o, &rows[CLAIM_BUCKETIZE])) != DQ_OK)
        return rc;

    /* the ΔPPL parts */
    eval_claim *lr = &rows[CLAIM_LOWRANK], *pq = &rows[CLAIM_PQ];
    const int mse_ok = lr_red >= 0.05 && lr_red <= 0.2;
    if (m && t && o->ppl_chunks) {
        eval_ppl_result res[4];
        uint32_t chunks = 0;
        if ((rc = ppl_rows(m, t, o, pqname, res, &chunks, err, errlen)) != DQ_OK)
            return rc;
        for (int i = 0; i < 3; i++)
            if (res[i].rc != DQ_OK)
                return eval_fail(err, errlen, res[i].rc, "%s: %s", res[i].label, res[i].why);
        const double rec_ppl = res[0].dppl > 0 ? 1 - res[1].dppl / res[0].dppl : NAN;
        const double rec_kl = 1 - res[1].kl.est / res[0].kl.est;
        say(lr->ours, sizeof lr->ours, "; %u chunks: dPPL lm2 %+.4f, +lr4 %+.4f; KL %.4f -> %.4f (%.0f%% recovered)",
            chunks, res[0].dppl, res[1].dppl, res[0].kl.est, res[1].kl.est, 100 * rec_kl);
        add_value(lr, "dppl_lm2", res[0].dppl);
        add_value(lr, "dppl_lm2_lr4", res[1].dppl);
        add_value(lr, "kl_recovered", rec_kl);
        lr->verdict = mse_ok && rec_kl >= 0.8 ? EVAL_AGREES : (lr_red > 0 && rec_kl > 0) ? EVAL_PARTLY : EVAL_DISAGREES;
        say(lr->note, sizeof lr->note,
            "PPL_fp32 = %.3f: 2-bit scalar does not break this model (dPPL lm2 %+.3f vs distilgpt2's +276), so the "
            "recovery is judged on the KL to the fp32 model%s. ",
            res[0].ppl_ref, res[0].dppl,
            isnan(rec_ppl) ? " (dPPL of lm2 is not positive: no dPPL recovery to compute)" : "");
        if (res[3].rc == DQ_OK) {
            say(pq->ours, sizeof pq->ours, "; KL %s %.4f, lm2 %.4f, lm3 %.4f", pqname, res[3].kl.est, res[0].kl.est,
                res[2].kl.est);
            add_value(pq, "kl_pq", res[3].kl.est);
            add_value(pq, "kl_lm3", res[2].kl.est);
            if (pq->verdict == EVAL_AGREES && res[3].kl.est > 1.25 * res[2].kl.est)
                pq->verdict = EVAL_PARTLY;
        } else {
            say(pq->note, sizeof pq->note, "KL not measured: %s. ", res[3].why);
        }
    } else {
        lr->verdict = mse_ok ? EVAL_PARTLY : lr_red > 0 ? EVAL_PARTLY : EVAL_DISAGREES;
        say(lr->note, sizeof lr->note, "dPPL not run (no model or --claims-chunks 0). ");
    }
    (void)pq_nm;
    (void)pq_bits;
    return DQ_OK;
}
