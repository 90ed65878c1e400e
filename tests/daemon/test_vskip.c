/* ATTEND with dquantd's attention_value_mass (certified value skipping, dquant/vskip.h) through a
 * real dquantd ($DQUANTD) on the cpu backend, against libdquant in-process on the same tokens:
 *   - with --attention-value-mass 0.99 the reply equals dq_attend_vskip's result bit for bit,
 *     differs from the exact dq_attend result, and stays within the bound dq_attend_vskip
 *     returns for every head; the STATS counters attend_value_streams_decoded / _skipped add the
 *     item's sealed value streams, the skipped ones > 0;
 *   - a model of another codec (int2) is answered exactly with the key set;
 *   - without the key ATTEND is exact (bit-identical to dq_attend) and the counters stay 0.
 * With $DQ_VSKIP_BACKEND=cuda (dquantd-fakecuda) the model is on the emulated GPU, whose kernels
 * ignore the key: ATTEND equals dq_attend within float rounding and nothing is counted.
 * Skipped when $DQUANTD is unset. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_check.h"
#include "dqd_child.h"
#include "dquant/client.h"
#include "dquant/dquant.h"

#define QH 8
#define KVH 2
#define HD 64
#define ROW (KVH * HD)
#define T 900

static dqd_daemon D;

/* $DQ_VSKIP_BACKEND=cuda: dquantd-fakecuda's cuda backend (meson test daemon-vskip-fakecuda), where
 * the D-Quant model lives on the (emulated) GPU, whose kernels ignore the key. */
static bool on_cuda(void)
{
    const char *b = getenv("DQ_VSKIP_BACKEND");
    return b && strcmp(b, "cuda") == 0;
}

static void start(const char *mass)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    const char *args[12] = {"--workers", "2"};
    size_t n = 2;
    if (mass) {
        args[n++] = "--attention-value-mass";
        args[n++] = mass;
    }
    if (on_cuda()) {
        args[n++] = "--backend";
        args[n++] = "cuda";
        args[n++] = "--gpu-memory";
        args[n++] = "8M";
    }
    args[n] = NULL;
    const dqd_opts o = {.extra = args};
    cr_assert_eq(dqd_start(&D, &o), 0, "could not start the daemon");
}

static void stop(void)
{
    if (D.pid) {
        int st = dqd_stop(&D);
        cr_expect_eq(st, 0, "the daemon exited with %d", st);
    }
}

static dqc_client *cli(void)
{
    dqc_client *c = NULL;
    char err[256];
    cr_assert_eq(dqc_connect_ex(D.addr, NULL, &c, err, sizeof err), 0, "connect: %s", err);
    return c;
}

/* Deterministic pseudo-random in [-1, 1). */
static float u(uint32_t a, uint32_t b)
{
    uint32_t h = a * 2654435761u ^ (b * 40503u + 0x9e37u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)(h % 20001) / 10000.0f - 1.0f;
}

/* Keys around a few directions so that queries near one of them attend peakily, values spread. */
static void make_kv(float *k, float *v)
{
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t j = 0; j < ROW; j++) {
            const uint32_t dir = t % 7;
            k[t * ROW + j] = 0.6f * u(dir, j) + 0.5f * u(t + 1000, j);
            v[t * ROW + j] = u(t + 5000, j) + 0.3f * u(7, j);
        }
}

static void make_q(float *q)
{
    for (uint32_t h = 0; h < QH; h++)
        for (uint32_t j = 0; j < HD; j++)
            q[h * HD + j] = 6.0f * u(h % 7, (h / (QH / KVH)) * HD + j) + 0.2f * u(h + 77, j);
}

/* PUT of every token of "s" for model `model` of profile `profile`; the same tokens appended to a
 * reference layer of codec (*ref). */
static void put(dqc_client *c, const char *model, const char *profile, const dq_codec *codec, dq_workspace *ws,
                dq_layer **ref, const float *k, const float *v)
{
    dqc_model_spec spec = {
        .name = model, .layers = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = profile};
    OK(c, dqc_register_model(c, &spec, NULL));
    dqc_put_args a = {.seq = {NULL, model, strlen(model)},
                      .model = model,
                      .num_layers = 1,
                      .tokens = T,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_F32,
                      .k = k,
                      .v = v};
    OK(c, dqc_put(c, &a, NULL));
    cr_assert_eq(dq_layer_create(codec, ref), 0);
    cr_assert_eq(dq_layer_append(*ref, ws, k, v, DQ_DTYPE_F32, T, NULL), 0);
}

static void attend(dqc_client *c, const char *model, const float *q, float *out, float *lse)
{
    dqc_attend_item it = {.seq = {NULL, model, strlen(model)}, .layer = 0, .q = q};
    dqc_attend_args aa = {
        .items = &it, .nitems = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_attend(c, &aa, out, lse));
}

static dq_codec *codec_of(const char *profile)
{
    dq_profile p;
    cr_assert_eq(dq_profile_builtin(profile, KVH, HD, &p), 0);
    dq_codec *codec = NULL;
    cr_assert_eq(dq_codec_create(&p, NULL, &codec), 0);
    return codec;
}

/* A daemon (started with `mass`, NULL: without the key), model "m" of dq226 holding T tokens,
 * its reference layer, one ATTEND of the query and the exact dq_attend of the reference. */
typedef struct fixture {
    dqc_client *c;
    float *k, *v;
    float q[QH * HD], out[QH * HD], lse[QH], ex[QH * HD], exl[QH];
    dq_codec *codec;
    dq_workspace *ws;
    dq_layer *ref;
} fixture;

static void setup(fixture *f, const char *mass)
{
    memset(f, 0, sizeof *f);
    start(mass);
    f->c = cli();
    f->k = malloc(T * ROW * sizeof *f->k);
    f->v = malloc(T * ROW * sizeof *f->v);
    cr_assert(f->k && f->v);
    make_kv(f->k, f->v);
    make_q(f->q);
    f->codec = codec_of("dq226");
    cr_assert_eq(dq_workspace_create(f->codec, &f->ws), 0);
    put(f->c, "m", "dq226", f->codec, f->ws, &f->ref, f->k, f->v);
    attend(f->c, "m", f->q, f->out, f->lse);
    dq_attn_item ie = {f->ref, f->q, f->ex, f->exl};
    cr_assert_eq(dq_attend(f->codec, f->ws, QH, 1.0f / sqrtf(HD), &ie, 1), 0);
}

static void teardown(fixture *f)
{
    dq_layer_free(f->ref);
    dq_workspace_free(f->ws);
    dq_codec_free(f->codec);
    free(f->k);
    free(f->v);
    dqc_free(f->c);
}

Test(vskip, attend_within_bound, .fini = stop)
{
    fixture f;
    setup(&f, "0.99");
    if (on_cuda()) {
        /* on the GPU the key is ignored: the emulated kernel's result, no value stream counted */
        cr_assert_eq(stat_gauge(f.c, "gpu_sequences"), 1, "the D-Quant sequence is not on the GPU");
        for (uint32_t i = 0; i < QH * HD; i++)
            cr_assert(fabsf(f.out[i] - f.ex[i]) <= 1e-4f * (1.0f + fabsf(f.ex[i])), "GPU ATTEND is not exact at %u", i);
        cr_assert_eq(stat_counter(f.c, "attend_value_streams_decoded"), 0);
        cr_assert_eq(stat_counter(f.c, "attend_value_streams_skipped"), 0);
        teardown(&f);
        return;
    }
    const float scale = 1.0f / sqrtf(HD);
    float vs[QH * HD], vsl[QH];
    dq_attn_item iv = {f.ref, f.q, vs, vsl};
    double bound[QH];
    dq_vskip_out vo = {.bound = bound};
    cr_assert_eq(dq_attend_vskip(f.codec, f.ws, QH, scale, 0.99, &iv, &vo, 1), 0);
    cr_assert(memcmp(f.out, vs, sizeof vs) == 0 && memcmp(f.lse, vsl, sizeof vsl) == 0,
              "ATTEND differs from dq_attend_vskip at 0.99");
    cr_assert(memcmp(f.out, f.ex, sizeof f.out) != 0, "ATTEND with the key set is the exact result: nothing skipped");
    for (uint32_t h = 0; h < QH; h++) {
        double e = 0, n = 0;
        for (uint32_t j = 0; j < HD; j++) {
            const double d = (double)f.out[h * HD + j] - f.ex[h * HD + j];
            e += d * d;
            n += (double)f.ex[h * HD + j] * f.ex[h * HD + j];
        }
        cr_assert(sqrt(e) <= bound[h], "head %u: error %.4g above the bound %.4g", h, sqrt(e), bound[h]);
        cr_log_info("head %u: relative error %.3g, bound %.3g", h, sqrt(e / n), bound[h] / sqrt(n));
    }
    const uint64_t dec = stat_counter(f.c, "attend_value_streams_decoded"),
                   skip = stat_counter(f.c, "attend_value_streams_skipped");
    cr_assert_eq(dec, vo.values_decoded);
    cr_assert_eq(dec + skip, dq_layer_window_count(f.ref) * 128);
    cr_assert_gt(skip, 0);
    cr_log_info("value streams: %llu decoded, %llu skipped", (unsigned long long)dec, (unsigned long long)skip);

    /* another codec: exact with the key set, counted nowhere */
    dq_codec *base = codec_of("int2");
    dq_workspace *bws = NULL;
    cr_assert_eq(dq_workspace_create(base, &bws), 0);
    dq_layer *bref = NULL;
    float bout[QH * HD], blse[QH], bex[QH * HD], bexl[QH];
    put(f.c, "b", "int2", base, bws, &bref, f.k, f.v);
    attend(f.c, "b", f.q, bout, blse);
    dq_attn_item ib = {bref, f.q, bex, bexl};
    cr_assert_eq(dq_attend(base, bws, QH, scale, &ib, 1), 0);
    cr_assert(memcmp(bout, bex, sizeof bout) == 0 && memcmp(blse, bexl, sizeof blse) == 0, "int2 ATTEND is not exact");
    cr_assert_eq(stat_counter(f.c, "attend_value_streams_decoded"), dec);
    cr_assert_eq(stat_counter(f.c, "attend_value_streams_skipped"), skip);
    dq_layer_free(bref);
    dq_workspace_free(bws);
    dq_codec_free(base);
    teardown(&f);
}

Test(vskip, off_is_exact, .fini = stop)
{
    fixture f;
    setup(&f, NULL);
    if (!on_cuda())
        cr_assert(memcmp(f.out, f.ex, sizeof f.out) == 0 && memcmp(f.lse, f.exl, sizeof f.lse) == 0,
                  "ATTEND is not exact");
    cr_assert_eq(stat_counter(f.c, "attend_value_streams_decoded"), 0);
    cr_assert_eq(stat_counter(f.c, "attend_value_streams_skipped"), 0);
    teardown(&f);
}
