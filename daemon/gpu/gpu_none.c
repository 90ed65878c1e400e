/* dquantd built without CUDA: the cuda backend is absent. dqd_gpu_create says so, and since no
 * dqd_gpu ever exists nothing else here is called (see gpu.h). */
#include <stdio.h>

#include "dquant/error.h"
#include "gpu.h"

int dqd_gpu_create(const dqd_config *cfg, dqd_hostmem *mem, dqd_gpu **out, char *why, size_t whylen)
{
    (void)cfg;
    (void)mem;
    *out = NULL;
    snprintf(why, whylen, "this dquantd was built without CUDA support");
    return DQ_UNSUPPORTED;
}

void dqd_gpu_destroy(dqd_gpu *g)
{
    (void)g;
}

uint64_t dqd_gpu_budget(const dqd_gpu *g)
{
    (void)g;
    return 0;
}

uint64_t dqd_gpu_allocated(const dqd_gpu *g)
{
    (void)g;
    return 0;
}

void dqd_gpu_hot_stats(const dqd_gpu *g, uint64_t *windows, uint64_t *bytes, uint64_t *items)
{
    (void)g;
    *items = 0;
    *windows = 0;
    *bytes = 0;
}

void dqd_gpu_hot_only_stats(const dqd_gpu *g, uint64_t *windows, uint64_t *rebuilt, uint64_t *rebuilt_gpu,
                            uint64_t *rebuilt_cpu)
{
    (void)g;
    *windows = 0;
    *rebuilt = 0;
    *rebuilt_gpu = 0;
    *rebuilt_cpu = 0;
}

uint64_t dqd_gpu_encode_stats(const dqd_gpu *g)
{
    (void)g;
    return 0;
}

uint64_t dqd_gpu_host_attend_stats(const dqd_gpu *g)
{
    (void)g;
    return 0;
}

const char *dqd_gpu_describe(const dqd_gpu *g)
{
    (void)g;
    return "none";
}

bool dqd_gpu_model_ok(const dqd_gpu *g, const dqd_model *m)
{
    (void)g;
    (void)m;
    return false;
}

void dqd_gpu_free_seq_layers(void *gpu, dqd_seq *seq)
{
    (void)gpu;
    (void)seq;
}

void dqd_gpu_forget_codec(void *gpu, const dqd_codec *codec)
{
    (void)gpu;
    (void)codec;
}

uint64_t dqd_gpu_need(const dqd_gpu *g, const dqd_codec *codec, const dq_layer *host, const dqd_glayer *gpu,
                      uint64_t ntok)
{
    (void)g;
    (void)codec;
    (void)host;
    (void)gpu;
    (void)ntok;
    return 0;
}

int dqd_gpu_append(dqd_gpu *g, dqd_codec *codec, dqd_gappend *txn, dqd_glayer **slot, const void *k, const void *v,
                   dq_dtype dtype, size_t ntok, unsigned flags, dq_encode_stats *stats)
{
    (void)g, (void)codec, (void)txn, (void)slot, (void)k, (void)v, (void)dtype, (void)ntok, (void)flags, (void)stats;
    return DQ_UNSUPPORTED;
}

int dqd_gpu_check_tokens(dqd_gpu *g, dqd_codec *codec, const void *k, const void *v, dq_dtype dtype, size_t layers,
                         size_t ntok, uint32_t *bad_layer)
{
    (void)g, (void)codec, (void)k, (void)v, (void)dtype, (void)layers, (void)ntok, (void)bad_layer;
    return DQ_UNSUPPORTED;
}

bool dqd_gpu_append_fits(const dqd_codec *codec, const dqd_glayer *l)
{
    (void)codec, (void)l;
    return false;
}

int dqd_gpu_append_tokens(dqd_gpu *g, dqd_codec *codec, const dqd_gtoken *tok, size_t count)
{
    (void)g, (void)codec, (void)tok, (void)count;
    return DQ_UNSUPPORTED;
}

bool dqd_gpu_append_seals_one(const dqd_codec *codec, const dqd_glayer *l)
{
    (void)codec, (void)l;
    return false;
}

int dqd_gpu_append_seal_tokens(dqd_gpu *g, dqd_codec *codec, const dqd_gtoken *tok, size_t count)
{
    (void)g, (void)codec, (void)tok, (void)count;
    return DQ_UNSUPPORTED;
}

int dqd_gpu_rollback(dqd_gpu *g, dqd_codec *codec, dqd_gappend *txn, dqd_glayer **slot)
{
    (void)g, (void)codec, (void)txn, (void)slot;
    return DQ_OK;
}

void dqd_gappend_clear(dqd_gappend *txn)
{
    (void)txn;
}

int dqd_gpu_finish(dqd_gpu *g)
{
    (void)g;
    return DQ_OK;
}

int dqd_gpu_promote(dqd_gpu *g, dqd_codec *codec, dq_layer **host, dqd_glayer **gpu)
{
    (void)g, (void)codec, (void)host, (void)gpu;
    return DQ_UNSUPPORTED;
}

int dqd_gpu_demote(dqd_gpu *g, dqd_codec *codec, dqd_glayer **gpu, dq_layer **host)
{
    (void)g, (void)codec, (void)host, (void)gpu;
    return DQ_UNSUPPORTED;
}

int dqd_gpu_decode(dqd_gpu *g, dqd_codec *codec, const dqd_glayer *l, dq_kind kind, size_t first, size_t count,
                   void *out, dq_dtype dtype)
{
    (void)g, (void)codec, (void)l, (void)kind, (void)first, (void)count, (void)out, (void)dtype;
    return DQ_UNSUPPORTED;
}

int dqd_gpu_decode_dev(dqd_gpu *g, dqd_codec *codec, const dqd_glayer *l, dq_kind kind, size_t first, size_t count,
                       void *dout, dq_dtype dtype)
{
    (void)g, (void)codec, (void)l, (void)kind, (void)first, (void)count, (void)dout, (void)dtype;
    return DQ_UNSUPPORTED;
}

int dqd_gpu_alloc_transient(dqd_gpu *g, size_t bytes, void **out)
{
    (void)g, (void)bytes;
    *out = NULL;
    return DQ_UNSUPPORTED;
}

void dqd_gpu_free_transient(dqd_gpu *g, void *p)
{
    (void)g, (void)p;
}

int dqd_gpu_h2d(dqd_gpu *g, void *dst, const void *src, size_t bytes)
{
    (void)g, (void)dst, (void)src, (void)bytes;
    return DQ_UNSUPPORTED;
}

int dqd_gpu_d2h(dqd_gpu *g, void *dst, const void *src, size_t bytes)
{
    (void)g, (void)dst, (void)src, (void)bytes;
    return DQ_UNSUPPORTED;
}

int dqd_gpu_copy_raw(dqd_gpu *g, dqd_codec *codec, const dqd_glayer *l, uint8_t *dst)
{
    (void)g, (void)codec, (void)l, (void)dst;
    return DQ_UNSUPPORTED;
}

int dqd_gpu_attend(dqd_gpu *g, dqd_codec *codec, uint32_t q_heads, float scale, const dqd_gattn *items, size_t n,
                   bool dev)
{
    (void)g, (void)codec, (void)q_heads, (void)scale, (void)items, (void)n, (void)dev;
    return DQ_UNSUPPORTED;
}
