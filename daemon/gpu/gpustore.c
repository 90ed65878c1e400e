/* dquantd cuda backend: GPU-resident layers (gpulayer.h) — appends encoded on the GPU, rollback,
 * moves between tiers, decode, raw copies and batched decode attention (see gpu.h).
 *
 * Appends follow dq_layer_append exactly: the tokens (host input is copied up first) are checked
 * on the GPU with the same checks and codes (dqcu_tokens_check), rounded to BF16 there, and windows
 * are sealed from the concatenation [tail, new tokens] whenever the tail reaches R tokens. The
 * input is taken in pieces: since a layer's bytes depend only on its BF16 token sequence, the
 * pieces seal exactly the windows one append would. Per piece: the old tail and the new tokens are
 * gathered in the device stage buffer, dqcu_encode_windows writes the sealed windows straight into
 * their slots, and the rest of the stage becomes the new tail.
 *
 * Hot copies (--gpu-attention-layout hot, gpulayer.h): a layer whose profile the hot attention
 * kernel takes gets a hot block beside each segment; the windows an append seals, or a promote
 * brings, are transcoded into it (dqcu_transcode_hot) in the same task, so that nhot == nwin
 * whenever the layer is not being written. A rollback drops the copies of the windows it drops.
 *
 * Hot-only layers (--gpu-attention-layout hot-only, gpulayer.h) hold no records: appends encode
 * into the worker's record scratch and transcode from it, promotes upload the host records there;
 * readers of records get them rebuilt on the CPU from the hot windows (rebuild_host, records_dev). */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/attention.h"
#include "dquant/hot.h"
#include "gpu_internal.h"
#include "logging.h"

/* Encode statistics, then the per-window status, in the worker's small device buffer. */
#define STATUS_OFF 64u
_Static_assert(sizeof(dq_encode_stats) <= STATUS_OFF, "stats fit before the statuses");

static size_t tail_elems(const dqd_codec *c)
{
    return (size_t)c->profile.residual * c->n;
}

/* A fixed-width profile (see "the fixed-width family" below). */
static bool codec_fixed(const dqd_codec *codec)
{
    return codec->profile.codec_type == DQ_CODEC_FIXED;
}

/* A profile of container format version 2 (joint pairs, dq226p and dq196p): libdquant-cuda
 * encodes, decodes, transcodes to hot windows and rebuilds it, and attends over its records with
 * attention v7 when both kinds have at most 8 levels (the built-ins); beyond that an ATTEND over
 * its records runs libdquant on a host copy (attend_fixed). */
static bool codec_pairs(const dqd_codec *codec)
{
    return codec->profile.format_version == DQ_FORMAT_VERSION_PAIRS;
}

static uint64_t tail_dev_bytes(const dqd_codec *c)
{
    return 2u * tail_elems(c) * sizeof(uint16_t);
}

static uint32_t pow2_cap(uint64_t x)
{
    uint64_t c = 8;
    while (c < x)
        c *= 2;
    return (uint32_t)c;
}

static size_t align256(size_t x)
{
    return (x + 255u) & ~(size_t)255u;
}

/* Hot window slots are 256-byte aligned, like the blocks cudaMallocAsync gives. */
static uint64_t hot_slot_bytes(size_t hot_window_bytes)
{
    return align256(hot_window_bytes);
}

/* Bytes per hot slot of a new layer of codec: 0 (records only) unless the hot layout is configured
 * and the hot kernel takes the profile's shape; that is checked at a GQA group of 1, and
 * dqd_gpu_attend checks the model's q_heads (attending over the records where it is refused). */
static uint64_t hot_stride_for(const dqd_gpu *g, const dqcu_codec *dc, const dqd_codec *codec)
{
    if (!g->hot_layout || dqcu_attend_hot_check(dc, codec->profile.kv_heads) != DQ_OK)
        return 0;
    return hot_slot_bytes(dqcu_hot_window_bytes(dc));
}

/* The calling thread's worker and codec's device codec. */
static int work_codec(dqd_gpu *g, const dqd_codec *codec, dqd_gwork **w, const dqcu_codec **dc)
{
    int rc = dqd_gwork_get(g, w);
    return rc == DQ_OK ? dqd_gcodec_get(g, codec, dc) : rc;
}

/* Adds to the hot stats (deltas may be negative: unsigned wrap-around); hot_only: the windows are
 * held without their records. */
static void hot_account(dqd_gpu *g, int64_t windows, int64_t bytes, bool hot_only)
{
    if (windows && hot_only)
        atomic_fetch_add_explicit(&g->hot_only_windows, (uint64_t)windows, memory_order_relaxed);
    if (windows)
        atomic_fetch_add_explicit(&g->hot_windows, (uint64_t)windows, memory_order_relaxed);
    if (bytes)
        atomic_fetch_add_explicit(&g->hot_bytes, (uint64_t)bytes, memory_order_relaxed);
}

/* ---- estimates (loop thread) ---- */

/* Windows a new segment gets when an append needs `missing` more slots. */
static uint64_t segment_windows(uint64_t missing)
{
    return missing < DQD_GSEG_MIN ? DQD_GSEG_MIN : missing;
}

/* rec, hot: bytes per window of records and per hot slot (0: none); arrays: pointer arrays (2 for
 * hot layers, 1 for the others: records only, or hot-only). */
static uint64_t append_need(const dqd_codec *codec, uint64_t nwin, uint64_t tail, uint64_t slots, uint64_t cap,
                            uint64_t ntok, uint64_t rec, uint64_t hot, uint64_t arrays)
{
    const uint64_t W = codec->profile.window, R = codec->profile.residual;
    uint64_t total = tail + ntok;
    uint64_t nseal = total >= R ? (total - R) / W + 1 : 0;
    uint64_t need = 0;
    if (nwin + nseal > slots) {
        uint64_t cnt = segment_windows(nwin + nseal - slots);
        need += cnt * (rec + hot);
        if (slots + cnt > cap)
            need += (uint64_t)pow2_cap(slots + cnt) * sizeof(void *) * arrays;
    }
    return need;
}

uint64_t dqd_gpu_need(const dqd_gpu *g, const dqd_codec *codec, const dq_layer *host, const dqd_glayer *gpu,
                      uint64_t ntok)
{
    if (gpu)
        return append_need(codec, gpu->nwin, gpu->tail, gpu->slots, gpu->cap, ntok,
                           gpu->hot_only ? 0 : codec->window_bytes, gpu->hot_stride,
                           gpu->hot_stride && !gpu->hot_only ? 2u : 1u);
    /* Whether a new layer gets hot copies is decided on the device codec: assume it does. */
    const size_t hwb = g && g->hot_layout ? dq_hot_window_bytes(codec->codec) : 0;
    const uint64_t hot = hwb ? hot_slot_bytes(hwb) : 0;
    const bool hot_only = hot && g->hot_only;
    /* hot-only: a layer the kernel refuses holds records instead of hot windows; count the larger */
    const uint64_t rec = hot_only ? (codec->window_bytes > hot ? codec->window_bytes - hot : 0) : codec->window_bytes;
    const uint64_t arrays = hot && !hot_only ? 2u : 1u;
    uint64_t need = tail_dev_bytes(codec);
    uint64_t nwin = 0, tail = 0, cap = 0;
    if (host) {
        nwin = dq_layer_window_count(host);
        tail = dq_layer_tail_tokens(host);
        if (nwin) {
            cap = pow2_cap(nwin);
            need += nwin * (rec + hot) + cap * sizeof(void *) * arrays;
        }
    }
    return need + append_need(codec, nwin, tail, nwin, cap, ntok, rec, hot, arrays);
}

/* ---- layer memory ---- */

static void layer_free(dqd_gpu *g, cudaStream_t stream, const dqd_codec *codec, dqd_glayer *l)
{
    if (!l)
        return;
    if (l->hot_stride)
        hot_account(g, -(int64_t)l->nhot, -(int64_t)dqd_glayer_hot_bytes(l), l->hot_only);
    for (uint32_t i = 0; i < l->nseg; i++) {
        dqd_gfree(g, stream, l->segs[i].base, (size_t)l->segs[i].count * codec->window_bytes);
        if (l->segs[i].hot)
            dqd_gfree(g, stream, l->segs[i].hot, (size_t)l->segs[i].count * l->hot_stride);
    }
    dqd_gfree(g, stream, l->d_win, (size_t)l->cap * sizeof(uint8_t *));
    if (l->d_hot)
        dqd_gfree(g, stream, l->d_hot, (size_t)l->cap * sizeof(uint8_t *));
    dqd_gfree(g, stream, l->d_tail, tail_dev_bytes(codec));
    dqd_hostmem_free(g->mem, l->segs);
    dqd_hostmem_free(g->mem, l->h_win);
    dqd_hostmem_free(g->mem, l->h_hot);
    dqd_hostmem_free(g->mem, l);
}

void dqd_gpu_free_seq_layers(void *gpu, dqd_seq *seq)
{
    dqd_gpu *g = gpu;
    for (uint32_t i = 0; i < seq->model->layers; i++) {
        if (seq->glayers[i]) {
            layer_free(g, g->loop_stream, seq->model->codec, seq->glayers[i]);
            seq->glayers[i] = NULL;
        }
    }
}

static int layer_new(dqd_gwork *w, const dqd_codec *codec, const dqcu_codec *dc, dqd_glayer **out)
{
    dqd_glayer *l = dqd_hostmem_calloc(w->g->mem, sizeof *l);
    if (!l)
        return DQ_NOMEM;
    l->W = codec->profile.window;
    l->R = codec->profile.residual;
    l->hot_stride = hot_stride_for(w->g, dc, codec);
    l->hot_only = l->hot_stride && w->g->hot_only;
    if (codec_fixed(codec) && !l->hot_stride) {
        /* dqd_gpu_model_ok admits the family only where the hot kernel takes it */
        dqd_hostmem_free(w->g->mem, l);
        return DQ_UNSUPPORTED;
    }
    int rc = dqd_gmalloc(w, tail_dev_bytes(codec), (void **)&l->d_tail);
    if (rc < 0) {
        dqd_hostmem_free(w->g->mem, l);
        return rc;
    }
    l->dev_bytes = tail_dev_bytes(codec);
    *out = l;
    return DQ_OK;
}

/* A pointer array pair of cap entries holding the first slots entries of old_h. */
static int new_ptrs(dqd_gwork *w, uint32_t cap, uint8_t *const *old_h, uint32_t slots, uint8_t ***h_out,
                    uint8_t ***d_out)
{
    uint8_t **h = dqd_hostmem_alloc(w->g->mem, (size_t)cap * sizeof *h);
    if (!h)
        return DQ_NOMEM;
    uint8_t **d;
    int rc = dqd_gmalloc(w, (size_t)cap * sizeof *d, (void **)&d);
    if (rc < 0) {
        dqd_hostmem_free(w->g->mem, h);
        return rc;
    }
    if (slots) {
        memcpy(h, old_h, (size_t)slots * sizeof *h);
        rc = dqd_gh2d(w, d, h, (size_t)slots * sizeof *h);
        if (rc < 0) {
            dqd_gfree(w->g, w->stream, d, (size_t)cap * sizeof *d);
            dqd_hostmem_free(w->g->mem, h);
            return rc;
        }
    }
    *h_out = h;
    *d_out = d;
    return DQ_OK;
}

/* Grows the window pointer arrays (and the hot ones) to at least want entries (existing entries
 * kept). */
static int grow_cap(dqd_gwork *w, dqd_glayer *l, uint64_t want)
{
    if (l->cap >= want)
        return DQ_OK;
    const uint32_t cap = pow2_cap(want);
    const size_t ps = sizeof(uint8_t *);
    uint8_t **h = NULL, **d = NULL, **hh = NULL, **dh = NULL;
    int rc = l->hot_only ? DQ_OK : new_ptrs(w, cap, l->h_win, l->slots, &h, &d);
    if (rc < 0)
        return rc;
    if (l->hot_stride) {
        rc = new_ptrs(w, cap, l->h_hot, l->slots, &hh, &dh);
        if (rc < 0) {
            dqd_gfree(w->g, w->stream, d, (size_t)cap * ps);
            dqd_hostmem_free(w->g->mem, h);
            return rc;
        }
        dqd_gfree(w->g, w->stream, l->d_hot, (size_t)l->cap * ps);
        dqd_hostmem_free(w->g->mem, l->h_hot);
        l->h_hot = hh;
        l->d_hot = dh;
        l->dev_bytes += (uint64_t)(cap - l->cap) * ps;
        hot_account(w->g, 0, (int64_t)(cap - l->cap) * (int64_t)ps, false);
    }
    if (!l->hot_only) {
        dqd_gfree(w->g, w->stream, l->d_win, (size_t)l->cap * ps);
        dqd_hostmem_free(w->g->mem, l->h_win);
        l->dev_bytes += (uint64_t)(cap - l->cap) * ps;
        l->h_win = h;
        l->d_win = d;
    }
    l->cap = cap;
    return DQ_OK;
}

/* Adds a segment of count window slots after the existing ones. */
static int add_segment(dqd_gwork *w, const dqd_codec *codec, dqd_glayer *l, uint32_t count)
{
    if (l->nseg == l->segcap) {
        uint32_t cap = l->segcap ? l->segcap * 2 : 4;
        dqd_gseg *s = dqd_hostmem_alloc(w->g->mem, cap * sizeof *s);
        if (!s)
            return DQ_NOMEM;
        if (l->nseg)
            memcpy(s, l->segs, l->nseg * sizeof *s);
        dqd_hostmem_free(w->g->mem, l->segs);
        l->segs = s;
        l->segcap = cap;
    }
    int rc = grow_cap(w, l, (uint64_t)l->slots + count);
    if (rc < 0)
        return rc;
    size_t wb = l->hot_only ? 0 : codec->window_bytes, hb = (size_t)l->hot_stride;
    uint8_t *base = NULL, *hot = NULL;
    rc = wb ? dqd_gmalloc(w, count * wb, (void **)&base) : DQ_OK;
    if (rc < 0)
        return rc;
    if (hb) {
        rc = dqd_gmalloc(w, count * hb, (void **)&hot);
        if (rc < 0) {
            dqd_gfree(w->g, w->stream, base, count * wb);
            return rc;
        }
    }
    for (uint32_t j = 0; wb && j < count; j++)
        l->h_win[l->slots + j] = base + j * wb;
    if (wb)
        rc = dqd_gh2d(w, l->d_win + l->slots, l->h_win + l->slots, count * sizeof(uint8_t *));
    if (rc == DQ_OK && hb) {
        for (uint32_t j = 0; j < count; j++)
            l->h_hot[l->slots + j] = hot + j * hb;
        rc = dqd_gh2d(w, l->d_hot + l->slots, l->h_hot + l->slots, count * sizeof(uint8_t *));
    }
    if (rc < 0) {
        dqd_gfree(w->g, w->stream, base, count * wb);
        if (hot)
            dqd_gfree(w->g, w->stream, hot, count * hb);
        return rc;
    }
    l->segs[l->nseg++] = (dqd_gseg){base, l->slots, count, hot};
    l->slots += count;
    l->dev_bytes += (uint64_t)count * (wb + hb);
    if (hb)
        hot_account(w->g, 0, (int64_t)(count * hb), false);
    return DQ_OK;
}

/* Frees the segments from index nseg on. */
static void trim_segments(dqd_gwork *w, const dqd_codec *codec, dqd_glayer *l, uint32_t nseg)
{
    while (l->nseg > nseg) {
        dqd_gseg *s = &l->segs[--l->nseg];
        if (s->base) {
            dqd_gfree(w->g, w->stream, s->base, (size_t)s->count * codec->window_bytes);
            l->dev_bytes -= (uint64_t)s->count * codec->window_bytes;
        }
        if (s->hot) {
            dqd_gfree(w->g, w->stream, s->hot, (size_t)s->count * l->hot_stride);
            l->dev_bytes -= (uint64_t)s->count * l->hot_stride;
            hot_account(w->g, 0, -(int64_t)((uint64_t)s->count * l->hot_stride), false);
        }
        l->slots -= s->count;
    }
}

/* Transcodes windows [first, first + count) of a hot layer into their hot slots (stream-ordered;
 * a no-op for a layer without hot copies). Their records are valid: sealed by the encoder, or
 * checked when they came in (PUT_RAW, the disk tier). recs: device pointers to the records of
 * these windows (NULL: the layer's own, d_win + first); corrupt (device, may be NULL) counts
 * invalid containers, which a hot-only layer cannot hold. */
static int hot_transcode(dqd_gwork *w, const dqcu_codec *dc, dqd_glayer *l, uint32_t first, uint32_t count,
                         const uint8_t *const *recs, uint32_t *corrupt)
{
    if (!l->hot_stride || !count)
        return DQ_OK;
    if (first != l->nhot) {
        DQD_ERROR("GPU layer: hot copies of windows [0, %u), asked to transcode from %u", l->nhot, first);
        return DQ_INTERNAL;
    }
    if (!recs)
        recs = (const uint8_t *const *)(l->d_win + first);
    int r = dqcu_transcode_hot(dc, recs, count, l->d_hot + first, corrupt, w->stream);
    if (r < 0)
        return dqd_gcu_fail(r, "dqcu_transcode_hot", __FILE__, __LINE__);
    l->nhot = first + count;
    hot_account(w->g, count, 0, l->hot_only);
    return DQ_OK;
}

/* ---- records of hot-only layers ---- */

/* The worker's record scratch (DQD_GBUF_RECS): a device array of nptr pointers, then room for
 * count records; entry i in [at, at + count) points at record i - at, the others at record 0
 * (never read through them). The array is uploaded in stream order. */
static int rec_scratch(dqd_gwork *w, size_t wb, uint32_t nptr, uint32_t at, uint32_t count, uint8_t **recs,
                       uint8_t ***ptrs)
{
    const size_t pb = align256((size_t)(nptr ? nptr : 1) * sizeof(uint8_t *));
    uint8_t *buf;
    int rc = dqd_gwork_buf(w, DQD_GBUF_RECS, pb + (size_t)(count ? count : 1) * wb, (void **)&buf);
    if (rc < 0)
        return rc;
    if (nptr) {
        uint8_t **h = malloc((size_t)nptr * sizeof *h);
        if (!h)
            return DQ_NOMEM;
        for (uint32_t i = 0; i < nptr; i++)
            h[i] = buf + pb + (i >= at && i - at < count ? (size_t)(i - at) * wb : 0);
        rc = dqd_gh2d(w, buf, h, (size_t)nptr * sizeof *h);
        free(h);
        if (rc < 0)
            return rc;
    }
    *recs = buf + pb;
    *ptrs = (uint8_t **)(void *)buf;
    return DQ_OK;
}

/* Bytes of records a hot-only rebuild on the device writes into the record scratch at a time. */
#ifndef DQD_REBUILD_BYTES
#define DQD_REBUILD_BYTES (DQD_STAGE_BYTES < (64u << 20) ? DQD_STAGE_BYTES : (64u << 20))
#endif

/* Rebuilds the records of windows [first, first + count) of a hot-only layer on the CPU into dst
 * (host, count records back to back): each hot window comes down and dq_hot_rebuild makes its
 * record, byte for byte the one it was transcoded from. The path where the device rebuild is
 * refused (the fixed-width family: its records are not rANS) or fails; counted in
 * records_rebuilt_cpu. */
static int rebuild_cpu(dqd_gwork *w, const dqd_codec *codec, const dqd_glayer *l, uint32_t first, uint32_t count,
                       uint8_t *dst)
{
    const size_t hwb = dq_hot_window_bytes(codec->codec), wb = codec->window_bytes;
    uint8_t *hot = malloc(hwb ? hwb : 1);
    if (!hot)
        return DQ_NOMEM;
    int rc = DQ_OK;
    for (uint32_t i = 0; i < count && rc == DQ_OK; i++) {
        rc = dqd_gd2h(w, hot, l->h_hot[first + i], hwb);
        if (rc == DQ_OK) {
            rc = dq_hot_rebuild(codec->codec, hot, hwb, dst + (size_t)i * wb);
            if (rc < 0)
                DQD_ERROR("GPU layer: hot window %u does not rebuild to a record: %s", first + i, dq_strerror(rc));
        }
    }
    free(hot);
    if (rc == DQ_OK) {
        atomic_fetch_add_explicit(&w->g->records_rebuilt, count, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->g->records_rebuilt_cpu, count, memory_order_relaxed);
    }
    return rc;
}

/* Rebuilds the records of windows [first, first + count) of a hot-only layer on the device
 * (dqcu_rebuild_hot) at recs[0 .. count) (a device array of device pointers), done when it
 * returns. *refused is set, and nothing counted, when the call is refused (DQ_UNSUPPORTED: a
 * fixed-width codec), fails, or flags a window as bad (never for windows the daemon transcoded):
 * the caller then takes the CPU path, which reports the bad window precisely. */
static int rebuild_gpu(dqd_gwork *w, const dqcu_codec *dc, const dqd_glayer *l, uint32_t first, uint32_t count,
                       uint8_t *const *recs, bool *refused)
{
    *refused = false;
    if (!count)
        return DQ_OK;
    uint32_t *bad;
    int rc = dqd_gwork_buf(w, DQD_GBUF_CHECK, sizeof *bad, (void **)&bad);
    if (rc < 0)
        return rc;
    DQD_GCK(cudaMemsetAsync(bad, 0, sizeof *bad, w->stream));
    int r = dqcu_rebuild_hot(dc, (const uint8_t *const *)(l->d_hot + first), count, recs, bad, w->stream);
    if (r < 0) {
        (void)dqd_gcu_fail(r, "dqcu_rebuild_hot", __FILE__, __LINE__);
        *refused = true;
        return DQ_OK;
    }
    uint32_t nbad = 0;
    rc = dqd_gd2h(w, &nbad, bad, sizeof nbad);
    if (rc < 0)
        return rc;
    if (nbad) {
        DQD_WARN("dqcu_rebuild_hot: %u of hot windows [%u, %u) rebuild to no record; rebuilding them on the CPU", nbad,
                 first, first + count);
        *refused = true;
        return DQ_OK;
    }
    atomic_fetch_add_explicit(&w->g->records_rebuilt, count, memory_order_relaxed);
    atomic_fetch_add_explicit(&w->g->records_rebuilt_gpu, count, memory_order_relaxed);
    return DQ_OK;
}

/* Rebuilds the records of windows [first, first + count) of a hot-only layer into dst (host,
 * count records back to back): on the device into the record scratch, DQD_REBUILD_BYTES at a
 * time, each piece copied down; on the CPU (rebuild_cpu) from the first piece the device refuses
 * on. */
static int rebuild_host(dqd_gwork *w, const dqd_codec *codec, const dqd_glayer *l, uint32_t first, uint32_t count,
                        uint8_t *dst)
{
    const size_t wb = codec->window_bytes;
    const dqcu_codec *dc;
    int rc = dqd_gcodec_get(w->g, codec, &dc);
    if (rc < 0)
        return rc;
    const uint32_t per = wb < DQD_REBUILD_BYTES ? (uint32_t)(DQD_REBUILD_BYTES / wb) : 1u;
    bool gpu = true;
    for (uint32_t i = 0; i < count;) {
        const uint32_t cnt = count - i < per ? count - i : per;
        uint8_t *out = dst + (size_t)i * wb;
        if (gpu) {
            uint8_t *recs;
            uint8_t **ptrs;
            bool refused = false;
            rc = rec_scratch(w, wb, cnt, 0, cnt, &recs, &ptrs);
            if (rc == DQ_OK)
                rc = rebuild_gpu(w, dc, l, first + i, cnt, ptrs, &refused);
            if (rc < 0)
                return rc;
            if (!refused) {
                rc = dqd_gd2h(w, out, recs, (size_t)cnt * wb);
                if (rc < 0)
                    return rc;
                i += cnt;
                continue;
            }
            gpu = false;
        }
        rc = rebuild_cpu(w, codec, l, first + i, cnt, out);
        if (rc < 0)
            return rc;
        i += cnt;
    }
    return DQ_OK;
}

/* Device pointers to the window records that tokens [first, first + count) of l read: the
 * layer's own, or for a hot-only layer nwin pointers whose windows in that range point at records
 * rebuilt into the worker's scratch (on the device, or on the CPU and uploaded where the device
 * rebuild is refused). Valid until the next use of the scratch. */
static int records_dev(dqd_gwork *w, const dqd_codec *codec, const dqd_glayer *l, uint64_t first, uint64_t count,
                       const uint8_t *const **out)
{
    if (!l->hot_only || !l->nwin) {
        *out = (const uint8_t *const *)l->d_win;
        return DQ_OK;
    }
    const uint64_t W = l->W, wb = codec->window_bytes;
    uint64_t we = (first + count + W - 1) / W, wa = first / W;
    if (we > l->nwin)
        we = l->nwin;
    if (wa > we)
        wa = we;
    const uint32_t cnt = (uint32_t)(we - wa);
    const dqcu_codec *dc;
    uint8_t *recs;
    uint8_t **ptrs;
    bool refused = false;
    int rc = dqd_gcodec_get(w->g, codec, &dc);
    if (rc == DQ_OK)
        rc = rec_scratch(w, wb, l->nwin, (uint32_t)wa, cnt, &recs, &ptrs);
    if (rc == DQ_OK)
        rc = rebuild_gpu(w, dc, l, (uint32_t)wa, cnt, ptrs + wa, &refused);
    if (rc < 0)
        return rc;
    if (refused) {
        uint8_t *host = malloc(cnt * wb + 1);
        if (!host)
            return DQ_NOMEM;
        rc = rebuild_cpu(w, codec, l, (uint32_t)wa, cnt, host);
        if (rc == DQ_OK && cnt)
            rc = dqd_gh2d(w, recs, host, cnt * wb);
        /* dqd_gh2d has copied host into a pinned half when it returns */
        free(host);
        if (rc < 0)
            return rc;
    }
    *out = (const uint8_t *const *)ptrs;
    return DQ_OK;
}

/* Window records [first, first + count) of l into dst (host, back to back): copied down from the
 * segments, or rebuilt (a hot-only layer). */
static int records_host(dqd_gwork *w, const dqd_codec *codec, const dqd_glayer *l, uint32_t first, uint32_t count,
                        uint8_t *dst)
{
    if (l->hot_only)
        return rebuild_host(w, codec, l, first, count, dst);
    const size_t wb = codec->window_bytes;
    for (uint32_t s = 0; s < l->nseg; s++) {
        const dqd_gseg *sg = &l->segs[s];
        const uint32_t a = sg->first > first ? sg->first : first;
        const uint32_t e = sg->first + sg->count < first + count ? sg->first + sg->count : first + count;
        if (a >= e)
            continue;
        int rc = dqd_gd2h(w, dst + (size_t)(a - first) * wb, sg->base + (size_t)(a - sg->first) * wb,
                          (size_t)(e - a) * wb);
        if (rc < 0)
            return rc;
    }
    return DQ_OK;
}

/* ---- the fixed-width family ----
 *
 * Fixed-width profiles (DQ_CODEC_FIXED) live on the GPU only with the hot layouts (dqd_gpu_model_ok):
 * their appends take dqd_gpu_append's device path like D-Quant's (dqcu_encode_windows writes the
 * records dq_layer_append would), the device transcodes the records to hot windows and attends over
 * those, but has no decoder or container attention for them: the reads that need values (GET, and
 * an ATTEND the hot kernel cannot plan) run libdquant on a host copy of the windows they read. */

/* A host layer of windows [wa, we) of l, and of its tail when we == nwin. */
static int host_part(dqd_gwork *w, const dqd_codec *codec, const dqd_glayer *l, uint32_t wa, uint32_t we,
                     dq_layer **out)
{
    const size_t wb = codec->window_bytes, n = codec->n;
    const size_t tail = we == l->nwin ? l->tail : 0, tb = tail * n * sizeof(uint16_t);
    /* [tail K | tail V | records]: the tails first keep them 2-byte aligned */
    uint8_t *buf = malloc(2 * tb + (size_t)(we - wa) * wb + 1);
    if (!buf)
        return DQ_NOMEM;
    int rc = records_host(w, codec, l, wa, we - wa, buf + 2 * tb);
    if (rc == DQ_OK && tail) {
        rc = dqd_gd2h(w, buf, l->d_tail, tb);
        if (rc == DQ_OK)
            rc = dqd_gd2h(w, buf + tb, l->d_tail + tail_elems(codec), tb);
    }
    /* the layer's own records: sealed by libdquant or checked when they came in */
    if (rc == DQ_OK)
        rc = dq_layer_restore_unchecked(codec->codec, we > wa ? buf + 2 * tb : NULL, we - wa,
                                        tail ? (const uint16_t *)(void *)buf : NULL,
                                        tail ? (const uint16_t *)(void *)(buf + tb) : NULL, tail, out);
    free(buf);
    return rc;
}

/* dqd_gpu_decode of a fixed-width layer into host out: dq_layer_decode of the windows it reads. */
static int decode_fixed(dqd_gwork *w, const dqd_codec *codec, const dqd_glayer *l, dq_kind kind, size_t first,
                        size_t count, void *out, dq_dtype dtype)
{
    const uint64_t W = l->W;
    uint64_t wa = first / W, we = (first + count + W - 1) / W;
    if (we > l->nwin)
        we = l->nwin;
    if (wa > we)
        wa = we;
    dq_layer *hl = NULL;
    dq_workspace *ws = NULL;
    int rc = host_part(w, codec, l, (uint32_t)wa, (uint32_t)we, &hl);
    if (rc == DQ_OK)
        rc = dq_workspace_create(codec->codec, &ws);
    if (rc == DQ_OK)
        rc = dq_layer_decode(hl, ws, kind, first - wa * W, count, out, dtype);
    dq_workspace_free(ws);
    dq_layer_free(hl);
    return rc;
}

/* dqd_gpu_attend of items over fixed-width layers the hot kernel refused: dq_attend on host copies
 * (q, out, lse in device memory when dev). */
static int attend_fixed(dqd_gwork *w, const dqd_codec *codec, uint32_t q_heads, float scale, const dqd_gattn *items,
                        size_t n, bool dev)
{
    const size_t qs = (size_t)q_heads * codec->profile.head_dim;
    float *buf = malloc((2 * qs + q_heads) * sizeof(float));
    dq_workspace *ws = NULL;
    if (!buf)
        return DQ_NOMEM;
    float *q = buf, *out = buf + qs, *lse = out + qs;
    int rc = dq_workspace_create(codec->codec, &ws);
    for (size_t i = 0; i < n && rc == DQ_OK; i++) {
        const dqd_glayer *l = items[i].layer;
        dq_layer *hl = NULL;
        rc = host_part(w, codec, l, 0, l->nwin, &hl);
        if (rc == DQ_OK && dev)
            rc = dqd_gd2h(w, q, items[i].q, qs * sizeof(float));
        if (rc == DQ_OK) {
            dq_attn_item it = {hl, dev ? q : items[i].q, dev ? out : items[i].out, lse};
            rc = dq_attend(codec->codec, ws, q_heads, scale, &it, 1);
        }
        dq_layer_free(hl);
        if (rc == DQ_OK && dev) {
            rc = dqd_gh2d(w, items[i].out, out, qs * sizeof(float));
            if (rc == DQ_OK && items[i].lse)
                rc = dqd_gh2d(w, items[i].lse, lse, q_heads * sizeof(float));
        } else if (rc == DQ_OK && items[i].lse) {
            memcpy(items[i].lse, lse, q_heads * sizeof(float));
        }
    }
    dq_workspace_free(ws);
    free(buf);
    return rc == DQ_OK && dev ? dqd_gsync(w) : rc;
}

/* Brings the records of a host layer into a new hot-only layer's hot slots: uploaded to the record
 * scratch a pinned half's worth at a time and transcoded from there. DQ_CORRUPT when a container
 * is invalid: its hot window would not rebuild to it. */
static int promote_hot_only(dqd_gwork *w, const dqcu_codec *dc, const dqd_codec *codec, dqd_glayer *l,
                            const dq_layer *hl, size_t nwin)
{
    const size_t wb = codec->window_bytes;
    size_t per = wb <= DQD_GPIN_BYTES ? DQD_GPIN_BYTES / wb : 1;
    if (per > nwin)
        per = nwin;
    uint8_t *recs;
    uint8_t **ptrs;
    uint32_t *dcor;
    int rc = rec_scratch(w, wb, (uint32_t)per, 0, (uint32_t)per, &recs, &ptrs);
    if (rc == DQ_OK)
        rc = dqd_gwork_buf(w, DQD_GBUF_SMALL, sizeof *dcor, (void **)&dcor);
    if (rc < 0)
        return rc;
    DQD_GCK(cudaMemsetAsync(dcor, 0, sizeof *dcor, w->stream));
    for (size_t i = 0; i < nwin;) {
        const size_t cnt = nwin - i < per ? nwin - i : per;
        for (size_t j = 0; j < cnt && rc == DQ_OK; j++)
            rc = dqd_gh2d(w, recs + j * wb, dq_layer_window(hl, i + j), wb);
        if (rc == DQ_OK)
            rc = hot_transcode(w, dc, l, (uint32_t)i, (uint32_t)cnt, (const uint8_t *const *)ptrs, dcor);
        if (rc < 0)
            return rc;
        i += cnt;
    }
    uint32_t cor = 0;
    rc = dqd_gd2h(w, &cor, dcor, sizeof cor);
    if (rc == DQ_OK && cor) {
        DQD_WARN("a layer with %u invalid containers stays on the host: hot-only windows cannot hold them", cor);
        rc = DQ_CORRUPT;
    }
    return rc;
}

/* ---- appends ---- */

/* dqcu_tokens_check of K and V (device, ntok tokens each) into got: {K raw, K first, V raw, V first}. */
static int check_run(dqd_gwork *w, const dqcu_codec *dc, const void *k, const void *v, dq_dtype dtype, size_t ntok,
                     unsigned long long got[4])
{
    static const unsigned long long init[4] = {0, ~0ull, 0, ~0ull};
    unsigned long long *check;
    int rc = dqd_gwork_buf(w, DQD_GBUF_CHECK, sizeof init, (void **)&check);
    if (rc < 0)
        return rc;
    DQD_GCK(cudaMemcpyAsync(check, init, sizeof init, cudaMemcpyHostToDevice, w->stream));
    rc = dqcu_tokens_check(dc, k, dtype, ntok, check, w->stream);
    if (rc == DQ_OK)
        rc = dqcu_tokens_check(dc, v, dtype, ntok, check + 2, w->stream);
    if (rc < 0)
        return dqd_gcu_fail(rc, "dqcu_tokens_check", __FILE__, __LINE__);
    return dqd_gd2h(w, got, check, 4 * sizeof *got);
}

int dqd_gpu_check_tokens(dqd_gpu *g, dqd_codec *codec, const void *k, const void *v, dq_dtype dtype, size_t layers,
                         size_t ntok, uint32_t *bad_layer)
{
    dqd_gwork *w;
    const dqcu_codec *dc;
    unsigned long long got[4];
    int rc = work_codec(g, codec, &w, &dc);
    if (rc == DQ_OK)
        rc = check_run(w, dc, k, v, dtype, layers * ntok, got);
    if (rc < 0)
        return rc;
    *bad_layer = UINT32_MAX;
    if (got[0] || got[2])
        return DQ_NONFINITE;
    /* Layer by layer, K before V: the earlier layer's first bad token decides, K's on a tie. */
    const uint64_t lk = got[1] == ~0ull ? UINT64_MAX : (got[1] >> 1) / ntok;
    const uint64_t lv = got[3] == ~0ull ? UINT64_MAX : (got[3] >> 1) / ntok;
    if (lk == UINT64_MAX && lv == UINT64_MAX)
        return DQ_OK;
    const unsigned long long key = lk <= lv ? got[1] : got[3];
    *bad_layer = (uint32_t)(lk <= lv ? lk : lv);
    return (key & 1ull) ? DQ_RANGE : DQ_NONFINITE;
}

/* Puts the layer back as the transaction found it (see dqd_gpu_rollback). */
/* What undo() restores: the layer as it is before an append. */
static void txn_mark(dqd_gappend *txn, const dqd_glayer *l)
{
    txn->nwin0 = l->nwin;
    txn->tail0 = l->tail;
    txn->nseg0 = l->nseg;
    txn->slots0 = l->slots;
}

static int undo(dqd_gwork *w, const dqd_codec *codec, dqd_gappend *txn, dqd_glayer **slot)
{
    dqd_glayer *l = *slot;
    if (txn->created) {
        layer_free(w->g, w->stream, codec, l);
        *slot = NULL;
        return DQ_OK;
    }
    trim_segments(w, codec, l, txn->nseg0);
    if (l->nhot > txn->nwin0) {
        hot_account(w->g, -(int64_t)(l->nhot - txn->nwin0), 0, l->hot_only);
        l->nhot = txn->nwin0;
    }
    l->nwin = txn->nwin0;
    int rc = DQ_OK;
    if (txn->snap) {
        size_t n = codec->n, tb = (size_t)txn->tail0 * n * sizeof(uint16_t);
        rc = dqd_gh2d(w, l->d_tail, txn->snap, tb);
        if (rc == DQ_OK)
            rc = dqd_gh2d(w, l->d_tail + tail_elems(codec), txn->snap + (size_t)txn->tail0 * n, tb);
    }
    l->tail = txn->tail0;
    if (rc == DQ_OK)
        rc = dqd_gsync(w);
    if (rc < 0)
        DQD_ERROR("cannot restore a GPU layer to %u windows + %u tokens: %s", txn->nwin0, txn->tail0, dq_strerror(rc));
    return rc;
}

static void add_stats(dq_encode_stats *to, const dq_encode_stats *st)
{
    to->streams += st->streams;
    to->retries += st->retries;
    to->fallbacks += st->fallbacks;
    to->payload_bytes += st->payload_bytes;
    to->symbols_moved += st->symbols_moved;
    if (st->max_payload_bytes > to->max_payload_bytes)
        to->max_payload_bytes = st->max_payload_bytes;
    if (st->max_move > to->max_move)
        to->max_move = st->max_move;
}

int dqd_gpu_append(dqd_gpu *g, dqd_codec *codec, dqd_gappend *txn, dqd_glayer **slot, const void *k, const void *v,
                   dq_dtype dtype, size_t ntok, unsigned flags, dq_encode_stats *stats)
{
    memset(txn, 0, sizeof *txn);
    const size_t esz = dq_dtype_size(dtype);
    if (!esz)
        return DQ_DTYPE;
    if (ntok && (!k || !v))
        return DQ_INVALID_ARGUMENT;
    const size_t n = codec->n, W = codec->profile.window, R = codec->profile.residual;
    if (ntok > ((size_t)1 << 40) / n)
        return DQ_SHAPE;
    dqd_gwork *w;
    const dqcu_codec *dc;
    int rc = work_codec(g, codec, &w, &dc);
    if (rc < 0)
        return rc;
    const uint8_t *dk = k, *dv = v;
    const size_t xb = ntok * n * esz;
    if (!(flags & DQD_GAPPEND_DEVICE) && ntok) {
        /* Host input: up to the device once, then checked and rounded there like device input. */
        uint8_t *raw;
        rc = dqd_gwork_buf(w, DQD_GBUF_RAW, 2 * xb, (void **)&raw);
        if (rc == DQ_OK)
            rc = dqd_gh2d(w, raw, k, xb);
        if (rc == DQ_OK)
            rc = dqd_gh2d(w, raw + xb, v, xb);
        if (rc < 0)
            return rc;
        dk = raw;
        dv = raw + xb;
    }
    if (!(flags & DQD_GAPPEND_CHECKED) && ntok) {
        unsigned long long got[4];
        rc = check_run(w, dc, dk, dv, dtype, ntok, got);
        txn->raw_nonfinite = rc == DQ_OK && (got[0] || got[2]);
        if (rc == DQ_OK)
            rc = dqcu_tokens_verdict(got);
        if (rc == DQ_OK)
            rc = dqcu_tokens_verdict(got + 2);
        if (rc < 0)
            return rc;
    }

    if (!*slot) {
        rc = layer_new(w, codec, dc, slot);
        if (rc < 0)
            return rc;
        txn->created = true;
    }
    dqd_glayer *l = *slot;
    txn_mark(txn, l);

    const size_t total = l->tail + ntok;
    const size_t nseal = total >= R ? (total - R) / W + 1 : 0;
    uint8_t *small = NULL, *hsmall = NULL, *recs = NULL;
    uint8_t **rptrs = NULL; /* hot-only: the record scratch's pointers, where the windows are encoded */
    uint16_t *sk = NULL, *sv = NULL;
    const size_t most = DQD_STAGE_BYTES / (n * 2 * sizeof(uint16_t));
    const size_t piece = ntok < most ? (ntok ? ntok : 1) : most;
    if (l->nwin + nseal > l->slots)
        DQD_CHECK_GOTO(add_segment(w, codec, l, (uint32_t)segment_windows(l->nwin + nseal - l->slots)), rc, undo);
    if (nseal) {
        /* The tail changes in place where a piece leaves a rest behind its sealed windows or a
         * later piece writes over it: keep the old one for a rollback. One piece that leaves no
         * rest (a decode step's token filling its window, W == R) only reads it, and a rollback
         * only puts the counts back: no copy to the host, no synchronization. */
        const bool reads_tail = ntok <= piece && total == nseal * W;
        if (l->tail && !reads_tail) {
            size_t tb = (size_t)l->tail * n * sizeof(uint16_t);
            txn->snap = malloc(2 * tb);
            if (!txn->snap) {
                rc = DQ_NOMEM;
                goto undo;
            }
            rc = dqd_gd2h(w, txn->snap, l->d_tail, tb);
            if (rc == DQ_OK)
                rc = dqd_gd2h(w, txn->snap + (size_t)l->tail * n, l->d_tail + tail_elems(codec), tb);
            if (rc < 0)
                goto undo;
        }
        void *stage;
        rc = dqd_gwork_buf(w, DQD_GBUF_STAGE, 2 * (R + piece) * n * sizeof(uint16_t), &stage);
        if (rc == DQ_OK)
            rc = dqd_gwork_buf(w, DQD_GBUF_SMALL, STATUS_OFF + nseal * sizeof(int32_t), (void **)&small);
        if (rc < 0)
            goto undo;
        sk = stage;
        sv = sk + (R + piece) * n;
        if (l->hot_only) {
            /* a piece seals at most (piece - 1) / W + 1 windows (the tail before it is < R) */
            const size_t most_ns = nseal < piece / W + 1 ? nseal : piece / W + 1;
            DQD_CHECK_GOTO(rec_scratch(w, codec->window_bytes, (uint32_t)most_ns, 0, (uint32_t)most_ns, &recs, &rptrs),
                           rc, undo);
        }
        DQD_GCK_GOTO(cudaMemsetAsync(small, 0, STATUS_OFF + nseal * sizeof(int32_t), w->stream), rc, undo);
    }

    uint16_t *dtk = l->d_tail, *dtv = l->d_tail + tail_elems(codec);
    int32_t *status = small ? (int32_t *)(void *)(small + STATUS_OFF) : NULL;
    size_t t = l->tail, sealed = 0;
    /* Pieces of [tail, new tokens] are rounded to BF16 into the stage, sealed windows are encoded
     * straight into their slots, and the rest becomes the new tail. */
    for (size_t done = 0; done < ntok;) {
        const size_t m = ntok - done < piece ? ntok - done : piece;
        const uint8_t *xk = dk + done * n * esz, *xv = dv + done * n * esz;
        const size_t tot = t + m, ns = tot >= R ? (tot - R) / W + 1 : 0;
        if (!ns) {
            DQD_GCU_GOTO(dqcu_to_bf16(xk, dtype, m * n, dtk + t * n, w->stream), rc, undo);
            DQD_GCU_GOTO(dqcu_to_bf16(xv, dtype, m * n, dtv + t * n, w->stream), rc, undo);
            t = tot;
        } else {
            if (t) {
                size_t tb = t * n * sizeof(uint16_t);
                DQD_GCK_GOTO(cudaMemcpyAsync(sk, dtk, tb, cudaMemcpyDeviceToDevice, w->stream), rc, undo);
                DQD_GCK_GOTO(cudaMemcpyAsync(sv, dtv, tb, cudaMemcpyDeviceToDevice, w->stream), rc, undo);
            }
            DQD_GCU_GOTO(dqcu_to_bf16(xk, dtype, m * n, sk + t * n, w->stream), rc, undo);
            DQD_GCU_GOTO(dqcu_to_bf16(xv, dtype, m * n, sv + t * n, w->stream), rc, undo);
            if (l->hot_only && ns > piece / W + 1) {
                DQD_ERROR("GPU append: a piece sealed %zu windows, the record scratch holds %zu", ns, piece / W + 1);
                rc = DQ_INTERNAL;
                goto undo;
            }
            DQD_GCU_GOTO(dqcu_encode_windows(dc, sk, sv, DQ_DTYPE_BF16, ns, l->hot_only ? rptrs : l->d_win + l->nwin,
                                             status + sealed, (dq_encode_stats *)(void *)small, w->stream),
                         rc, undo);
            /* hot-only: the records live in the scratch until transcoded, before the next piece */
            if (l->hot_only)
                DQD_CHECK_GOTO(hot_transcode(w, dc, l, l->nwin, (uint32_t)ns, (const uint8_t *const *)rptrs, NULL), rc,
                               undo);
            const size_t consumed = ns * W, rest = tot - consumed;
            if (rest) {
                size_t rb = rest * n * sizeof(uint16_t);
                DQD_GCK_GOTO(cudaMemcpyAsync(dtk, sk + consumed * n, rb, cudaMemcpyDeviceToDevice, w->stream), rc,
                             undo);
                DQD_GCK_GOTO(cudaMemcpyAsync(dtv, sv + consumed * n, rb, cudaMemcpyDeviceToDevice, w->stream), rc,
                             undo);
            }
            l->nwin += (uint32_t)ns;
            sealed += ns;
            t = rest;
        }
        done += m;
    }
    l->tail = (uint32_t)t;
    if (sealed != nseal) {
        DQD_ERROR("GPU append sealed %zu windows, expected %zu", sealed, nseal);
        rc = DQ_INTERNAL;
        goto undo;
    }
    /* In the same stream: the status read below waits for it too. */
    if (!l->hot_only)
        DQD_CHECK_GOTO(hot_transcode(w, dc, l, txn->nwin0, l->nwin - txn->nwin0, NULL, NULL), rc, undo);

    if (nseal) {
        /* The statuses: the token checks guarantee none, but never keep a window the GPU refused. */
        size_t sb = STATUS_OFF + nseal * sizeof(int32_t);
        hsmall = malloc(sb);
        if (!hsmall) {
            rc = DQ_NOMEM;
            goto undo;
        }
        DQD_CHECK_GOTO(dqd_gd2h(w, hsmall, small, sb), rc, undo);
        const int32_t *hs = (const int32_t *)(void *)(hsmall + STATUS_OFF);
        for (size_t i = 0; i < nseal; i++) {
            if (hs[i] != 0) {
                rc = hs[i] < 0 ? hs[i] : DQ_INTERNAL;
                DQD_WARN("GPU encoder refused window %zu of an append: %s", i, dq_err_name(rc));
                goto undo;
            }
        }
        if (stats) {
            dq_encode_stats st;
            memcpy(&st, hsmall, sizeof st);
            add_stats(stats, &st);
        }
        free(hsmall);
        atomic_fetch_add_explicit(&w->g->windows_encoded, nseal, memory_order_relaxed);
    }
    txn->applied = true;
    return DQ_OK;

undo:
    free(hsmall);
    if (undo(w, codec, txn, slot) < 0)
        txn->broken = true;
    txn->created = false;
    return rc;
}

bool dqd_gpu_append_fits(const dqd_codec *codec, const dqd_glayer *l)
{
    return l && (size_t)l->tail + 1 < codec->profile.residual;
}

/* Tokens of a pinned block: its 2c row addresses (K, V of each token), then the 2c rows. */
static size_t tokens_per_pin(size_t n)
{
    return (DQD_GPIN_BYTES - 256) / (2 * sizeof(uint16_t *) + 2 * n * sizeof(uint16_t));
}

/* The tokens tok[0 .. c) (c <= tokens_per_pin) rounded to BF16 on the host into one pinned block
 * with the device addresses of their rows, then one copy and one dqcu_scatter_rows. Token j goes
 * to row `tail` of its layer's tail (sk NULL) or of window j of a stage whose windows are W rows
 * apart (K at sk, V at sv). */
static int scatter_tokens(dqd_gwork *w, const dqd_codec *codec, const dqd_gtoken *tok, size_t c, uint16_t *sk,
                          uint16_t *sv)
{
    const size_t n = codec->n, W = codec->profile.window, row = n * sizeof(uint16_t);
    const size_t off = align256(2 * c * sizeof(uint16_t *)), bytes = off + 2 * c * row;
    uint8_t *dev;
    int rc = dqd_gwork_buf(w, DQD_GBUF_RAW, bytes, (void **)&dev);
    if (rc < 0)
        return rc;
    int h;
    uint8_t *pin = dqd_gpin_take(w, bytes, &h);
    if (!pin)
        return DQ_INTERNAL;
    uint16_t **to = (uint16_t **)(void *)pin;
    uint16_t *rows = (uint16_t *)(void *)(pin + off);
    for (size_t j = 0; j < c; j++) {
        const dqd_gtoken *t = &tok[j];
        const dqd_glayer *l = t->layer;
        const size_t at = (size_t)l->tail * n;
        to[2 * j] = sk ? sk + j * W * n + at : l->d_tail + at;
        to[2 * j + 1] = sk ? sv + j * W * n + at : l->d_tail + tail_elems(codec) + at;
        rc = dq_convert(t->k, t->dtype, rows + 2 * j * n, DQ_DTYPE_BF16, n);
        if (rc == DQ_OK)
            rc = dq_convert(t->v, t->dtype, rows + (2 * j + 1) * n, DQ_DTYPE_BF16, n);
        if (rc < 0) {
            (void)dqd_gpin_done(w, h);
            return rc;
        }
    }
    DQD_GCK(cudaMemcpyAsync(dev, pin, bytes, cudaMemcpyHostToDevice, w->stream));
    rc = dqd_gpin_done(w, h);
    if (rc < 0)
        return rc;
    rc = dqcu_scatter_rows((const uint16_t *)(const void *)(dev + off), (uint32_t)n, (uint16_t *const *)(void *)dev,
                           (uint32_t)(2 * c), w->stream);
    return rc < 0 ? dqd_gcu_fail(rc, "dqcu_scatter_rows", __FILE__, __LINE__) : DQ_OK;
}

int dqd_gpu_append_tokens(dqd_gpu *g, dqd_codec *codec, const dqd_gtoken *tok, size_t count)
{
    for (size_t i = 0; i < count; i++)
        memset(tok[i].txn, 0, sizeof *tok[i].txn);
    dqd_gwork *w;
    int rc = dqd_gwork_get(g, &w);
    if (rc < 0)
        return rc;
    const size_t most = tokens_per_pin(codec->n);
    if (most == 0)
        return DQ_UNSUPPORTED;
    for (size_t i0 = 0; i0 < count;) {
        const size_t c = count - i0 < most ? count - i0 : most;
        rc = scatter_tokens(w, codec, tok + i0, c, NULL, NULL);
        if (rc < 0)
            return rc;
        for (size_t j = 0; j < c; j++) {
            dqd_glayer *l = tok[i0 + j].layer;
            txn_mark(tok[i0 + j].txn, l);
            tok[i0 + j].txn->applied = true;
            l->tail++;
        }
        i0 += c;
    }
    return DQ_OK;
}

bool dqd_gpu_append_seals_one(const dqd_codec *codec, const dqd_glayer *l)
{
    return l && !l->hot_only && codec->profile.window == codec->profile.residual &&
           (size_t)l->tail + 1 == codec->profile.residual;
}

/* The windows of tok[0 .. c) (each layer's tail and its new token) into the stage, encoded with
 * one dqcu_encode_windows and transcoded with one dqcu_transcode_hot, their statuses read back
 * once. On failure the layers are put back here (their txns stay unapplied). */
static int seal_chunk(dqd_gwork *w, dqd_codec *codec, const dqcu_codec *dc, const dqd_gtoken *tok, size_t c)
{
    const size_t n = codec->n, W = codec->profile.window, row = n * sizeof(uint16_t);
    const bool hot = tok[0].layer->hot_stride != 0;
    const size_t pofs = align256(STATUS_OFF + c * sizeof(int32_t));
    uint16_t *sk, *sv;
    uint8_t *small;
    uint8_t **hp = NULL;
    int32_t *hs = NULL, *status;
    uint8_t *const *drec;
    size_t marked = 0;
    int rc = DQ_OK;
    for (; marked < c; marked++) {
        dqd_glayer *l = tok[marked].layer;
        txn_mark(tok[marked].txn, l);
        if (l->nwin + 1 > l->slots)
            DQD_CHECK_GOTO(add_segment(w, codec, l, (uint32_t)segment_windows(l->nwin + 1 - l->slots)), rc, fail);
    }
    /* the stage: window j's K rows at sk + j·W·n, its V rows at sv + j·W·n; the tails copied in */
    DQD_CHECK_GOTO(dqd_gwork_buf(w, DQD_GBUF_STAGE, 2 * c * W * row, (void **)&sk), rc, fail);
    sv = sk + c * W * n;
    for (size_t j = 0; j < c; j++) {
        const dqd_glayer *l = tok[j].layer;
        const size_t tb = (size_t)l->tail * row;
        DQD_GCK_GOTO(cudaMemcpyAsync(sk + j * W * n, l->d_tail, tb, cudaMemcpyDeviceToDevice, w->stream), rc, fail);
        DQD_GCK_GOTO(
            cudaMemcpyAsync(sv + j * W * n, l->d_tail + tail_elems(codec), tb, cudaMemcpyDeviceToDevice, w->stream), rc,
            fail);
    }
    /* the new tokens after them (row tail of each window) */
    DQD_CHECK_GOTO(scatter_tokens(w, codec, tok, c, sk, sv), rc, fail);
    /* stats and statuses, then the record and hot slots' addresses (host mirrors h_win, h_hot) */
    DQD_CHECK_GOTO(dqd_gwork_buf(w, DQD_GBUF_SMALL, pofs + 2 * c * sizeof(uint8_t *), (void **)&small), rc, fail);
    hp = malloc(2 * c * sizeof *hp);
    hs = malloc(c * sizeof *hs);
    if (!hp || !hs) {
        rc = DQ_NOMEM;
        goto fail;
    }
    for (size_t j = 0; j < c; j++) {
        const dqd_glayer *l = tok[j].layer;
        hp[j] = l->h_win[l->nwin];
        hp[c + j] = hot ? l->h_hot[l->nwin] : NULL;
    }
    DQD_CHECK_GOTO(dqd_gh2d(w, small + pofs, hp, 2 * c * sizeof *hp), rc, fail);
    drec = (uint8_t *const *)(void *)(small + pofs);
    status = (int32_t *)(void *)(small + STATUS_OFF);
    DQD_GCK_GOTO(cudaMemsetAsync(small, 0, STATUS_OFF + c * sizeof(int32_t), w->stream), rc, fail);
    DQD_GCU_GOTO(
        dqcu_encode_windows(dc, sk, sv, DQ_DTYPE_BF16, c, drec, status, (dq_encode_stats *)(void *)small, w->stream),
        rc, fail);
    if (hot)
        DQD_GCU_GOTO(dqcu_transcode_hot(dc, (const uint8_t *const *)drec, c, drec + c, NULL, w->stream), rc, fail);
    DQD_CHECK_GOTO(dqd_gd2h(w, hs, status, c * sizeof *hs), rc, fail);
    for (size_t j = 0; j < c; j++)
        if (hs[j] != 0) {
            rc = hs[j] < 0 ? hs[j] : DQ_INTERNAL;
            DQD_WARN("GPU encoder refused window %zu of a batch of sealing appends: %s", j, dq_err_name(rc));
            goto fail;
        }
    free(hp);
    free(hs);
    for (size_t j = 0; j < c; j++) {
        dqd_glayer *l = tok[j].layer;
        l->nwin++;
        l->tail = 0;
        if (hot) {
            l->nhot = l->nwin;
            hot_account(w->g, 1, 0, false);
        }
        tok[j].txn->applied = true;
    }
    atomic_fetch_add_explicit(&w->g->windows_encoded, c, memory_order_relaxed);
    return DQ_OK;

fail:
    free(hp);
    free(hs);
    for (size_t j = 0; j < marked + (marked < c); j++) {
        dqd_glayer *l = tok[j].layer;
        if (undo(w, codec, tok[j].txn, &l) < 0)
            tok[j].txn->broken = true;
    }
    return rc;
}

int dqd_gpu_append_seal_tokens(dqd_gpu *g, dqd_codec *codec, const dqd_gtoken *tok, size_t count)
{
    for (size_t i = 0; i < count; i++)
        memset(tok[i].txn, 0, sizeof *tok[i].txn);
    dqd_gwork *w;
    const dqcu_codec *dc;
    int rc = work_codec(g, codec, &w, &dc);
    if (rc < 0)
        return rc;
    /* windows per launch: the stage's (two windows at the least) and the pinned block's */
    const size_t n = codec->n, W = codec->profile.window, row = n * sizeof(uint16_t);
    size_t most = DQD_STAGE_BYTES / (2 * W * row);
    const size_t most_pin = tokens_per_pin(n);
    most = most < 2 ? 2 : most;
    most = most < most_pin ? most : most_pin;
    if (most == 0)
        return DQ_UNSUPPORTED;
    for (size_t i0 = 0; i0 < count;) {
        /* one hot-copy layout per launch (every layer of a daemon has the same) */
        size_t c = 0;
        while (i0 + c < count && c < most && (tok[i0 + c].layer->hot_stride != 0) == (tok[i0].layer->hot_stride != 0))
            c++;
        rc = seal_chunk(w, codec, dc, tok + i0, c);
        if (rc < 0)
            return rc;
        i0 += c;
    }
    return DQ_OK;
}

int dqd_gpu_rollback(dqd_gpu *g, dqd_codec *codec, dqd_gappend *txn, dqd_glayer **slot)
{
    if (!txn->applied)
        return DQ_OK;
    dqd_gwork *w;
    int rc = dqd_gwork_get(g, &w);
    if (rc == DQ_OK)
        rc = undo(w, codec, txn, slot);
    if (rc < 0) {
        txn->broken = true;
        return rc;
    }
    txn->applied = false;
    return DQ_OK;
}

void dqd_gappend_clear(dqd_gappend *txn)
{
    free(txn->snap);
    txn->snap = NULL;
}

/* ---- moves between tiers ---- */

int dqd_gpu_promote(dqd_gpu *g, dqd_codec *codec, dq_layer **host, dqd_glayer **gpu)
{
    const dq_layer *hl = *host;
    const size_t nwin = dq_layer_window_count(hl), tail = dq_layer_tail_tokens(hl);
    const size_t wb = codec->window_bytes, n = codec->n;
    dqd_gwork *w = NULL;
    dqd_glayer *l = NULL;
    const dqcu_codec *dc;
    int rc = work_codec(g, codec, &w, &dc);
    if (rc == DQ_OK)
        rc = layer_new(w, codec, dc, &l);
    if (rc == DQ_OK && nwin)
        rc = add_segment(w, codec, l, (uint32_t)nwin);
    if (rc < 0)
        goto fail;
    if (l->hot_only)
        DQD_CHECK_GOTO(promote_hot_only(w, dc, codec, l, hl, nwin), rc, fail);
    /* Window records are separate host blocks: pack as many as fit in a pinned half per copy. */
    const size_t per = wb <= DQD_GPIN_BYTES ? DQD_GPIN_BYTES / wb : 0;
    for (size_t i = 0; i < nwin && !l->hot_only;) {
        uint8_t *dst = l->segs[0].base + i * wb;
        if (!per) {
            DQD_CHECK_GOTO(dqd_gh2d(w, dst, dq_layer_window(hl, i), wb), rc, fail);
            i++;
            continue;
        }
        size_t cnt = nwin - i < per ? nwin - i : per;
        int h;
        uint8_t *pin = dqd_gpin_take(w, cnt * wb, &h);
        if (!pin) {
            rc = DQ_INTERNAL;
            goto fail;
        }
        for (size_t j = 0; j < cnt; j++)
            memcpy(pin + j * wb, dq_layer_window(hl, i + j), wb);
        DQD_GCK_GOTO(cudaMemcpyAsync(dst, pin, cnt * wb, cudaMemcpyHostToDevice, w->stream), rc, fail);
        DQD_CHECK_GOTO(dqd_gpin_done(w, h), rc, fail);
        i += cnt;
    }
    if (tail) {
        size_t tb = tail * n * sizeof(uint16_t);
        rc = dqd_gh2d(w, l->d_tail, dq_layer_tail(hl, DQ_KIND_K), tb);
        if (rc == DQ_OK)
            rc = dqd_gh2d(w, l->d_tail + tail_elems(codec), dq_layer_tail(hl, DQ_KIND_V), tb);
        if (rc < 0)
            goto fail;
    }
    l->nwin = (uint32_t)nwin;
    l->tail = (uint32_t)tail;
    if (!l->hot_only)
        DQD_CHECK_GOTO(hot_transcode(w, dc, l, 0, (uint32_t)nwin, NULL, NULL), rc, fail);
    DQD_CHECK_GOTO(dqd_gsync(w), rc, fail);
    dq_layer_free(*host);
    *host = NULL;
    *gpu = l;
    return DQ_OK;

fail:
    if (l)
        layer_free(g, w->stream, codec, l);
    return rc;
}

int dqd_gpu_demote(dqd_gpu *g, dqd_codec *codec, dqd_glayer **gpu, dq_layer **host)
{
    dqd_glayer *l = *gpu;
    const size_t wb = codec->window_bytes, n = codec->n;
    const size_t nwin = l->nwin, tail = l->tail, tb = tail * n * sizeof(uint16_t);
    dqd_gwork *w;
    int rc = dqd_gwork_get(g, &w);
    if (rc < 0)
        return rc;
    /* [tail K | tail V | records]: the tails first keep them 2-byte aligned. */
    uint8_t *buf = malloc(2 * tb + nwin * wb + 1);
    if (!buf)
        return DQ_NOMEM;
    uint8_t *rec = buf + 2 * tb;
    rc = records_host(w, codec, l, 0, (uint32_t)nwin, rec);
    if (rc == DQ_OK && tail) {
        rc = dqd_gd2h(w, buf, l->d_tail, tb);
        if (rc == DQ_OK)
            rc = dqd_gd2h(w, buf + tb, l->d_tail + tail_elems(codec), tb);
    }
    dq_layer *hl = NULL;
    /* Only models dqd_gpu_model_ok takes (D-Quant and fixed-width profiles) live on the GPU: none
     * has per-layer calibration, so the codec is every layer's view (dqd_codec_view). */
    assert(!codec->calib);
    if (rc == DQ_OK) {
        rc = dq_layer_restore(codec->codec, nwin ? rec : NULL, nwin, tail ? (const uint16_t *)(void *)buf : NULL,
                              tail ? (const uint16_t *)(void *)(buf + tb) : NULL, tail, &hl);
        if (rc < 0)
            DQD_ERROR("cannot rebuild a layer from its GPU records: %s", dq_strerror(rc));
    }
    free(buf);
    if (rc < 0)
        return rc;
    layer_free(g, w->stream, codec, l);
    *gpu = NULL;
    *host = hl;
    return DQ_OK;
}

/* ---- reads ---- */

/* Checks a decode's arguments and gets the worker, device codec, corrupt counter and tail. */
static int decode_setup(dqd_gpu *g, dqd_codec *codec, const dqd_glayer *l, dq_kind kind, size_t first, size_t count,
                        dq_dtype dtype, dqd_gwork **w, const dqcu_codec **dc, uint32_t **dcor, const uint16_t **tail)
{
    if (!dq_dtype_size(dtype))
        return DQ_DTYPE;
    if (kind != DQ_KIND_K && kind != DQ_KIND_V)
        return DQ_INVALID_ARGUMENT;
    const uint64_t total = dqd_glayer_tokens(l);
    if (first > total || count > total - first)
        return DQ_OUT_OF_BOUNDS;
    int rc = work_codec(g, codec, w, dc);
    if (rc == DQ_OK)
        rc = dqd_gwork_buf(*w, DQD_GBUF_SMALL, sizeof **dcor, (void **)dcor);
    if (rc < 0)
        return rc;
    DQD_GCK(cudaMemsetAsync(*dcor, 0, sizeof **dcor, (*w)->stream));
    *tail = l->tail ? l->d_tail + (kind == DQ_KIND_V ? tail_elems(codec) : 0) : NULL;
    return DQ_OK;
}

static int decode_verdict(dqd_gwork *w, const uint32_t *dcor)
{
    uint32_t cor = 0;
    int rc = dqd_gd2h(w, &cor, dcor, sizeof cor);
    if (rc < 0)
        return rc;
    return cor ? DQ_CORRUPT : DQ_OK;
}

int dqd_gpu_decode(dqd_gpu *g, dqd_codec *codec, const dqd_glayer *l, dq_kind kind, size_t first, size_t count,
                   void *out, dq_dtype dtype)
{
    dqd_gwork *w;
    const dqcu_codec *dc;
    uint32_t *dcor;
    const uint16_t *tail = NULL;
    int rc = decode_setup(g, codec, l, kind, first, count, dtype, &w, &dc, &dcor, &tail);
    if (rc < 0 || !count)
        return rc;
    if (codec_fixed(codec))
        return decode_fixed(w, codec, l, kind, first, count, out, dtype);
    const size_t n = codec->n, row = n * dq_dtype_size(dtype), chunk = DQD_GPIN_BYTES / row;
    uint8_t *dout;
    rc = dqd_gwork_buf(w, DQD_GBUF_IO, (count < chunk ? count : chunk) * row, (void **)&dout);
    if (rc < 0)
        return rc;
    /* Chunk i is copied out of its pinned half while chunk i + 1 decodes. */
    size_t prev_off = 0, prev_len = 0;
    int prev_half = -1;
    const uint8_t *prev = NULL;
    for (size_t off = 0; off < count;) {
        size_t m = count - off < chunk ? count - off : chunk;
        const uint8_t *const *wins;
        rc = records_dev(w, codec, l, first + off, m, &wins);
        if (rc < 0)
            return rc;
        int r = dqcu_decompress(dc, kind, wins, l->nwin, tail, l->tail, first + off, m, dout, dtype, dcor, w->stream);
        if (r < 0)
            return dqd_gcu_fail(r, "dqcu_decompress", __FILE__, __LINE__);
        int h;
        uint8_t *pin = dqd_gpin_take(w, m * row, &h);
        if (!pin)
            return DQ_INTERNAL;
        DQD_GCK(cudaMemcpyAsync(pin, dout, m * row, cudaMemcpyDeviceToHost, w->stream));
        rc = dqd_gpin_done(w, h);
        if (rc < 0)
            return rc;
        if (prev) {
            DQD_GCK(cudaEventSynchronize(w->ev[prev_half]));
            memcpy((uint8_t *)out + prev_off * row, prev, prev_len * row);
        }
        prev = pin;
        prev_half = h;
        prev_off = off;
        prev_len = m;
        off += m;
        if (l->hot_only) {
            /* the next chunk's rebuild copies through the pinned halves: read this one out first */
            DQD_GCK(cudaEventSynchronize(w->ev[prev_half]));
            memcpy((uint8_t *)out + prev_off * row, prev, prev_len * row);
            prev = NULL;
        }
    }
    if (prev) {
        DQD_GCK(cudaEventSynchronize(w->ev[prev_half]));
        memcpy((uint8_t *)out + prev_off * row, prev, prev_len * row);
    }
    return decode_verdict(w, dcor);
}

int dqd_gpu_decode_dev(dqd_gpu *g, dqd_codec *codec, const dqd_glayer *l, dq_kind kind, size_t first, size_t count,
                       void *dout, dq_dtype dtype)
{
    dqd_gwork *w;
    const dqcu_codec *dc;
    uint32_t *dcor;
    const uint16_t *tail = NULL;
    int rc = decode_setup(g, codec, l, kind, first, count, dtype, &w, &dc, &dcor, &tail);
    if (rc < 0 || !count)
        return rc;
    if (codec_fixed(codec)) {
        /* decoded on the host, then up */
        const size_t bytes = count * codec->n * dq_dtype_size(dtype);
        void *host = malloc(bytes);
        if (!host)
            return DQ_NOMEM;
        rc = decode_fixed(w, codec, l, kind, first, count, host, dtype);
        if (rc == DQ_OK)
            rc = dqd_gh2d(w, dout, host, bytes);
        free(host);
        return rc == DQ_OK ? dqd_gsync(w) : rc;
    }
    /* a hot-only layer's records are rebuilt for (at most) 64 windows at a time */
    const size_t row = codec->n * dq_dtype_size(dtype), step = l->hot_only ? 64u * l->W : count;
    for (size_t off = 0; off < count; off += step) {
        const size_t m = count - off < step ? count - off : step;
        const uint8_t *const *wins;
        rc = records_dev(w, codec, l, first + off, m, &wins);
        if (rc < 0)
            return rc;
        rc = dqcu_decompress(dc, kind, wins, l->nwin, tail, l->tail, first + off, m, (uint8_t *)dout + off * row, dtype,
                             dcor, w->stream);
        if (rc < 0)
            return dqd_gcu_fail(rc, "dqcu_decompress", __FILE__, __LINE__);
    }
    return decode_verdict(w, dcor);
}

int dqd_gpu_h2d(dqd_gpu *g, void *dst, const void *src, size_t bytes)
{
    dqd_gwork *w;
    int rc = dqd_gwork_get(g, &w);
    if (rc == DQ_OK)
        rc = dqd_gh2d(w, dst, src, bytes);
    return rc == DQ_OK ? dqd_gsync(w) : rc;
}

int dqd_gpu_d2h(dqd_gpu *g, void *dst, const void *src, size_t bytes)
{
    dqd_gwork *w;
    int rc = dqd_gwork_get(g, &w);
    return rc == DQ_OK ? dqd_gd2h(w, dst, src, bytes) : rc;
}

int dqd_gpu_copy_raw(dqd_gpu *g, dqd_codec *codec, const dqd_glayer *l, uint8_t *dst)
{
    const size_t wb = codec->window_bytes, tb = (size_t)l->tail * codec->n * sizeof(uint16_t);
    dqd_gwork *w;
    int rc = dqd_gwork_get(g, &w);
    if (rc == DQ_OK)
        rc = records_host(w, codec, l, 0, l->nwin, dst);
    dst += (size_t)l->nwin * wb;
    if (rc == DQ_OK && tb) {
        rc = dqd_gd2h(w, dst, l->d_tail, tb);
        if (rc == DQ_OK)
            rc = dqd_gd2h(w, dst + tb, l->d_tail + tail_elems(codec), tb);
    }
    return rc;
}

int dqd_gpu_attend(dqd_gpu *g, dqd_codec *codec, uint32_t q_heads, float scale, const dqd_gattn *items, size_t n,
                   bool dev)
{
    dqd_gwork *w;
    const dqcu_codec *dc;
    int rc = work_codec(g, codec, &w, &dc);
    if (rc < 0)
        return rc;
    const size_t qs = (size_t)q_heads * codec->profile.head_dim;
    const size_t per_item = sizeof(dqcu_attn_seq) + 2 * qs * sizeof(float) + q_heads * sizeof(float);
    size_t most = (DQD_GPIN_BYTES - 4 * 256) / per_item;
    if (most == 0)
        return DQ_UNSUPPORTED;
    if (most > 65535)
        most = 65535;
    /* The hot copies when the kernel takes the model's GQA group (the layers' check used 1). */
    const bool hot_ok = g->hot_layout && dqcu_attend_hot_check(dc, q_heads) == DQ_OK;
    bool records_only = false; /* this batch again over the records: the hot kernel refused its plan */
    for (size_t i0 = 0; i0 < n;) {
        size_t nb = n - i0 < most ? n - i0 : most;
        bool hot = hot_ok && !records_only;
        for (size_t b = 0; b < nb && hot; b++)
            hot = items[i0 + b].layer->hot_stride && items[i0 + b].layer->nhot == items[i0 + b].layer->nwin;
        if (!hot && (codec_fixed(codec) || (codec_pairs(codec) && dqcu_attend_kernel(dc, q_heads) < 0))) {
            /* no container attention on the device for the fixed-width family and version 2 beyond v7 */
            rc = attend_fixed(w, codec, q_heads, scale, items + i0, nb, dev);
            if (rc < 0)
                return rc;
            atomic_fetch_add_explicit(&g->host_attend_items, nb, memory_order_relaxed);
            records_only = false;
            i0 += nb;
            continue;
        }
        /* Over the records, a hot-only layer attends alone, over records rebuilt for it. */
        const uint8_t *const *rebuilt = NULL;
        for (size_t b = 0; b < nb && !hot; b++) {
            if (items[i0 + b].layer->hot_only) {
                nb = b ? b : 1;
                break;
            }
        }
        if (!hot && items[i0].layer->hot_only) {
            const dqd_glayer *l = items[i0].layer;
            rc = records_dev(w, codec, l, 0, dqd_glayer_tokens(l), &rebuilt);
            if (rc < 0)
                return rc;
        }
        /* One block, the same layout in pinned and device memory: descriptors | q | out | lse. */
        const size_t oq = align256(nb * sizeof(dqcu_attn_seq));
        const size_t oo = oq + align256(nb * qs * sizeof(float));
        const size_t ol = oo + align256(nb * qs * sizeof(float));
        const size_t end = ol + nb * q_heads * sizeof(float);
        int h;
        uint8_t *pin = dqd_gpin_take(w, end, &h);
        if (!pin)
            return DQ_INTERNAL;
        dqcu_attn_seq *hs = (dqcu_attn_seq *)(void *)pin;
        uint32_t max_tokens = 0;
        for (size_t b = 0; b < nb; b++) {
            const dqd_glayer *l = items[i0 + b].layer;
            hs[b].windows = hot           ? (const uint8_t *const *)l->d_hot
                            : l->hot_only ? rebuilt
                                          : (const uint8_t *const *)l->d_win;
            hs[b].tail_k = l->d_tail;
            hs[b].tail_v = l->d_tail + tail_elems(codec);
            hs[b].nwin = l->nwin;
            hs[b].tail_tokens = l->tail;
            uint64_t tok = dqd_glayer_tokens(l);
            if (tok > max_tokens)
                max_tokens = (uint32_t)tok;
            if (!dev)
                memcpy(pin + oq + b * qs * sizeof(float), items[i0 + b].q, qs * sizeof(float));
        }
        uint8_t *io;
        void *ws;
        size_t wsb = hot ? dqcu_attend_hot_workspace_size(dc, q_heads, (uint32_t)nb, max_tokens)
                         : dqcu_attend_workspace_size(dc, q_heads, (uint32_t)nb, max_tokens);
        rc = dqd_gwork_buf(w, DQD_GBUF_IO, end, (void **)&io);
        if (rc == DQ_OK)
            rc = dqd_gwork_buf(w, DQD_GBUF_WS, wsb ? wsb : 1, &ws);
        if (rc < 0)
            return rc;
        /* Queries from the host come with the descriptors; device ones are gathered on the device. */
        DQD_GCK(cudaMemcpyAsync(io, pin, dev ? oq : oo, cudaMemcpyHostToDevice, w->stream));
        for (size_t b = 0; dev && b < nb; b++)
            DQD_GCK(cudaMemcpyAsync(io + oq + b * qs * sizeof(float), items[i0 + b].q, qs * sizeof(float),
                                    cudaMemcpyDeviceToDevice, w->stream));
        int r = (hot ? dqcu_attend_hot : dqcu_attend)(dc, q_heads, scale, (const dqcu_attn_seq *)(void *)io,
                                                      (uint32_t)nb, max_tokens, (const float *)(void *)(io + oq),
                                                      (float *)(void *)(io + oo), (float *)(void *)(io + ol), ws, wsb,
                                                      w->stream);
        if (r == DQ_UNSUPPORTED && hot) {
            /* A launch the hot kernel cannot plan (its grid limits, beyond dqcu_attend_hot_check):
             * nothing ran; the same items over the records. */
            DQD_DEBUG("dqcu_attend_hot refused %zu items of up to %u tokens; attending over the records", nb,
                      max_tokens);
            rc = dqd_gpin_done(w, h);
            if (rc < 0)
                return rc;
            records_only = true;
            continue;
        }
        if (r < 0)
            return dqd_gcu_fail(r, hot ? "dqcu_attend_hot" : "dqcu_attend", __FILE__, __LINE__);
        if (hot)
            atomic_fetch_add_explicit(&g->hot_items, nb, memory_order_relaxed);
        records_only = false;
        if (dev) {
            for (size_t b = 0; b < nb; b++) {
                DQD_GCK(cudaMemcpyAsync(items[i0 + b].out, io + oo + b * qs * sizeof(float), qs * sizeof(float),
                                        cudaMemcpyDeviceToDevice, w->stream));
                if (items[i0 + b].lse)
                    DQD_GCK(cudaMemcpyAsync(items[i0 + b].lse, io + ol + b * q_heads * sizeof(float),
                                            q_heads * sizeof(float), cudaMemcpyDeviceToDevice, w->stream));
            }
            rc = dqd_gpin_done(w, h);
            if (rc < 0)
                return rc;
            DQD_GCK(cudaEventSynchronize(w->ev[h]));
            i0 += nb;
            continue;
        }
        DQD_GCK(cudaMemcpyAsync(pin + oo, io + oo, end - oo, cudaMemcpyDeviceToHost, w->stream));
        rc = dqd_gpin_done(w, h);
        if (rc < 0)
            return rc;
        DQD_GCK(cudaEventSynchronize(w->ev[h]));
        for (size_t b = 0; b < nb; b++) {
            memcpy(items[i0 + b].out, pin + oo + b * qs * sizeof(float), qs * sizeof(float));
            if (items[i0 + b].lse)
                memcpy(items[i0 + b].lse, pin + ol + b * q_heads * sizeof(float), q_heads * sizeof(float));
        }
        i0 += nb;
    }
    return DQ_OK;
}
