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

/* A token's units of one group (32 channels) of a kind: keys its b words (byte lanes), values its
 * 2b half-words (units b·h .. b·h + b - 1 for channels 16h ..; hot.h). */
typedef struct units {
    uint32_t u[16];
} units;

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static size_t pairs_of(size_t W)
{
    return (W + 1) / 2;
}

/* Byte offset of unit i of group g of token t within a kind's codes. */
static size_t unit_at(dq_kind kind, uint32_t b, size_t W, size_t t, size_t g, uint32_t i)
{
    if (kind == DQ_KIND_K)
        return 4 * ((g * b + i) * W + t);
    return 4 * ((g * 2 * b + i) * pairs_of(W) + t / 2) + 2 * (t % 2);
}

static void units_load(const uint8_t *codes, dq_kind kind, uint32_t b, size_t W, size_t t, size_t g, units *u)
{
    for (uint32_t i = 0; i < (kind == DQ_KIND_K ? b : 2 * b); i++) {
        const uint8_t *q = codes + unit_at(kind, b, W, t, g, i);
        u->u[i] = kind == DQ_KIND_K ? get_u32(q) : dq__get_u16(q);
    }
}

/* Writes a token's units (its whole words for keys, its half of the pair words for values). */
static void units_store(uint8_t *codes, dq_kind kind, uint32_t b, size_t W, size_t t, size_t g, const units *u)
{
    for (uint32_t i = 0; i < (kind == DQ_KIND_K ? b : 2 * b); i++) {
        uint8_t *q = codes + unit_at(kind, b, W, t, g, i);
        for (uint32_t y = 0; y < (kind == DQ_KIND_K ? 4u : 2u); y++)
            q[y] = (uint8_t)(u->u[i] >> (8 * y));
    }
}

/* Where each channel c (0..31) of a group sits among a token's units for one kind and width:
 * unit and bit of each of its b code bits (keys: byte lane c % 4, code c / 4 of the lane; values:
 * half h = c / 16, code c % 16), and whether they form one field (then bit e is bit[0] + e). */
typedef struct lane_map {
    uint8_t unit[32][8], bit[32][8];
    bool field[32];
    uint32_t b;
} lane_map;

static void lane_map_make(lane_map *L, dq_kind kind, uint32_t b)
{
    const uint32_t U = kind == DQ_KIND_K ? 8 : 16;
    L->b = b;
    for (uint32_t c = 0; c < 32; c++) {
        const uint32_t k = kind == DQ_KIND_K ? c / 4 : c % 16;
        const uint32_t base = kind == DQ_KIND_K ? 0 : b * (c / 16), sh = kind == DQ_KIND_K ? 8 * (c % 4) : 0;
        L->field[c] = k < U / b * b;
        for (uint32_t e = 0; e < b; e++) {
            uint32_t unit, bit;
            code_bit(b, U, k, e, &unit, &bit);
            L->unit[c][e] = (uint8_t)(base + unit);
            L->bit[c][e] = (uint8_t)(sh + bit);
        }
    }
}

static uint32_t units_get(const units *u, const lane_map *L, uint32_t c)
{
    if (L->field[c])
        return (u->u[L->unit[c][0]] >> L->bit[c][0]) & ((1u << L->b) - 1);
    uint32_t m = 0;
    for (uint32_t e = 0; e < L->b; e++)
        m |= ((u->u[L->unit[c][e]] >> L->bit[c][e]) & 1u) << e;
    return m;
}

static void units_put(units *u, const lane_map *L, uint32_t c, uint32_t m)
{
    if (L->field[c]) {
        u->u[L->unit[c][0]] |= m << L->bit[c][0];
        return;
    }
    for (uint32_t e = 0; e < L->b; e++)
        u->u[L->unit[c][e]] |= ((m >> e) & 1u) << L->bit[c][e];
}

/* Writes the n levels of token t of a kind into its codes (the caller zeroed them). */
static void pack_levels(uint8_t *codes, dq_kind kind, const lane_map *L, const uint8_t *lev, uint32_t n, size_t W,
                        size_t t)
{
    const uint32_t b = L->b;
    for (uint32_t g = 0; g < (n + 31) / 32; g++) {
        units u = {{0}};
        for (uint32_t c = 0; c < 32 && 32 * g + c < n; c++)
            units_put(&u, L, c, lev[32 * g + c]);
        units_store(codes, kind, b, W, t, g, &u);
    }
}

static void unpack_levels(const uint8_t *codes, dq_kind kind, const lane_map *L, uint8_t *lev, uint32_t n, size_t W,
                          size_t t)
{
    for (uint32_t g = 0; g < (n + 31) / 32; g++) {
        units u;
        units_load(codes, kind, L->b, W, t, g, &u);
        for (uint32_t c = 0; c < 32 && 32 * g + c < n; c++)
            lev[32 * g + c] = (uint8_t)units_get(&u, L, c);
    }
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
        lane_map L;
        lane_map_make(&L, (dq_kind)kind, bits_for(codec->kt[kind].levels));
        uint8_t *so = hot + off[kind], *codes = hot + off[2 + kind];
        for (size_t t = 0; t < W; t++) {
            const uint8_t *rec = dq_window_record(codec, window, (dq_kind)kind, t);
            memcpy(so + 4 * t, rec, 4);
            if (dq_stream_decode_levels(codec, (dq_kind)kind, rec, lev) != DQ_OK)
                rc = DQ_CORRUPT;
            pack_levels(codes, (dq_kind)kind, &L, lev, n, W, t);
        }
    }
    if (lev != small)
        dq__free(&codec->alloc, lev);
    return rc;
}

static int check_header(const dq_codec *codec, const uint8_t *hot, size_t bytes, size_t off[4]);
static int unpack_checked(const uint8_t *codes, dq_kind kind, const lane_map *L, uint8_t *lev, uint32_t n, uint32_t M,
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
        lane_map L;
        lane_map_make(&L, (dq_kind)kind, bits_for(M));
        for (size_t t = 0; t < W && rc == DQ_OK; t++)
            rc = unpack_checked(hot + off[2 + kind], (dq_kind)kind, &L, lev, n, M, W, t);
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
    lane_map L;
    lane_map_make(&L, kind, bits_for(codec->kt[kind].levels));
    unpack_levels(hot + off[2 + kind], kind, &L, levels, codec->n, codec->profile.window, t);
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
    const uint32_t n = codec->n;
    lane_map L;
    lane_map_make(&L, kind, bits_for(codec->kt[kind].levels));
    float *mu = ws->f1, *y = ws->f0;
    uint8_t *lev = ws->b0;
    if (kind == DQ_KIND_K)
        dq__mean_dequant(codec, hot, mu);
    for (size_t i = 0; i < count; i++) {
        const size_t t = first + i;
        const uint8_t *so = hot + off[kind] + 4 * t;
        const float s = dq_f16_to_f32(dq__get_u16(so)), o = dq_f16_to_f32(dq__get_u16(so + 2));
        unpack_levels(hot + off[2 + kind], kind, &L, lev, n, W, t);
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
 * a code >= M, a nonzero code past n, or (odd W, the last token) a nonzero half of its value pair
 * words for the missing token W. */
static int unpack_checked(const uint8_t *codes, dq_kind kind, const lane_map *L, uint8_t *lev, uint32_t n, uint32_t M,
                          size_t W, size_t t)
{
    const uint32_t b = L->b;
    for (uint32_t g = 0; g < (n + 31) / 32; g++) {
        units u;
        units_load(codes, kind, b, W, t, g, &u);
        for (uint32_t c = 0; c < 32; c++) {
            const uint32_t j = 32 * g + c, code = units_get(&u, L, c);
            if (code >= M || (j >= n && code))
                return DQ_CORRUPT;
            if (j < n)
                lev[j] = (uint8_t)code;
        }
        if (kind == DQ_KIND_V && t + 1 == W && W % 2) {
            units_load(codes, kind, b, W, W, g, &u);
            for (uint32_t i = 0; i < 2 * b; i++)
                if (u.u[i])
                    return DQ_CORRUPT;
        }
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
        lane_map L;
        lane_map_make(&L, (dq_kind)kind, bits_for(kt->levels));
        const uint8_t *so = hot + off[kind], *codes = hot + off[2 + kind];
        for (size_t t = 0; t < W; t++) {
            uint8_t *rec = (uint8_t *)dq_window_record(codec, window, (dq_kind)kind, t);
            memcpy(rec, so + 4 * t, 4);
            rc = unpack_checked(codes, (dq_kind)kind, &L, lev, n, kt->levels, W, t);
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
