/* Per-layer calibration of the KVQuant++ family (dquant/kvq.h): the serialized calibration, its
 * validation, dq_kvq_calibrate, and calibrated codecs with one view per layer.
 *
 * Calibration blob ("DQKC", little endian):
 *   offset 0   "DQKC"
 *          4   u32 version (1)
 *          8   u32 layers L (1..65536)
 *         12   u32 kv_heads H, 16 u32 head_dim d, 20 u32 variant, 24 u32 bits K, 28 u32 bits V,
 *         32   u32 outliers per head O, 36 u32 PQ subspaces M, 40 u32 delta anchor interval (the
 *              statistics were taken on consecutive differences when it is not 0)
 *         44   u32 table format: 1 = PQ codebooks in fp16
 *         48   per layer, per kind (K then V):
 *                outliers: H × O u16 channel indices, strictly ascending per head, < d
 *                PQ: M × 2^B × (d / M) fp16 codebook (subspace, entry, coordinate), B = bits of
 *                the kind; entries are unit-sphere sub-vectors (vectors are normalized per head)
 *              nothing for the other variants
 *   end − 8    u64 xxHash64 (seed 0) of every byte before it; the profile's kvq_calib_hash.
 * Codebooks and channel sets are per model, not per token: they are not counted in bits/value. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "codec_internal.h"
#include "dquant/kvq.h"

#define KVQC_HEADER 48u
#define KVQC_VERSION 1u
#define KVQC_FMT_FP16 1u
#define KVQC_MAX_LAYERS 65536u
#define KVQC_MIN_TOKENS 64u
#define KVQC_PQ_MAX_POINTS 4096u
#define KVQC_PQ_ITERS 12u

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint8_t *wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + 4;
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

typedef struct calib_hdr {
    uint32_t layers, heads, dim, variant, bits[2], outliers, pq_m, anchor, fmt;
} calib_hdr;

/* Table bytes of one layer and kind; 0 when the variant has none. */
static uint64_t table_bytes(const calib_hdr *h, int kind)
{
    if (h->variant == DQ_KVQ_OUTLIER)
        return 2ull * h->heads * h->outliers;
    if (h->variant == DQ_KVQ_PQ)
        return 2ull * ((uint64_t)1 << h->bits[kind]) * h->dim;
    return 0;
}

static uint64_t layer_bytes(const calib_hdr *h)
{
    return table_bytes(h, 0) + table_bytes(h, 1);
}

static void hdr_from_profile(const dq_profile *p, uint32_t layers, calib_hdr *h)
{
    memset(h, 0, sizeof *h);
    h->layers = layers;
    h->heads = p->kv_heads;
    h->dim = p->head_dim;
    h->variant = p->kvq_variant;
    h->bits[0] = p->bits[0];
    h->bits[1] = p->bits[1];
    h->outliers = p->kvq_outliers;
    h->pq_m = p->kvq_pq_m;
    h->anchor = p->kvq_anchor;
    h->fmt = KVQC_FMT_FP16;
}

int dq_kvq_calibration_check(const dq_profile *p, const uint8_t *calib, size_t len, uint32_t *layers)
{
    DQ_RETURN_IF(!p || !calib, DQ_INVALID_ARGUMENT);
    DQ_FORWARD_IF_ERROR(dq_profile_validate(p));
    DQ_RETURN_IF(p->codec_type != DQ_CODEC_KVQ, DQ_PROFILE);
    DQ_RETURN_IF(len < KVQC_HEADER + 8, DQ_TRUNCATED);
    DQ_RETURN_IF(memcmp(calib, "DQKC", 4) != 0, DQ_CORRUPT);
    DQ_RETURN_IF(rd32(calib + 4) != KVQC_VERSION, DQ_VERSION);
    calib_hdr h;
    h.layers = rd32(calib + 8);
    h.heads = rd32(calib + 12);
    h.dim = rd32(calib + 16);
    h.variant = rd32(calib + 20);
    h.bits[0] = rd32(calib + 24);
    h.bits[1] = rd32(calib + 28);
    h.outliers = rd32(calib + 32);
    h.pq_m = rd32(calib + 36);
    h.anchor = rd32(calib + 40);
    h.fmt = rd32(calib + 44);
    /* the fields that set the length, bounded before any arithmetic */
    DQ_RETURN_IF(h.layers < 1 || h.layers > KVQC_MAX_LAYERS || h.heads < 1 || h.dim < 1 ||
                     (uint64_t)h.heads * h.dim > DQ_MAX_STREAM || h.variant > DQ_KVQ_PQ || h.bits[0] > 8 ||
                     h.bits[1] > 8 || h.outliers > h.dim || h.fmt != KVQC_FMT_FP16,
                 DQ_CORRUPT);
    const uint64_t need = KVQC_HEADER + (uint64_t)h.layers * layer_bytes(&h) + 8;
    DQ_RETURN_IF(len < need, DQ_TRUNCATED);
    DQ_RETURN_IF(len > need, DQ_CORRUPT);
    const uint64_t hash = XXH64(calib, len - 8, 0);
    DQ_RETURN_IF(rd64(calib + len - 8) != hash, DQ_CORRUPT);
    DQ_RETURN_IF(h.heads != p->kv_heads || h.dim != p->head_dim || h.variant != p->kvq_variant ||
                     h.bits[0] != p->bits[0] || h.bits[1] != p->bits[1] || h.outliers != p->kvq_outliers ||
                     h.pq_m != p->kvq_pq_m || h.anchor != p->kvq_anchor,
                 DQ_PROFILE);
    DQ_RETURN_IF(p->kvq_layers != h.layers || p->kvq_calib_hash != hash, DQ_PROFILE);
    /* the tables themselves */
    const uint8_t *q = calib + KVQC_HEADER;
    for (uint32_t l = 0; l < h.layers; l++)
        for (int k = 0; k < 2; k++) {
            if (h.variant == DQ_KVQ_OUTLIER) {
                for (uint32_t hh = 0; hh < h.heads; hh++) {
                    int32_t last = -1;
                    for (uint32_t i = 0; i < h.outliers; i++, q += 2) {
                        const int32_t ch = dq__get_u16(q);
                        DQ_RETURN_IF(ch <= last || (uint32_t)ch >= h.dim, DQ_CORRUPT);
                        last = ch;
                    }
                }
            } else if (h.variant == DQ_KVQ_PQ) {
                const uint64_t cnt = ((uint64_t)1 << h.bits[k]) * h.dim;
                for (uint64_t i = 0; i < cnt; i++, q += 2)
                    DQ_RETURN_IF((dq__get_u16(q) & 0x7c00u) == 0x7c00u, DQ_CORRUPT);
            }
        }
    if (layers)
        *layers = h.layers;
    return DQ_OK;
}

void dq_kvq_free(void *p)
{
    free(p);
}

static int finite_all(const float *x, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* Outlier channels of one head: the `o` largest variances over the samples (ties: lower index),
 * written ascending. var: d doubles of scratch. */
static void pick_outliers(const double *var, uint32_t d, uint32_t o, uint8_t *out)
{
    uint8_t *taken = calloc(d, 1);
    if (!taken)
        return;
    for (uint32_t i = 0; i < o; i++) {
        uint32_t best = d;
        for (uint32_t j = 0; j < d; j++)
            if (!taken[j] && (best == d || var[j] > var[best]))
                best = j;
        taken[best] = 1;
    }
    uint32_t w = 0;
    for (uint32_t j = 0; j < d; j++)
        if (taken[j]) {
            dq__put_u16(out + 2 * w, (uint16_t)j);
            w++;
        }
    free(taken);
}

int dq_kvq_calibrate(dq_profile *p, uint32_t layers, const float *k, const float *v, size_t tokens, uint64_t seed,
                     uint8_t **calib, size_t *calib_len)
{
    DQ_RETURN_IF(!p || !k || !v || !calib || !calib_len, DQ_INVALID_ARGUMENT);
    *calib = NULL;
    *calib_len = 0;
    DQ_FORWARD_IF_ERROR(dq_profile_validate(p));
    DQ_RETURN_IF(p->codec_type != DQ_CODEC_KVQ, DQ_PROFILE);
    DQ_RETURN_IF(layers < 1 || layers > KVQC_MAX_LAYERS, DQ_INVALID_ARGUMENT);
    const uint32_t H = p->kv_heads, d = p->head_dim;
    const size_t n = (size_t)H * d;
    DQ_RETURN_IF(tokens < KVQC_MIN_TOKENS || tokens > ((size_t)1 << 40) / n / layers, DQ_INVALID_ARGUMENT);
    if (p->kvq_variant == DQ_KVQ_PQ)
        DQ_RETURN_IF(tokens < (1u << p->bits[0]) || tokens < (1u << p->bits[1]), DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!finite_all(k, layers * tokens * n) || !finite_all(v, layers * tokens * n), DQ_NONFINITE);

    calib_hdr h;
    hdr_from_profile(p, layers, &h);
    const size_t len = KVQC_HEADER + (size_t)layers * layer_bytes(&h) + 8;
    uint8_t *blob = calloc(len, 1);
    DQ_RETURN_IF(!blob, DQ_NOMEM);
    memcpy(blob, "DQKC", 4);
    uint8_t *q = wr32(blob + 4, KVQC_VERSION);
    const uint32_t f[] = {h.layers,  h.heads,    h.dim,  h.variant, h.bits[0],
                          h.bits[1], h.outliers, h.pq_m, h.anchor,  h.fmt};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        q = wr32(q, f[i]);

    /* a codec of the same shape for the rotations (PQ), without tables */
    dq_profile tp = *p;
    tp.kvq_layers = 0;
    tp.kvq_calib_hash = 0;
    dq_codec *c = NULL;
    const int delta = p->kvq_anchor > 0;
    const size_t S = delta ? tokens - 1 : tokens; /* samples: tokens, or consecutive differences */
    int rc = dq__codec_make(&tp, NULL, &c);
    double *var = NULL;
    float *samp = NULL, *pts = NULL, *cent = NULL, *y = NULL;
    if (rc == DQ_OK) {
        var = malloc(sizeof(double) * 2 * d);
        samp = malloc(sizeof(float) * n);
        y = malloc(sizeof(float) * 4 * d);
        if (p->kvq_variant == DQ_KVQ_PQ) {
            pts = malloc(sizeof(float) * S * n);
            cent = malloc(sizeof(float) * ((size_t)1 << 8) * d);
        }
        if (!var || !samp || !y || (p->kvq_variant == DQ_KVQ_PQ && (!pts || !cent)))
            rc = DQ_NOMEM;
    }
    for (uint32_t l = 0; l < layers && rc == DQ_OK; l++) {
        for (int kind = 0; kind < 2 && rc == DQ_OK; kind++) {
            const float *X = (kind == 0 ? k : v) + (size_t)l * tokens * n;
            if (h.variant == DQ_KVQ_OUTLIER) {
                /* variance of each raw channel (of the deltas for "+dN") */
                for (uint32_t hh = 0; hh < H; hh++) {
                    double *mean = var + d;
                    for (uint32_t j = 0; j < d; j++)
                        mean[j] = var[j] = 0;
                    for (size_t t = 0; t < S; t++)
                        for (uint32_t j = 0; j < d; j++) {
                            const size_t i = (size_t)hh * d + j;
                            double x = delta ? (double)X[(t + 1) * n + i] - X[t * n + i] : X[t * n + i];
                            mean[j] += x;
                            var[j] += x * x;
                        }
                    for (uint32_t j = 0; j < d; j++)
                        var[j] = var[j] / (double)S - (mean[j] / (double)S) * (mean[j] / (double)S);
                    pick_outliers(var, d, h.outliers, q);
                    q += 2u * h.outliers;
                }
            } else if (h.variant == DQ_KVQ_PQ) {
                /* rotated, normalized head vectors (of the deltas for "+dN") */
                size_t cnt = 0;
                for (size_t t = 0; t < S; t++) {
                    for (size_t i = 0; i < n; i++)
                        samp[i] = delta ? X[(t + 1) * n + i] - X[t * n + i] : X[t * n + i];
                    for (uint32_t hh = 0; hh < H; hh++) {
                        float *dst = pts + cnt * d;
                        dq__kvq_head_forward(c, kind, hh, samp + (size_t)hh * d, dst, y);
                        double ss = 0;
                        for (uint32_t j = 0; j < d; j++)
                            ss += (double)dst[j] * dst[j];
                        if (!(ss > 0))
                            continue;
                        const float inv = (float)(1.0 / sqrt(ss));
                        for (uint32_t j = 0; j < d; j++)
                            dst[j] *= inv;
                        cnt++;
                    }
                }
                const uint32_t M = h.pq_m, B = h.bits[kind], K = 1u << B, ds = d / M;
                /* at most KVQC_PQ_MAX_POINTS points per subspace, evenly strided */
                const size_t stride = cnt > KVQC_PQ_MAX_POINTS ? (cnt + KVQC_PQ_MAX_POINTS - 1) / KVQC_PQ_MAX_POINTS
                                                               : 1;
                const size_t use = (cnt + stride - 1) / stride;
                if (use < K) {
                    rc = DQ_INVALID_ARGUMENT; /* too few non-zero samples for the codebook */
                    break;
                }
                float *sub = malloc(sizeof(float) * use * ds);
                if (!sub) {
                    rc = DQ_NOMEM;
                    break;
                }
                for (uint32_t m = 0; m < M && rc == DQ_OK; m++) {
                    for (size_t i = 0; i < use; i++)
                        memcpy(sub + i * ds, pts + i * stride * d + (size_t)m * ds, sizeof(float) * ds);
                    rc = dq_kvq_kmeans(sub, use, ds, K, KVQC_PQ_ITERS,
                                       seed ^ ((uint64_t)l << 32 | (uint64_t)kind << 16 | m), cent, NULL);
                    for (size_t i = 0; i < (size_t)K * ds && rc == DQ_OK; i++, q += 2)
                        dq__put_u16(q, dq_f32_to_f16(cent[i]));
                }
                free(sub);
            }
        }
    }
    dq_codec_free(c);
    free(var);
    free(samp);
    free(pts);
    free(cent);
    free(y);
    if (rc != DQ_OK) {
        free(blob);
        return rc;
    }
    const uint64_t hash = XXH64(blob, len - 8, 0);
    wr32(blob + len - 8, (uint32_t)hash);
    wr32(blob + len - 4, (uint32_t)(hash >> 32));
    p->kvq_layers = layers;
    p->kvq_calib_hash = hash;
    *calib = blob;
    *calib_len = len;
    return DQ_OK;
}

int dq_codec_create_calibrated(const dq_profile *profile, const uint8_t *calib, size_t calib_len,
                               const dq_allocator *alloc, dq_codec **out)
{
    DQ_RETURN_IF(!profile || !out, DQ_INVALID_ARGUMENT);
    *out = NULL;
    if (!calib)
        return dq_codec_create(profile, alloc, out);
    uint32_t layers = 0;
    DQ_FORWARD_IF_ERROR(dq_kvq_calibration_check(profile, calib, calib_len, &layers));
    dq_codec *c = NULL;
    DQ_FORWARD_IF_ERROR(dq__codec_make(profile, alloc, &c));
    const dq_allocator *a = &c->alloc;
    calib_hdr h;
    hdr_from_profile(profile, layers, &h);
    const uint32_t H = h.heads, d = h.dim;
    /* per layer and kind: outliers: the H × d channel order (outliers first); PQ: float codebooks */
    size_t per_kind[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        if (h.variant == DQ_KVQ_OUTLIER)
            per_kind[k] = sizeof(uint16_t) * H * d;
        else if (h.variant == DQ_KVQ_PQ)
            per_kind[k] = sizeof(float) * ((size_t)1 << h.bits[k]) * d;
        per_kind[k] = (per_kind[k] + 63) & ~(size_t)63;
    }
    const size_t per_layer = per_kind[0] + per_kind[1];
    c->views = dq__alloc(a, sizeof(dq_codec) * layers);
    if (per_layer)
        c->kvq_mem = dq__alloc(a, per_layer * layers);
    if (!c->views || (per_layer && !c->kvq_mem)) {
        dq_codec_free(c);
        return DQ_NOMEM;
    }
    const uint8_t *q = calib + KVQC_HEADER;
    uint8_t *mem = c->kvq_mem;
    for (uint32_t l = 0; l < layers; l++) {
        dq_codec *vw = &c->views[l];
        *vw = *c;
        vw->root = c;
        vw->views = NULL;
        vw->nviews = 0;
        vw->kvq_mem = NULL;
        for (int k = 0; k < 2 && per_layer; k++) {
            uint8_t *tab = mem + (size_t)l * per_layer + (k ? per_kind[0] : 0);
            if (h.variant == DQ_KVQ_OUTLIER) {
                uint16_t *perm = (uint16_t *)(void *)tab;
                for (uint32_t hh = 0; hh < H; hh++) {
                    uint16_t *ph = perm + (size_t)hh * d;
                    uint32_t w = 0, oi = 0;
                    for (uint32_t i = 0; i < h.outliers; i++, q += 2)
                        ph[w++] = dq__get_u16(q);
                    /* the regular channels, ascending: those not in the (ascending) outlier list */
                    for (uint32_t j = 0; j < d; j++) {
                        if (oi < h.outliers && ph[oi] == j) {
                            oi++;
                            continue;
                        }
                        ph[w++] = (uint16_t)j;
                    }
                }
                vw->kvq_perm[k] = perm;
            } else if (h.variant == DQ_KVQ_PQ) {
                float *cb = (float *)(void *)tab;
                const size_t cnt = ((size_t)1 << h.bits[k]) * d;
                for (size_t i = 0; i < cnt; i++, q += 2)
                    cb[i] = dq_f16_to_f32(dq__get_u16(q));
                vw->kvq_pq[k] = cb;
            }
        }
    }
    c->nviews = layers;
    /* the root encodes as layer 0 */
    for (int k = 0; k < 2; k++) {
        c->kvq_perm[k] = c->views[0].kvq_perm[k];
        c->kvq_pq[k] = c->views[0].kvq_pq[k];
    }
    *out = c;
    return DQ_OK;
}

const dq_codec *dq_codec_layer(const dq_codec *codec, uint32_t layer)
{
    if (!codec)
        return NULL;
    const dq_codec *r = codec->root ? codec->root : codec;
    if (!r->views)
        return codec;
    return layer < r->nviews ? &r->views[layer] : NULL;
}
