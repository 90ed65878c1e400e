/* The hot layout (dquant/hot.h): a window's levels at fixed width, transcoded losslessly from its
 * record, and their reconstruction. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "codec_internal.h"
#include "dquant/hot.h"

static size_t align16(size_t x)
{
    return (x + 15) & ~(size_t)15;
}

static uint32_t bits_for(uint32_t M)
{
    uint32_t b = 1;
    while ((1u << b) < M)
        b++;
    return b;
}

uint32_t dq_hot_bits(const dq_codec *codec, dq_kind kind)
{
    if (!codec || !dq__codec_has_levels(codec) || (kind != DQ_KIND_K && kind != DQ_KIND_V))
        return 0;
    return bits_for(codec->kt[kind].levels);
}

size_t dq_hot_offsets(const dq_codec *codec, size_t off[4])
{
    if (!codec || !dq__codec_has_levels(codec))
        return 0;
    const size_t n = codec->n, W = codec->profile.window, G = (n + 31) / 32;
    const size_t A = align16(2 + n), CK = align16(A + 8 * W);
    const size_t CV = CK + 4 * G * bits_for(codec->kt[0].levels) * W;
    /* values by token pair: an odd W's last pair has a zero high half */
    if (off) {
        off[0] = A;
        off[1] = A + 4 * W;
        off[2] = CK;
        off[3] = CV;
    }
    return CV + 8 * G * bits_for(codec->kt[1].levels) * ((W + 1) / 2);
}

size_t dq_hot_window_bytes(const dq_codec *codec)
{
    return dq_hot_offsets(codec, NULL);
}

/* Where bit e of code k sits among the b units of one lane (the layout in hot.h): a unit is U
 * bits (8: a key byte lane, 16: a value half-word) and holds q = U / b codes in b-bit fields from
 * bit 0; the r = U - q·b bits above them, unit after unit, pool the other r codes' bits. */
static void code_bit(uint32_t b, uint32_t U, uint32_t k, uint32_t e, uint32_t *unit, uint32_t *bit)
{
    const uint32_t q = U / b, r = U - q * b;
    if (k < q * b) {
        *unit = k / q;
        *bit = b * (k % q) + e;
    } else {
        const uint32_t u = (k - q * b) * b + e;
        *unit = u / r;
        *bit = q * b + u % r;
    }
}

/* Byte offset of bit e of channel j's code of token t within the codes of a kind, and its bit
 * within that byte (hot.h: keys by byte lane in (group, token) words, values by half-word in
 * (group, token pair) words). */
static size_t code_at(dq_kind kind, uint32_t b, size_t W, size_t t, uint32_t j, uint32_t e, uint32_t *bit)
{
    const size_t g = j / 32;
    const uint32_t c = j % 32;
    uint32_t unit, ub;
    size_t word;
    if (kind == DQ_KIND_K) {
        code_bit(b, 8, c / 4, e, &unit, &ub);
        word = (g * b + unit) * W + t;
        ub += 8 * (c % 4);
    } else {
        code_bit(b, 16, c % 16, e, &unit, &ub);
        word = (g * 2 * b + b * (c / 16) + unit) * ((W + 1) / 2) + t / 2;
        ub += 16 * (uint32_t)(t % 2);
    }
    *bit = ub % 8;
    return 4 * word + ub / 8;
}

/* Writes the n levels of token t of a kind into its codes (the caller zeroed them). */
static void pack_levels(uint8_t *codes, dq_kind kind, const uint8_t *lev, uint32_t n, uint32_t b, size_t W, size_t t)
{
    for (uint32_t j = 0; j < n; j++)
        for (uint32_t e = 0; e < b; e++) {
            uint32_t bit;
            const size_t at = code_at(kind, b, W, t, j, e, &bit);
            codes[at] |= (uint8_t)(((lev[j] >> e) & 1u) << bit);
        }
}

/* The code of channel j (0 <= j < 32·ceil(n / 32)) of token t of a kind. */
static uint32_t code_of(const uint8_t *codes, dq_kind kind, uint32_t b, size_t W, size_t t, uint32_t j)
{
    uint32_t v = 0;
    for (uint32_t e = 0; e < b; e++) {
        uint32_t bit;
        const size_t at = code_at(kind, b, W, t, j, e, &bit);
        v |= (uint32_t)((codes[at] >> bit) & 1u) << e;
    }
    return v;
}

static void unpack_levels(const uint8_t *codes, dq_kind kind, uint8_t *lev, uint32_t n, uint32_t b, size_t W, size_t t)
{
    for (uint32_t j = 0; j < n; j++)
        lev[j] = (uint8_t)code_of(codes, kind, b, W, t, j);
}

int dq_hot_transcode(const dq_codec *codec, const uint8_t *window, uint8_t *hot)
{
    DQ_RETURN_IF(!codec || !window || !hot, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq__codec_has_levels(codec), DQ_UNSUPPORTED);
    size_t off[4];
    const size_t bytes = dq_hot_offsets(codec, off);
    const uint32_t n = codec->n;
    const size_t W = codec->profile.window;
    uint8_t small[256];
    uint8_t *lev = small;
    if (n > sizeof small) {
        lev = dq__alloc(&codec->alloc, n);
        DQ_RETURN_IF(!lev, DQ_NOMEM);
    }
    memset(hot, 0, bytes);
    memcpy(hot, dq_window_mean(codec, window), codec->mean_bytes);
    int rc = DQ_OK;
    for (int kind = 0; kind < 2; kind++) {
        const uint32_t b = bits_for(codec->kt[kind].levels);
        uint8_t *so = hot + off[kind], *codes = hot + off[2 + kind];
        for (size_t t = 0; t < W; t++) {
            const uint8_t *rec = dq_window_record(codec, window, (dq_kind)kind, t);
            memcpy(so + 4 * t, rec, 4);
            if (dq_stream_decode_levels(codec, (dq_kind)kind, rec, lev) != DQ_OK)
                rc = DQ_CORRUPT;
            pack_levels(codes, (dq_kind)kind, lev, n, b, W, t);
        }
    }
    if (lev != small)
        dq__free(&codec->alloc, lev);
    return rc;
}

static int check_header(const dq_codec *codec, const uint8_t *hot, size_t bytes, size_t off[4]);
static int unpack_checked(const uint8_t *codes, dq_kind kind, uint8_t *lev, uint32_t n, uint32_t b, uint32_t M,
                          size_t W, size_t t);

int dq_hot_check(const dq_codec *codec, const uint8_t *hot, size_t bytes)
{
    DQ_RETURN_IF(!codec || !hot, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq__codec_has_levels(codec), DQ_UNSUPPORTED);
    size_t off[4];
    int rc = check_header(codec, hot, bytes, off);
    const uint32_t n = codec->n;
    const size_t W = codec->profile.window;
    uint8_t small[256];
    uint8_t *lev = small;
    if (rc == DQ_OK && n > sizeof small) {
        lev = dq__alloc(&codec->alloc, n);
        DQ_RETURN_IF(!lev, DQ_NOMEM);
    }
    for (int kind = 0; kind < 2 && rc == DQ_OK; kind++) {
        const uint32_t M = codec->kt[kind].levels;
        for (size_t t = 0; t < W && rc == DQ_OK; t++)
            rc = unpack_checked(hot + off[2 + kind], (dq_kind)kind, lev, n, bits_for(M), M, W, t);
    }
    if (lev != small)
        dq__free(&codec->alloc, lev);
    return rc;
}

int dq_hot_levels(const dq_codec *codec, const uint8_t *hot, dq_kind kind, size_t t, uint8_t *levels)
{
    DQ_RETURN_IF(!codec || !hot || !levels || (kind != DQ_KIND_K && kind != DQ_KIND_V), DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq__codec_has_levels(codec), DQ_UNSUPPORTED);
    DQ_RETURN_IF(t >= codec->profile.window, DQ_INVALID_ARGUMENT);
    size_t off[4];
    dq_hot_offsets(codec, off);
    unpack_levels(hot + off[2 + kind], kind, levels, codec->n, bits_for(codec->kt[kind].levels), codec->profile.window, t);
    return DQ_OK;
}

int dq_hot_decode(const dq_codec *codec, dq_workspace *ws, const uint8_t *hot, dq_kind kind, size_t first, size_t count,
                  void *out, dq_dtype dtype)
{
    DQ_RETURN_IF(!codec || !ws || !dq__ws_fits(ws, codec) || !hot || (count && !out) ||
                     (kind != DQ_KIND_K && kind != DQ_KIND_V),
                 DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq_dtype_size(dtype), DQ_DTYPE);
    DQ_RETURN_IF(!dq__codec_has_levels(codec), DQ_UNSUPPORTED);
    const size_t W = codec->profile.window;
    DQ_RETURN_IF(first > W || count > W - first, DQ_OUT_OF_BOUNDS);
    size_t off[4];
    dq_hot_offsets(codec, off);
    const uint32_t n = codec->n, b = bits_for(codec->kt[kind].levels);
    float *mu = ws->f1, *y = ws->f0;
    uint8_t *lev = ws->b0;
    if (kind == DQ_KIND_K)
        dq__mean_dequant(codec, hot, mu);
    for (size_t i = 0; i < count; i++) {
        const size_t t = first + i;
        const uint8_t *so = hot + off[kind] + 4 * t;
        const float s = dq_f16_to_f32(dq__get_u16(so)), o = dq_f16_to_f32(dq__get_u16(so + 2));
        unpack_levels(hot + off[2 + kind], kind, lev, n, b, W, t);
        /* the expression of dq_tokens_decode, operation for operation (bit-identical) */
        if (kind == DQ_KIND_K) {
            for (uint32_t j = 0; j < n; j++)
                y[j] = (o + s * (float)lev[j]) + mu[j];
        } else {
            for (uint32_t j = 0; j < n; j++)
                y[j] = o + s * (float)lev[j];
        }
        dq_unrotate(codec, y);
        const size_t base = i * n;
        for (uint32_t j = 0; j < n; j++)
            dq__store_elem(out, dtype, base + j, y[j]);
    }
    return DQ_OK;
}

/* The inverse of dq_hot_transcode (hot.h). Why it is exact: a record is the key-mean block, then
 * per stream fp16 s and o and a C-byte rANS container, and the hot window keeps the mean block and
 * s, o verbatim. The container of a valid stream (dq_stream_decode_levels returns 0) is a function
 * of its levels alone: the decoder starts from the stored state and must end at L after reading
 * exactly the emitted bytes, with every byte after them zero; each decode step (including whether
 * it reads a byte: it does iff the encoder emitted one, since x' < L iff the encoder's state was
 * >= L·f) is the inverse of the encoder's step from L, so re-encoding the levels from L gives the
 * same state, the same bytes and the same zero tail. The rANS tables are the profile's, fixed. */
/* Token t's n levels of a kind from its codes, with dq_hot_check's checks of them: DQ_CORRUPT for
 * a code >= M, a nonzero code past n, or (odd W, the last token) a nonzero high half of its value
 * pair words. */
static int unpack_checked(const uint8_t *codes, dq_kind kind, uint8_t *lev, uint32_t n, uint32_t b, uint32_t M,
                          size_t W, size_t t)
{
    const uint32_t G = (n + 31) / 32;
    for (uint32_t j = 0; j < 32 * G; j++) {
        const uint32_t code = code_of(codes, kind, b, W, t, j);
        if (code >= M || (j >= n && code))
            return DQ_CORRUPT;
        if (j < n)
            lev[j] = (uint8_t)code;
        /* the missing token W of an odd window: its half of the pair words is zero */
        if (kind == DQ_KIND_V && t + 1 == W && W % 2 && code_of(codes, kind, b, W, W, j))
            return DQ_CORRUPT;
    }
    return DQ_OK;
}

/* dq_hot_check's checks of everything but the codes (those are checked as they are unpacked). */
static int check_header(const dq_codec *codec, const uint8_t *hot, size_t bytes, size_t off[4])
{
    const size_t need = dq_hot_offsets(codec, off), W = codec->profile.window;
    DQ_RETURN_IF(bytes < need, DQ_TRUNCATED);
    DQ_RETURN_IF((dq__get_u16(hot) & 0x7c00u) == 0x7c00u, DQ_CORRUPT);
    for (size_t i = codec->mean_bytes; i < off[0]; i++)
        DQ_RETURN_IF(hot[i] != 0, DQ_CORRUPT);
    for (size_t i = 0; i < 2 * W; i++) {
        const uint8_t *so = hot + off[0] + 4 * i;
        const uint16_t sh = dq__get_u16(so), oh = dq__get_u16(so + 2);
        DQ_RETURN_IF((sh & 0x7c00u) == 0x7c00u || (oh & 0x7c00u) == 0x7c00u || (sh & 0x8000u), DQ_CORRUPT);
    }
    return DQ_OK;
}

/* A fixed-width record (fixed_codec.c) is the same key-mean block and (s, o) pairs, with each
 * stream's levels packed base-M: the packing of levels < M is a bijection onto the valid
 * containers (every group's value below M^k, zero bits past the groups), so packing the hot
 * window's levels again with the encoder's packer gives the container back. */
int dq_hot_rebuild(const dq_codec *codec, const uint8_t *hot, size_t bytes, uint8_t *window)
{
    DQ_RETURN_IF(!codec || !hot || !window, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq__codec_has_levels(codec), DQ_UNSUPPORTED);
    const bool fixed = codec->profile.codec_type == DQ_CODEC_FIXED;
    const size_t wbytes = codec->window_bytes;
    size_t off[4];
    int rc = check_header(codec, hot, bytes, off);
    if (rc != DQ_OK) {
        memset(window, 0, wbytes);
        return rc;
    }
    const uint32_t n = codec->n;
    const size_t W = codec->profile.window;
    uint8_t small[512];
    uint8_t *lev = small;
    if (2 * (size_t)n > sizeof small) {
        lev = dq__alloc(&codec->alloc, 2 * (size_t)n);
        DQ_RETURN_IF(!lev, DQ_NOMEM);
    }
    uint8_t *scratch = lev + n;
    memcpy((uint8_t *)dq_window_mean(codec, window), hot, codec->mean_bytes);
    for (int kind = 0; kind < 2 && rc == DQ_OK; kind++) {
        const dq__kind_tables *kt = &codec->kt[kind];
        const uint32_t b = bits_for(kt->levels);
        const uint8_t *so = hot + off[kind], *codes = hot + off[2 + kind];
        for (size_t t = 0; t < W; t++) {
            uint8_t *rec = (uint8_t *)dq_window_record(codec, window, (dq_kind)kind, t);
            memcpy(rec, so + 4 * t, 4);
            rc = unpack_checked(codes, (dq_kind)kind, lev, n, b, kt->levels, W, t);
            if (rc != DQ_OK)
                break;
            if (fixed) {
                dq__fixed_pack(codec, (dq_kind)kind, lev, rec + 4);
                continue;
            }
            /* levels that need more than C bytes: no valid record holds them */
            if (dq__kt_encode(kt, lev, n, scratch, rec + 4) > kt->container) {
                rc = DQ_CORRUPT;
                break;
            }
        }
    }
    if (lev != small)
        dq__free(&codec->alloc, lev);
    if (rc != DQ_OK)
        memset(window, 0, wbytes);
    return rc;
}
