/* The device codec: tables derived once from a host dq_codec and uploaded. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rans2_cuda.cuh"

static thread_local int g_last_cuda_error;

void dqcu__set_cuda_error(cudaError_t e)
{
    g_last_cuda_error = (int)e;
}

extern "C" int dqcu_last_cuda_error(void)
{
    return g_last_cuda_error;
}

extern "C" int dqcu_device_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    int usable = 0;
    for (int i = 0; i < count; i++) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) == cudaSuccess && major >= 9)
            usable++;
    }
    (void)cudaGetLastError();
    return usable;
}

int dqcu__use_device(const dqcu_codec *dc)
{
    int cur = -1;
    DQCU_CHECK(cudaGetDevice(&cur));
    return cur == dc->device ? DQ_OK : DQ_INVALID_ARGUMENT;
}

/* x / f == (x · magic) >> shift for all x < 2^31 and 1 <= f <= 4095: with l = ceil(log2 f),
 * magic = ceil(2^(31+l) / f) < 2^32 and magic·f - 2^(31+l) < f <= 2^l (Granlund–Montgomery). */
static void div_magic(uint32_t f, uint32_t *magic, uint32_t *shift)
{
    uint32_t l = 0;
    while ((1u << l) < f)
        l++;
    uint64_t num = 1ull << (31 + l);
    *magic = (uint32_t)((num + f - 1) / f);
    *shift = 31 + l;
}

static void kind_tab(const dq_codec *c, int k, dqcu_kind_tab *t)
{
    const dq__kind_tables *kt = &c->kt[k];
    memset(t, 0, sizeof *t);
    t->M = kt->levels;
    t->C = kt->container;
    t->cheapest = kt->cheapest;
    t->P = dqcu_pow2_ceil(kt->levels);
    t->npairs = kt->levels * (kt->levels - 1) / 2;
    t->budget_q16 = (int64_t)kt->budget_q16;
    for (uint32_t m = 0; m < 32; m++) {
        t->cost_q16[m] = kt->cost_q16[m];
        t->cost[m] = kt->cost[m];
    }
    for (uint32_t m = 0; m < kt->levels; m++) {
        uint32_t f = kt->enc.freq[m], magic, shift;
        div_magic(f, &magic, &shift);
        t->enc[m] = make_uint4(DQCU_RANS_L * f, magic, 256u - f, (uint32_t)kt->enc.cum[m] | (shift << 16));
    }
    for (uint32_t z = 0; z < 256; z++) {
        uint32_t e = kt->dec.entry[z];
        uint32_t sym = e & 0xffu, bias = (e >> 8) & 0xffu, f = (e >> 16) & 0x1ffu;
        t->dec[z] = bias | (f << 8) | ((2u * sym) << 16);
    }
    for (uint32_t b = 1; b < kt->levels; b++)
        for (uint32_t a = 0; a < b; a++) {
            uint32_t p = b * (b - 1) / 2 + a;
            t->pair_a[p] = (uint8_t)a;
            t->pair_b[p] = (uint8_t)b;
        }
}

/* Version 2's tables of one kind, repacked from lib's (dq__rans2_tables, built with the codec). */
static void kind_tab2(const dq__kind_tables *kt, dqcu_rans2_kind *t)
{
    memset(t, 0, sizeof *t);
    for (uint32_t z = 0; z < DQCU_RANS2_TOTAL; z++) {
        const dq__rans2_entry *e = &kt->dec2.entry[z];
        t->dec[z] = (uint32_t)e->bias | (uint32_t)e->f << 12;
        t->sym[z] = (uint16_t)(e->m1 | e->m2 << 8);
        if (kt->levels <= DQCU_RANS2_ATT_MAX_LEVELS)
            t->att[z] = t->dec[z] | (uint32_t)(2u * e->m1 | 2u * e->m2 << 4) << 24;
    }
    const uint32_t P = kt->levels * kt->levels;
    for (uint32_t s = 0; s < P; s++) {
        uint32_t f = kt->enc2.freq[s], magic, shift;
        div_magic(f, &magic, &shift);
        t->enc[s] = make_uint4((DQCU_RANS_L >> DQ_RANS2_PREC << 8) * f, magic, DQCU_RANS2_TOTAL - f,
                               (uint32_t)kt->enc2.cum[s] | (shift << 16));
        t->cost[s] = kt->pair_cost[s];
        t->cost_q16[s] = kt->pair_cost_q16[s];
    }
    t->cheap[0] = kt->cheap[0];
    t->cheap[1] = kt->cheap[1];
}

/* Uploads version 2's tables of codec (format version 2 only) to dc->tab2. */
static int upload_tab2(const dq_codec *codec, dqcu_codec *dc)
{
    dqcu_rans2_tables *h = (dqcu_rans2_tables *)malloc(sizeof *h);
    if (!h)
        return DQ_NOMEM;
    for (int k = 0; k < 2; k++)
        kind_tab2(&codec->kt[k], &h->kind[k]);
    int rc = DQ_OK;
    DQCU_CHECK_GOTO(cudaMalloc((void **)&dc->tab2, sizeof *h), rc, done);
    DQCU_CHECK_GOTO(cudaMemcpy(dc->tab2, h, sizeof *h, cudaMemcpyHostToDevice), rc, done);
done:
    free(h);
    return rc;
}

extern "C" void dqcu_settings_default(dqcu_settings *s)
{
    if (!s)
        return;
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
    s->attend_kernel = DQCU_KERNEL_AUTO;
    s->encode_kernel = DQCU_KERNEL_AUTO;
    s->encode_schedule = DQCU_SCHEDULE_PLANNED;
}

static bool version_in(int v, const int *list, size_t count)
{
    if (v == DQCU_KERNEL_AUTO)
        return true;
    for (size_t i = 0; i < count; i++)
        if (list[i] == v)
            return true;
    return false;
}

static bool settings_ok(const dqcu_settings *s)
{
    if (s->size != sizeof *s)
        return false;
    for (size_t i = 0; i < sizeof s->reserved / sizeof s->reserved[0]; i++)
        if (s->reserved[i])
            return false;
    size_t na = 0, ne = 0;
    const int *att = dqcu_attend_kernels(&na), *enc = dqcu_encode_kernels(&ne);
    return version_in(s->attend_kernel, att, na) && version_in(s->encode_kernel, enc, ne) &&
           (s->encode_schedule == DQCU_SCHEDULE_PLANNED || s->encode_schedule == DQCU_SCHEDULE_PLAIN) &&
           (s->hot_kernel == DQCU_KERNEL_AUTO || s->hot_kernel == 1 || s->hot_kernel == 2);
}

extern "C" int dqcu_codec_create(const dq_codec *codec, dqcu_codec **out)
{
    return dqcu_codec_create_with(codec, NULL, out);
}

extern "C" int dqcu_codec_create_with(const dq_codec *codec, const dqcu_settings *settings, dqcu_codec **out)
{
    if (!codec || !out)
        return DQ_INVALID_ARGUMENT;
    *out = NULL;
    dqcu_settings st;
    dqcu_settings_default(&st);
    if (settings) {
        if (!settings_ok(settings))
            return DQ_INVALID_ARGUMENT;
        st = *settings;
    }
    const dq_profile *p = dq_codec_profile(codec);
    /* D-Quant (rANS tables) or the fixed-width family (the encoder, encode_fixed.cu, and the hot
     * layout: dqcu_transcode_hot, dqcu_attend_hot; decompress and container attention refuse it) */
    const bool fixed = p->codec_type == DQ_CODEC_FIXED;
    if (!fixed && p->codec_type != DQ_CODEC_DQUANT)
        return DQ_INVALID_ARGUMENT;
    /* format version 2 (joint pairs): decode, the hot transcode and its inverse (rans2_cuda.cuh) */
    const bool pairs = p->format_version == DQ_FORMAT_VERSION_PAIRS;
    if (p->format_version != DQ_FORMAT_VERSION && !pairs)
        return DQ_UNSUPPORTED;
    for (int k = 0; k < 2; k++)
        if ((!fixed && codec->kt[k].enc.freq[0] == 0) || p->levels[k] < 2 || (pairs && !codec->kt[k].pairs))
            return DQ_INVALID_ARGUMENT;

    dqcu_codec *dc = (dqcu_codec *)calloc(1, sizeof *dc);
    if (!dc)
        return DQ_NOMEM;
    dc->profile = *p;
    dc->settings = st;
    dc->n = codec->n;
    dc->d = codec->head_dim;
    dc->kv_heads = p->kv_heads;
    dc->W = p->window;
    dc->R = p->residual;
    for (int k = 0; k < 2; k++)
        dc->record_bytes[k] = dq_codec_record_bytes(codec, (dq_kind)k);
    dc->mean_bytes = dq_codec_mean_bytes(codec);
    dc->window_bytes = dq_codec_window_bytes(codec);

    int rc = DQ_OK;
    float *signs_host = NULL;
    float exp2_host[DQCU_EXP2_N];

    DQCU_CHECK_GOTO(cudaGetDevice(&dc->device), rc, fail);
    DQCU_CHECK_GOTO(cudaDeviceGetAttribute(&dc->sm_count, cudaDevAttrMultiProcessorCount, dc->device), rc, fail);
    {
        int optin = 0;
        DQCU_CHECK_GOTO(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dc->device), rc, fail);
        dc->smem_optin = (size_t)optin;
    }

    /* The drift's λ table, computed exactly as lib/src/drift.c does (same libm, same expression). */
    for (int i = 0; i < DQCU_EXP2_N; i++)
        exp2_host[i] = (float)exp2(i / 512.0);
    rc = dqcu__upload_exp2(exp2_host);
    if (rc)
        goto fail;

    signs_host = (float *)malloc(sizeof(float) * dc->n);
    if (!signs_host) {
        rc = DQ_NOMEM;
        goto fail;
    }
    for (uint32_t i = 0; i < dc->n; i++)
        signs_host[i] = codec->signs ? codec->signs[i] : 1.0f;
    DQCU_CHECK_GOTO(cudaMalloc((void **)&dc->signs, sizeof(float) * dc->n), rc, fail);
    DQCU_CHECK_GOTO(cudaMemcpy(dc->signs, signs_host, sizeof(float) * dc->n, cudaMemcpyHostToDevice), rc, fail);

    dc->fixed = fixed;
    dc->pairs = pairs;
    if (pairs) {
        rc = upload_tab2(codec, dc);
        if (rc)
            goto fail;
    }
    for (int k = 0; k < 2; k++) {
        if (fixed) {
            dqcu_kind_tab *t = &dc->host.kind[k];
            memset(t, 0, sizeof *t);
            t->M = p->levels[k];
            t->C = dq_fixed_packing(dc->n, p->levels[k], &dc->fx_k[k], &dc->fx_w[k]);
        } else {
            kind_tab(codec, k, &dc->host.kind[k]);
        }
    }
    dc->host.n = dc->n;
    dc->host.d = dc->d;
    dc->host.log2_d = codec->log2_head_dim;
    dc->host.kv_heads = dc->kv_heads;
    dc->host.W = dc->W;
    dc->host.R = dc->R;
    dc->host.rot_scale = codec->rot_scale;
    dc->host.signs = dc->signs;
    DQCU_CHECK_GOTO(cudaMalloc((void **)&dc->tab, sizeof(dqcu_tables)), rc, fail);
    DQCU_CHECK_GOTO(cudaMemcpy(dc->tab, &dc->host, sizeof(dqcu_tables), cudaMemcpyHostToDevice), rc, fail);
    free(signs_host);
    *out = dc;
    return DQ_OK;

fail:
    free(signs_host);
    if (dc->signs)
        cudaFree(dc->signs);
    if (dc->tab)
        cudaFree(dc->tab);
    if (dc->tab2)
        cudaFree(dc->tab2);
    free(dc);
    return rc;
}

extern "C" void dqcu_codec_free(dqcu_codec *dc)
{
    if (!dc)
        return;
    cudaDeviceSynchronize();
    cudaFree(dc->signs);
    cudaFree(dc->tab);
    cudaFree(dc->tab2);
    free(dc);
}

extern "C" const dq_profile *dqcu_codec_profile(const dqcu_codec *dc)
{
    return dc ? &dc->profile : NULL;
}
