/* The codec and workspace objects: allocation through the caller's hooks, the per-kind tables and
 * rotation signs a codec derives from its profile, and the accessors (the profile itself: profile.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "drift.h"
#include "dquant/kvq.h"

static void *default_alloc(void *opaque, size_t size)
{
    (void)opaque;
    void *p = NULL;
    if (posix_memalign(&p, 64, size ? size : 1) != 0)
        return NULL;
    return p;
}

static void default_free(void *opaque, void *ptr)
{
    (void)opaque;
    free(ptr);
}

void *dq__alloc(const dq_allocator *a, size_t size)
{
    return a->alloc(a->opaque, size);
}

void dq__free(const dq_allocator *a, void *p)
{
    if (p)
        a->free(a->opaque, p);
}

int dq_codec_create(const dq_profile *profile, const dq_allocator *alloc, dq_codec **out)
{
    DQ_RETURN_IF(!profile || !out, DQ_INVALID_ARGUMENT);
    *out = NULL;
    DQ_FORWARD_IF_ERROR(dq_profile_validate(profile));
    /* outliers and PQ need their tables: dq_codec_create_calibrated */
    DQ_RETURN_IF(dq_profile_needs_calibration(profile), DQ_PROFILE);
    return dq__codec_make(profile, alloc, out);
}

int dq__codec_make(const dq_profile *profile, const dq_allocator *alloc, dq_codec **out)
{
    DQ_RETURN_IF(!profile || !out, DQ_INVALID_ARGUMENT);
    *out = NULL;
    DQ_FORWARD_IF_ERROR(dq_profile_validate(profile));
    dq_allocator a = {default_alloc, default_free, NULL};
    if (alloc && alloc->alloc && alloc->free)
        a = *alloc;
    dq_codec *c = dq__alloc(&a, sizeof *c);
    DQ_RETURN_IF(!c, DQ_NOMEM);
    memset(c, 0, sizeof *c);
    c->profile = *profile;
    c->alloc = a;
    c->root = c;
    c->n = profile->kv_heads * profile->head_dim;
    c->head_dim = profile->head_dim;
    c->log2_head_dim = (uint32_t)__builtin_ctz(profile->head_dim);
    c->rot_scale = (float)(1.0 / sqrt((double)profile->head_dim));
    if (profile->rotation_seed) {
        c->signs = dq__alloc(&a, sizeof(float) * c->n);
        if (!c->signs) {
            dq__free(&a, c);
            return DQ_NOMEM;
        }
        /* splitmix64 over the index: D_i = ±1 from the top bit */
        for (uint32_t i = 0; i < c->n; i++) {
            uint64_t z = profile->rotation_seed + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            z ^= z >> 31;
            c->signs[i] = (z >> 63) ? -1.0f : 1.0f;
        }
    }
    if (profile->codec_type == DQ_CODEC_DQUANT) {
        for (int k = 0; k < 2; k++) {
            dq__kind_tables_init(profile, k, &c->kt[k]);
            c->record_bytes[k] = 4u + profile->container_bytes[k];
        }
        c->mean_bytes = 2u + c->n;
    } else if (profile->codec_type == DQ_CODEC_FIXED) {
        dq__fixed_setup(c);
    } else if (profile->codec_type == DQ_CODEC_KVQ) {
        int rc = dq__kvq_setup(c);
        if (rc != DQ_OK) {
            dq__free(&a, c->signs);
            dq__free(&a, c);
            return rc;
        }
    } else {
        dq__baseline_setup(c);
    }
    c->window_bytes = c->mean_bytes + (size_t)profile->window * (c->record_bytes[0] + c->record_bytes[1]);
    (void)dq__exp2_table();
    *out = c;
    return DQ_OK;
}

void dq_codec_free(dq_codec *codec)
{
    if (!codec || codec->root != codec) /* NULL, or a layer view: its root owns it */
        return;
    dq__kvq_release(codec);
    dq_allocator a = codec->alloc;
    dq__free(&a, codec->signs);
    dq__free(&a, codec);
}

const dq_profile *dq_codec_profile(const dq_codec *codec)
{
    return &codec->profile;
}

uint32_t dq_codec_stream_len(const dq_codec *codec)
{
    return codec->n;
}

size_t dq_codec_record_bytes(const dq_codec *codec, dq_kind kind)
{
    return codec->record_bytes[kind == DQ_KIND_V];
}

size_t dq_codec_window_bytes(const dq_codec *codec)
{
    return codec->window_bytes;
}

size_t dq_codec_mean_bytes(const dq_codec *codec)
{
    return codec->mean_bytes;
}

int dq_workspace_create(const dq_codec *codec, dq_workspace **out)
{
    DQ_RETURN_IF(!codec || !out, DQ_INVALID_ARGUMENT);
    *out = NULL;
    const dq_allocator *a = &codec->alloc;
    const size_t n = codec->n, W = codec->profile.window, d = codec->head_dim;
    /* big: a window of floats, and room for the attention state of >= 64 query heads */
    size_t big = W * n;
    if (big < 64 * (4 * d + W + 16))
        big = 64 * (4 * d + W + 16);
    /* one block: f0 f1 f2 (n floats) u0 u1 (n u32) big (W·n floats) levels (W·n) b0 b1 (n) */
    size_t bytes = sizeof(dq_workspace) + 64 + 3 * n * sizeof(float) + 2 * n * sizeof(uint32_t) + big * sizeof(float) +
                   big + 2 * n + 2 * big * sizeof(uint16_t) + 16 * 64;
    uint8_t *blk = dq__alloc(a, bytes);
    DQ_RETURN_IF(!blk, DQ_NOMEM);
    memset(blk, 0, sizeof(dq_workspace));
    dq_workspace *ws = (dq_workspace *)(void *)blk;
    uint8_t *p = blk + ((sizeof(dq_workspace) + 63) & ~(size_t)63);
#define DQ_TAKE(field, type, count)                         \
    do {                                                    \
        ws->field = (type *)(void *)p;                      \
        p += (((count) * sizeof(type)) + 63) & ~(size_t)63; \
    } while (0)
    DQ_TAKE(f0, float, n);
    DQ_TAKE(f1, float, n);
    DQ_TAKE(f2, float, n);
    DQ_TAKE(u0, uint32_t, n);
    DQ_TAKE(u1, uint32_t, n);
    DQ_TAKE(big, float, big);
    DQ_TAKE(levels, uint8_t, big);
    DQ_TAKE(b0, uint8_t, n);
    DQ_TAKE(b1, uint8_t, n);
    DQ_TAKE(stage, uint16_t, 2 * big);
#undef DQ_TAKE
    ws->codec = codec;
    ws->big_len = big;
    if (codec->profile.codec_type == DQ_CODEC_KVQ) {
        ws->kvq_len = dq__kvq_scratch_floats(codec);
        ws->kvq = dq__alloc(a, ws->kvq_len * sizeof(float));
        if (!ws->kvq) {
            dq__free(a, blk);
            return DQ_NOMEM;
        }
        memset(ws->kvq, 0, ws->kvq_len * sizeof(float));
    }
    *out = ws;
    return DQ_OK;
}

void dq_workspace_free(dq_workspace *ws)
{
    if (!ws)
        return;
    const dq_allocator *a = &ws->codec->alloc;
    dq__free(a, ws->kvq);
    dq__free(a, ws);
}
