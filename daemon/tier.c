/* dquantd tiers (see tier.h). */
#include "tier.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "ctx.h"
#include "dquant/error.h"
#include "gpu.h"
#include "tensor.h"
#include "work.h"

bool dqd_tier_gpu_ok(const dqd_ctx *ctx, const dqd_model *m)
{
    return ctx->gpu && dqd_gpu_model_ok(ctx->gpu, m);
}

bool dqd_tier_precheck(const dqd_ctx *ctx)
{
    return ctx->gpu != NULL;
}

static int host_decode(const dqd_seq *seq, uint32_t layer, dq_kind kind, size_t first, size_t count, void *out,
                       dq_dtype dtype)
{
    dqd_codec *codec = seq->model->codec;
    dq_workspace *ws = dqd_codec_ws_take(codec);
    if (!ws)
        return DQ_NOMEM;
    int rc = dq_layer_decode(seq->layers[layer], ws, kind, first, count, out, dtype);
    dqd_codec_ws_give(codec, ws);
    return rc;
}

int dqd_tier_decode(dqd_ctx *ctx, const dqd_seq *seq, uint32_t layer, dq_kind kind, size_t first, size_t count,
                    void *out, dq_dtype dtype)
{
    const dqd_glayer *g = dqd_seq_glayer(seq, layer);
    if (g)
        return dqd_gpu_decode(ctx->gpu, seq->model->codec, g, kind, first, count, out, dtype);
    return host_decode(seq, layer, kind, first, count, out, dtype);
}

int dqd_tier_decode_dev(dqd_ctx *ctx, const dqd_seq *seq, uint32_t layer, dq_kind kind, size_t first, size_t count,
                        void *dout, dq_dtype dtype)
{
    dqd_codec *codec = seq->model->codec;
    const dqd_glayer *g = dqd_seq_glayer(seq, layer);
    if (g)
        return dqd_gpu_decode_dev(ctx->gpu, codec, g, kind, first, count, dout, dtype);
    /* A host layer: decoded on the host, then copied. */
    size_t bytes = count * codec->n * dq_dtype_size(dtype);
    uint8_t *tmp = malloc(bytes ? bytes : 1);
    int rc = tmp ? host_decode(seq, layer, kind, first, count, tmp, dtype) : DQ_NOMEM;
    if (rc == DQ_OK)
        rc = dqd_gpu_h2d(ctx->gpu, dout, tmp, bytes);
    free(tmp);
    return rc;
}

int dqd_tier_copy_raw(dqd_ctx *ctx, const dqd_seq *seq, uint32_t layer, uint8_t *dst)
{
    dqd_codec *codec = seq->model->codec;
    const dqd_glayer *g = dqd_seq_glayer(seq, layer);
    if (g)
        return dqd_gpu_copy_raw(ctx->gpu, codec, g, dst);
    const dq_layer *l = seq->layers[layer];
    if (!l)
        return DQ_OK;
    size_t nwin = dq_layer_window_count(l), wb = codec->window_bytes;
    for (size_t w = 0; w < nwin; w++)
        memcpy(dst + w * wb, dq_layer_window(l, w), wb);
    dst += nwin * wb;
    size_t tail = dq_layer_tail_tokens(l) * codec->n * sizeof(uint16_t);
    if (tail) {
        memcpy(dst, dq_layer_tail(l, DQ_KIND_K), tail);
        memcpy(dst + tail, dq_layer_tail(l, DQ_KIND_V), tail);
    }
    return DQ_OK;
}

int dqd_tier_alloc_device(dqd_ctx *ctx, size_t bytes, void **out)
{
    *out = NULL;
    return ctx->gpu ? dqd_gpu_alloc_transient(ctx->gpu, bytes, out) : DQ_UNSUPPORTED;
}

void dqd_tier_free_device(dqd_ctx *ctx, void *p)
{
    if (p)
        dqd_gpu_free_transient(ctx->gpu, p);
}

/* ---- appends ---- */

int dqd_tier_place_layers(dqd_ctx *ctx, dqd_seq *seq, uint32_t first, uint32_t n, uint64_t ntok, dqd_tier_append *t,
                          uint64_t *gpu_reserved, dqd_gpu_moves *mv)
{
    if (!ctx->gpu)
        return DQ_OK; /* the cpu backend: every layer stays on the host */
    dqd_store *store = ctx->store;
    *gpu_reserved = 0;
    if (!dqd_tier_gpu_ok(ctx, seq->model))
        return DQ_OK;
    if (dqd_store_gpu_slots(store, seq) < 0)
        return DQ_NOMEM;
    const dqd_codec *codec = seq->model->codec;
    uint64_t all = 0, resident = 0;
    for (uint32_t i = 0; i < n; i++) {
        const dqd_glayer *g = seq->glayers[first + i];
        uint64_t need = dqd_gpu_need(ctx->gpu, codec, g ? NULL : seq->layers[first + i], g, ntok);
        all += need;
        if (g)
            resident += need;
    }
    if (dqd_store_gpu_reserve(store, all, mv) == DQ_OK) {
        *gpu_reserved = all;
        for (uint32_t i = 0; i < n; i++) {
            t[i].gpu = true;
            t[i].promote = seq->layers[first + i] != NULL;
        }
        return DQ_OK;
    }
    if (dqd_store_gpu_reserve(store, resident, mv) == DQ_OK) {
        *gpu_reserved = resident;
        for (uint32_t i = 0; i < n; i++)
            t[i].gpu = seq->glayers[first + i] != NULL;
        return DQ_OK;
    }
    for (uint32_t i = 0; i < n; i++)
        t[i].spill = seq->glayers[first + i] != NULL;
    return DQ_OK;
}

uint64_t dqd_tier_host_need(const dqd_seq *seq, uint32_t layer, const dqd_tier_append *t, uint64_t ntok)
{
    const dqd_codec *codec = seq->model->codec;
    if (t->spill)
        return dqd_store_spill_need(codec, seq->glayers[layer], ntok);
    if (!t->gpu)
        return dqd_store_append_need(codec, seq->layers[layer], ntok);
    return 0;
}

int dqd_tier_append_apply(dqd_ctx *ctx, dqd_seq *seq, uint32_t layer, dqd_tier_append *t, const void *k, const void *v,
                          dq_dtype dtype, size_t ntok, bool dev, dq_encode_stats *stats)
{
    dqd_codec *codec = seq->model->codec;
    int rc = DQ_OK;
    if (t->gpu) {
        if (t->promote) {
            rc = dqd_gpu_promote(ctx->gpu, codec, &seq->layers[layer], &seq->glayers[layer]);
            t->promoted = rc == DQ_OK;
        }
        if (rc == DQ_OK)
            rc = dqd_gpu_append(ctx->gpu, codec, &t->dev, &seq->glayers[layer], k, v, dtype, ntok,
                                dev ? DQD_GAPPEND_DEVICE | DQD_GAPPEND_CHECKED : 0, stats);
        if (rc == DQ_OK)
            rc = dqd_gpu_finish(ctx->gpu);
        return rc;
    }
    dq_layer **slot = &seq->layers[layer];
    if (t->spill) {
        rc = dqd_gpu_demote(ctx->gpu, codec, &seq->glayers[layer], slot);
        if (rc < 0)
            return rc;
        t->spilled = true;
    }
    dq_workspace *ws = dqd_codec_ws_take(codec);
    if (!ws)
        return DQ_NOMEM;
    rc = dqd_append_apply(&t->host, codec, layer, ws, slot, k, v, dtype, ntok, stats);
    dqd_codec_ws_give(codec, ws);
    return rc;
}

int dqd_tier_append_raw(dqd_ctx *ctx, dqd_seq *seq, uint32_t layer, dqd_tier_append *t, const dqd_raw_in *in,
                        size_t *bad_window)
{
    dqd_codec *codec = seq->model->codec;
    dq_layer **slot = &seq->layers[layer];
    if (t->spill) {
        int rc = dqd_gpu_demote(ctx->gpu, codec, &seq->glayers[layer], slot);
        if (rc < 0)
            return rc;
        t->spilled = true;
    }
    dq_workspace *ws = dqd_codec_ws_take(codec);
    if (!ws)
        return DQ_NOMEM;
    int rc = dqd_append_raw(&t->host, codec, layer, ws, slot, in, bad_window);
    dqd_codec_ws_give(codec, ws);
    if (rc == DQ_INTERNAL)
        t->dev.broken = true; /* half appended and not restorable: the sequence is dropped */
    return rc;
}

int dqd_tier_append_rollback(dqd_ctx *ctx, dqd_seq *seq, uint32_t layer, dqd_tier_append *t)
{
    dqd_codec *codec = seq->model->codec;
    if (t->gpu)
        return dqd_gpu_rollback(ctx->gpu, codec, &t->dev, &seq->glayers[layer]);
    return dqd_append_rollback(&t->host, codec, layer, &seq->layers[layer]);
}

void dqd_tier_append_clear(dqd_tier_append *t)
{
    dqd_append_clear(&t->host);
    dqd_gappend_clear(&t->dev);
}

int dqd_tier_check_device(dqd_ctx *ctx, dqd_codec *codec, const void *k, const void *v, dq_dtype dtype, size_t layers,
                          size_t ntok, uint32_t *bad_layer)
{
    return dqd_gpu_check_tokens(ctx->gpu, codec, k, v, dtype, layers, ntok, bad_layer);
}

int dqd_tier_to_host(dqd_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    return dqd_gpu_d2h(ctx->gpu, dst, src, bytes);
}

/* ---- batches of items (ATTEND) ---- */

int dqd_layer_key_cmp(const void *a, const void *b)
{
    const dqd_layer_key *x = a, *y = b;
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    return x->item < y->item ? -1 : x->item > y->item;
}

int dqd_tier_place_items(dqd_ctx *ctx, dqd_tier_item *items, size_t n, const dqd_access_set *as, uint64_t *gpu_reserved,
                         dqd_gpu_moves *mv)
{
    if (!ctx->gpu)
        return DQ_OK; /* the cpu backend: every layer stays on the host */
    dqd_store *store = ctx->store;
    dqd_layer_key *keys = malloc(n * sizeof *keys);
    bool *cand = calloc(n, sizeof *cand);
    if (!keys || !cand) {
        free(keys);
        free(cand);
        return DQ_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        keys[i] = (dqd_layer_key){(uintptr_t)items[i].seq, items[i].layer, i};
    qsort(keys, n, sizeof *keys, dqd_layer_key_cmp);

    int rc = DQ_OK;
    uint64_t all = 0, resident = 0;
    size_t ncand = 0;
    for (size_t g0 = 0, g1; g0 < n; g0 = g1) {
        bool app = false;
        for (g1 = g0; g1 < n && dqd_layer_key_same(&keys[g1], &keys[g0]); g1++)
            app |= items[keys[g1].item].append;
        dqd_tier_item *it = &items[keys[g0].item];
        dqd_seq *seq = it->seq;
        if (!dqd_tier_gpu_ok(ctx, seq->model))
            continue;
        const dqd_glayer *gl = dqd_seq_glayer(seq, it->layer);
        const dq_layer *hl = seq->layers[it->layer];
        /* A layer moved to the host while this request waited is held for reading only: it stays. */
        bool writable = dqd_access_mode(as, seq) == DQD_ACCESS_WRITE;
        if (gl) {
            for (size_t k = g0; k < g1; k++)
                items[keys[k].item].gpu = true;
            if (app)
                resident += dqd_gpu_need(ctx->gpu, it->codec, NULL, gl, 1);
        } else if ((hl || app) && writable) {
            if (dqd_store_gpu_slots(store, seq) < 0) {
                rc = DQ_NOMEM;
                goto out;
            }
            cand[keys[g0].item] = true;
            ncand++;
            all += dqd_gpu_need(ctx->gpu, it->codec, hl, NULL, app ? 1 : 0);
        }
    }
    all += resident;
    if (ncand && dqd_store_gpu_reserve(store, all, mv) == DQ_OK) {
        *gpu_reserved = all;
        for (size_t g0 = 0, g1; g0 < n; g0 = g1) {
            for (g1 = g0; g1 < n && dqd_layer_key_same(&keys[g1], &keys[g0]); g1++)
                ;
            dqd_tier_item *it = &items[keys[g0].item];
            if (!cand[keys[g0].item])
                continue;
            it->promote = it->seq->layers[it->layer] != NULL;
            for (size_t k = g0; k < g1; k++)
                items[keys[k].item].gpu = true;
        }
    } else if (resident && dqd_store_gpu_reserve(store, resident, mv) == DQ_OK) {
        *gpu_reserved = resident;
    } else if (resident) {
        /* no room for the resident layers' appends: those layers go to the host */
        for (size_t g0 = 0, g1; g0 < n; g0 = g1) {
            bool app = false;
            for (g1 = g0; g1 < n && dqd_layer_key_same(&keys[g1], &keys[g0]); g1++)
                app |= items[keys[g1].item].append;
            dqd_tier_item *it = &items[keys[g0].item];
            if (!app || !dqd_seq_glayer(it->seq, it->layer))
                continue;
            for (size_t k = g0; k < g1; k++) {
                dqd_tier_item *x = &items[keys[k].item];
                x->gpu = false;
                x->spill = x->append;
            }
        }
    }
out:
    free(keys);
    free(cand);
    return rc;
}

/* The item's appended token (k, v), aligned for its element type; *kt and *vt are copies to free
 * (NULL when none was needed). */
static int aligned_token(const dqd_tier_item *it, const void **kd, const void **vd, void **kt, void **vt)
{
    *vt = NULL;
    int rc = dqd_tensor_aligned(&it->ak, kd, kt);
    if (rc == 0)
        rc = dqd_tensor_aligned(&it->av, vd, vt);
    return rc;
}

/* Whether item it's append can go with others' in one dqd_gpu_append_tokens (seal false: it fits
 * its layer's tail) or one dqd_gpu_append_seal_tokens (seal true: it fills the tail's window). */
static bool batchable(const dqd_tier_item *it, bool seal)
{
    if (!it->gpu || !it->checked || it->batched)
        return false;
    const dqd_glayer *l = dqd_seq_glayer(it->seq, it->layer);
    return seal ? dqd_gpu_append_seals_one(it->codec, l) : dqd_gpu_append_fits(it->codec, l);
}

/* The GPU appends of single tokens: those that fit their layer's tail in one dqd_gpu_append_tokens
 * (one copy, one launch) per codec instead of two copies and two conversions per item; those that
 * fill their window in one dqd_gpu_append_seal_tokens (one encode, one synchronization) per codec
 * instead of one per item. Marks them batched; false when one failed (its rc set). Without memory
 * for the lists every item goes alone. */
static bool append_gpu_tokens(dqd_ctx *ctx, dqd_tier_item *items, const size_t *append_idx, size_t nappend)
{
    dqd_gtoken *tok = malloc(nappend * sizeof *tok);
    size_t *who = malloc(nappend * sizeof *who);
    void **tmp = calloc(2 * nappend, sizeof *tmp);
    bool ok = true;
    for (size_t q = 0; q < 2 * nappend && tok && who && tmp && ok; q++) {
        const bool seal = q >= nappend;
        const size_t k0 = q % nappend;
        const dqd_tier_item *first = &items[append_idx[k0]];
        if (!batchable(first, seal))
            continue;
        size_t cnt = 0;
        for (size_t k = k0; k < nappend; k++) {
            dqd_tier_item *it = &items[append_idx[k]];
            if (it->codec != first->codec || !batchable(it, seal))
                continue;
            const void *kd, *vd;
            if (dqd_tensor_aligned(&it->ak, &kd, &tmp[2 * k]) < 0 ||
                dqd_tensor_aligned(&it->av, &vd, &tmp[2 * k + 1]) < 0)
                continue; /* the item goes alone and reports it */
            it->batched = true;
            who[cnt] = append_idx[k];
            tok[cnt++] = (dqd_gtoken){it->seq->glayers[it->layer], &it->gtxn, kd, vd, dqd_tensor_dtype(&it->ak)};
        }
        int rc = seal ? dqd_gpu_append_seal_tokens(ctx->gpu, first->codec, tok, cnt)
                      : dqd_gpu_append_tokens(ctx->gpu, first->codec, tok, cnt);
        for (size_t j = 0; rc < 0 && j < cnt; j++)
            items[who[j]].rc = rc;
        ok = rc == DQ_OK;
    }
    for (size_t i = 0; tmp && i < 2 * nappend; i++)
        free(tmp[i]);
    free(tok);
    free(who);
    free(tmp);
    return ok;
}

void dqd_tier_items_append_gpu(dqd_ctx *ctx, dqd_tier_item *items, size_t n, const size_t *append_idx, size_t nappend,
                               bool fused)
{
    dqd_gpu *gpu = ctx->gpu;
    for (size_t i = 0; i < n; i++) {
        dqd_tier_item *it = &items[i];
        if (!it->promote)
            continue;
        it->rc = dqd_gpu_promote(gpu, it->codec, &it->seq->layers[it->layer], &it->seq->glayers[it->layer]);
        it->promoted = it->rc == DQ_OK;
        if (it->rc < 0)
            return;
    }
    bool failed = !append_gpu_tokens(ctx, items, append_idx, nappend);
    for (size_t k = 0; k < nappend && !failed; k++) {
        dqd_tier_item *it = &items[append_idx[k]];
        if (!it->gpu || it->batched)
            continue;
        const void *kd, *vd;
        void *kt, *vt;
        it->rc = aligned_token(it, &kd, &vd, &kt, &vt);
        if (it->rc == 0)
            it->rc = dqd_gpu_append(gpu, it->codec, &it->gtxn, &it->seq->glayers[it->layer], kd, vd,
                                    dqd_tensor_dtype(&it->ak), 1, it->checked ? DQD_GAPPEND_CHECKED : 0, NULL);
        free(kt);
        free(vt);
        failed = it->rc < 0;
    }
    /* Fused and applied: the attention's own synchronization comes next on the same stream. */
    if (fused && !failed)
        return;
    int rc = dqd_gpu_finish(gpu);
    if (rc < 0)
        for (size_t k = 0; k < nappend; k++)
            if (items[append_idx[k]].gpu && items[append_idx[k]].rc == 0)
                items[append_idx[k]].rc = rc;
}

void dqd_tier_item_append_host(dqd_ctx *ctx, dqd_tier_item *it)
{
    if (it->spill) {
        it->rc = dqd_gpu_demote(ctx->gpu, it->codec, &it->seq->glayers[it->layer], &it->seq->layers[it->layer]);
        if (it->rc < 0)
            return;
        it->spilled = true;
    }
    const void *kd, *vd;
    void *kt, *vt;
    it->rc = aligned_token(it, &kd, &vd, &kt, &vt);
    if (it->rc == 0) {
        dq_workspace *ws = dqd_codec_ws_take(it->codec);
        it->rc = ws ? dqd_append_apply(&it->txn, it->codec, it->layer, ws, &it->seq->layers[it->layer], kd, vd,
                                       dqd_tensor_dtype(&it->ak), 1, NULL)
                    : DQ_NOMEM;
        dqd_codec_ws_give(it->codec, ws);
    }
    free(kt);
    free(vt);
}

uint64_t dqd_tier_item_host_need(const dqd_tier_item *it)
{
    if (it->spill)
        return dqd_store_spill_need(it->codec, dqd_seq_glayer(it->seq, it->layer), 1);
    return dqd_store_append_need(it->codec, it->seq->layers[it->layer], 1);
}

int dqd_tier_item_rollback(dqd_ctx *ctx, dqd_tier_item *it)
{
    if (it->gpu)
        return dqd_gpu_rollback(ctx->gpu, it->codec, &it->gtxn, &it->seq->glayers[it->layer]);
    return dqd_append_rollback(&it->txn, it->codec, it->layer, &it->seq->layers[it->layer]);
}

void dqd_tier_item_clear(dqd_tier_item *it)
{
    dqd_append_clear(&it->txn);
    dqd_gappend_clear(&it->gtxn);
}

/* ---- phase C: attention ---- */

void dqd_tier_items_attend_gpu(dqd_ctx *ctx, dqd_tier_item *items, size_t n, uint32_t q_heads, uint32_t head_dim,
                               float scale, const float *qf, float *out, float *lse)
{
    const size_t qsize = (size_t)q_heads * head_dim;
    dqd_gattn *batch = malloc(n * sizeof *batch);
    size_t *idx = malloc(n * sizeof *idx);
    bool *done = calloc(n, sizeof *done);
    if (!batch || !idx || !done) {
        for (size_t i = 0; i < n; i++)
            if (items[i].gpu)
                items[i].rc = DQ_NOMEM;
        free(batch);
        free(idx);
        free(done);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (!items[i].gpu || done[i])
            continue;
        dqd_codec *codec = items[i].codec;
        size_t nb = 0;
        for (size_t j = i; j < n; j++) {
            dqd_tier_item *it = &items[j];
            if (!it->gpu || done[j] || it->codec != codec)
                continue;
            done[j] = true;
            const dqd_glayer *l = dqd_seq_glayer(it->seq, it->layer);
            if (!l) {
                memset(out + j * qsize, 0, qsize * sizeof(float));
                for (uint32_t h = 0; h < q_heads; h++)
                    lse[j * q_heads + h] = -INFINITY;
                continue;
            }
            batch[nb] = (dqd_gattn){l, qf + j * qsize, out + j * qsize, lse + j * q_heads};
            idx[nb++] = j;
        }
        int rc = nb ? dqd_gpu_attend(ctx->gpu, codec, q_heads, scale, batch, nb, false) : DQ_OK;
        for (size_t b = 0; b < nb; b++)
            items[idx[b]].rc = rc;
    }
    free(batch);
    free(idx);
    free(done);
}

/* ---- moves to the host (a GPU reservation's victims) ---- */

typedef struct move_job {
    size_t victim;
    uint32_t layer;
    int rc;
} move_job;

typedef struct moves_run {
    dqd_ctx *ctx;
    dqd_gpu_moves *mv;
    move_job *jobs;
    size_t njobs;
    dqd_moves_done_fn done;
    void *arg;
} moves_run;

static void move_task(void *arg, size_t i)
{
    moves_run *r = arg;
    move_job *j = &r->jobs[i];
    dqd_seq *seq = r->mv->seqs[j->victim];
    /* The victim is held exclusively, so its layers are this task's alone. */
    j->rc = dqd_gpu_demote(r->ctx->gpu, seq->model->codec, &seq->glayers[j->layer], &seq->layers[j->layer]);
}

static void moves_done(void *arg)
{
    moves_run *r = arg;
    dqd_gpu_moves *mv = r->mv;
    for (size_t v = 0; v < mv->n; v++)
        mv->rc[v] = 0;
    for (size_t i = 0; i < r->njobs; i++)
        if (r->jobs[i].rc < 0 && mv->rc[r->jobs[i].victim] == 0)
            mv->rc[r->jobs[i].victim] = r->jobs[i].rc;
    dqd_store_gpu_moves_finish(r->ctx->store, mv);
    dqd_moves_done_fn done = r->done;
    void *dctx = r->arg;
    free(r->jobs);
    free(r);
    done(dctx, DQ_OK);
}

void dqd_tier_moves_run(dqd_ctx *ctx, dqd_gpu_moves *mv, dqd_moves_done_fn done, void *arg)
{
    if (!mv->n) {
        done(arg, DQ_OK);
        return;
    }
    size_t njobs = 0;
    for (size_t v = 0; v < mv->n; v++)
        for (uint32_t l = 0; l < mv->seqs[v]->model->layers; l++)
            njobs += dqd_seq_glayer(mv->seqs[v], l) != NULL;
    moves_run *r = calloc(1, sizeof *r);
    move_job *jobs = calloc(njobs ? njobs : 1, sizeof *jobs);
    if (!r || !jobs) {
        free(r);
        free(jobs);
        dqd_store_gpu_moves_finish(ctx->store, mv);
        done(arg, DQ_NOMEM);
        return;
    }
    size_t k = 0;
    for (size_t v = 0; v < mv->n; v++)
        for (uint32_t l = 0; l < mv->seqs[v]->model->layers; l++)
            if (dqd_seq_glayer(mv->seqs[v], l))
                jobs[k++] = (move_job){v, l, 0};
    *r = (moves_run){ctx, mv, jobs, njobs, done, arg};
    if (!njobs) {
        moves_done(r);
        return;
    }
    if (dqd_tasks_run(ctx, njobs, move_task, moves_done, r) < 0) {
        free(jobs);
        free(r);
        dqd_store_gpu_moves_finish(ctx->store, mv);
        done(arg, DQ_NOMEM);
    }
}
