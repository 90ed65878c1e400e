/* One layer of one sequence (layer.h): sealing at W = R = 128, chunked appends equal one append,
 * windows equal dq_window_encode of the BF16 tail they came from, range decodes equal the token
 * decoder plus the BF16 tail, every dtype in and out, bounds, restore from raw parts, storage
 * accounting, and all-or-nothing appends under allocation failure. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dqtest_util.h"

static dqt_rng rng;
static dq_codec *codec;
static dq_workspace *ws;
static uint32_t n, W;
static size_t wb;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x1a7e4u);
    codec = dqt_codec_builtin("dq226", 2, 128);
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    n = dq_codec_stream_len(codec);
    W = dq_codec_profile(codec)->window;
    wb = dq_codec_window_bytes(codec);
}

static void suite_fini(void)
{
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

TestSuite(layer, .init = suite_init, .fini = suite_fini);

/* Keys with per-channel offsets (like real keys), values plain Gaussian. */
static void gen_kv(size_t T, float *k, float *v)
{
    static float off[65536];
    static int have;
    if (!have) {
        for (uint32_t j = 0; j < 65536; j++)
            off[j] = (float)(1.5 * dqt_normal(&rng));
        have = 1;
    }
    for (size_t t = 0; t < T; t++)
        for (uint32_t j = 0; j < n; j++) {
            k[t * n + j] = off[j] + (float)dqt_normal(&rng);
            v[t * n + j] = (float)(0.5 * dqt_normal(&rng));
        }
}

static float *falloc(size_t count)
{
    return dqt_xmalloc((count ? count : 1) * sizeof(float));
}

static void check_counts(const dq_layer *l, size_t t, const dq_codec *c)
{
    const uint32_t w = dq_codec_profile(c)->window;
    const uint32_t nn = dq_codec_stream_len(c);
    const size_t sealed = t / w * w;
    cr_assert_eq(dq_layer_tokens(l), t);
    cr_assert_eq(dq_layer_sealed_tokens(l), sealed, "%zu tokens: %zu sealed, expected %zu", t,
                 dq_layer_sealed_tokens(l), sealed);
    cr_assert_eq(dq_layer_tail_tokens(l), t - sealed, "%zu tokens: tail %zu, expected %zu", t, dq_layer_tail_tokens(l),
                 t - sealed);
    cr_assert_eq(dq_layer_window_count(l), sealed / w);
    const size_t stored = sealed / w * dq_codec_window_bytes(c) + (t - sealed) * nn * 2 * 2;
    cr_assert_eq(dq_layer_stored_bytes(l), stored, "%zu tokens: stored %zu bytes, expected %zu", t,
                 dq_layer_stored_bytes(l), stored);
    cr_assert_geq(dq_layer_allocated_bytes(l), stored);
}

static void check_same_layer(const dq_layer *a, const dq_layer *b, const char *what)
{
    cr_assert_eq(dq_layer_tokens(a), dq_layer_tokens(b), "%s: token counts differ", what);
    cr_assert_eq(dq_layer_window_count(a), dq_layer_window_count(b), "%s: window counts differ", what);
    for (size_t i = 0; i < dq_layer_window_count(a); i++)
        cr_assert(memcmp(dq_layer_window(a, i), dq_layer_window(b, i), wb) == 0, "%s: window %zu differs", what, i);
    const size_t tail = dq_layer_tail_tokens(a);
    cr_assert_eq(tail, dq_layer_tail_tokens(b));
    for (int k = 0; k < 2; k++)
        if (tail)
            cr_assert(memcmp(dq_layer_tail(a, (dq_kind)k), dq_layer_tail(b, (dq_kind)k), tail * n * 2) == 0,
                      "%s: %c tail differs", what, k ? 'V' : 'K');
}

Test(layer, layout)
{
    const dq_profile *p = dq_codec_profile(codec);
    cr_assert_eq(p->window, 128);
    cr_assert_eq(p->residual, 128);
    cr_assert_eq(dq_codec_mean_bytes(codec), 2 + (size_t)n);
    const size_t rk = 4 + (size_t)p->container_bytes[0], rv = 4 + (size_t)p->container_bytes[1];
    cr_assert_eq(dq_codec_record_bytes(codec, DQ_KIND_K), rk);
    cr_assert_eq(dq_codec_record_bytes(codec, DQ_KIND_V), rv);
    cr_assert_eq(wb, 2 + n + W * rk + W * rv);
    uint8_t *win = dqt_xmalloc(wb);
    cr_assert_eq((const uint8_t *)dq_window_mean(codec, win), win);
    for (size_t t = 0; t < W; t += 17) {
        cr_assert_eq(dq_window_record(codec, win, DQ_KIND_K, t), win + 2 + n + t * rk);
        cr_assert_eq(dq_window_record(codec, win, DQ_KIND_V, t), win + 2 + n + W * rk + t * rv);
    }
    free(win);
}

/* The window seals exactly when its 128th token arrives. */
Test(layer, seals_at_window)
{
    dq_layer *l = NULL;
    cr_assert_eq(dq_layer_create(codec, &l), DQ_OK);
    check_counts(l, 0, codec);
    float *k = falloc(300 * (size_t)n), *v = falloc(300 * (size_t)n);
    gen_kv(300, k, v);
    size_t t = 0;
    static const size_t steps[] = {127, 1, 127, 1, 1, 43};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        cr_assert_eq(dq_layer_append(l, ws, k + t * n, v + t * n, DQ_DTYPE_F32, steps[i], NULL), DQ_OK);
        t += steps[i];
        check_counts(l, t, codec);
    }
    free(k);
    free(v);
    dq_layer_free(l);
}

/* Appends in random chunks of 1..300 tokens give the same windows and tail as one append, and the
 * windows equal dq_window_encode of the BF16 tokens. */
Test(layer, chunked_equals_single)
{
    const size_t T = 1000;
    float *k = falloc(T * n), *v = falloc(T * n);
    gen_kv(T, k, v);
    dq_layer *one = NULL;
    cr_assert_eq(dq_layer_create(codec, &one), DQ_OK);
    dq_encode_stats st;
    memset(&st, 0, sizeof st);
    cr_assert_eq(dq_layer_append(one, ws, k, v, DQ_DTYPE_F32, T, &st), DQ_OK);
    check_counts(one, T, codec);
    cr_assert_eq(st.streams, 2 * (T / W * W), "stats count %llu streams, %zu sealed tokens",
                 (unsigned long long)st.streams, T / W * W);

    for (int rep = 0; rep < 4; rep++) {
        dq_layer *ch = NULL;
        cr_assert_eq(dq_layer_create(codec, &ch), DQ_OK);
        size_t t = 0;
        while (t < T) {
            size_t c = 1 + dqt_below(&rng, 300);
            if (rep == 3)
                c = 1; /* token by token */
            if (c > T - t)
                c = T - t;
            cr_assert_eq(dq_layer_append(ch, ws, k + t * n, v + t * n, DQ_DTYPE_F32, c, NULL), DQ_OK);
            t += c;
            check_counts(ch, t, codec);
        }
        check_same_layer(one, ch, "chunked vs single append");
        dq_layer_free(ch);
    }

    /* Windows are the BF16 tokens encoded; the tail is the BF16 tokens. */
    uint16_t *kb = dqt_xmalloc((size_t)W * n * 2), *vb = dqt_xmalloc((size_t)W * n * 2);
    uint8_t *win = dqt_xmalloc(wb);
    for (size_t i = 0; i < dq_layer_window_count(one); i++) {
        for (size_t j = 0; j < (size_t)W * n; j++) {
            kb[j] = dq_f32_to_bf16(k[i * W * n + j]);
            vb[j] = dq_f32_to_bf16(v[i * W * n + j]);
        }
        cr_assert_eq(dq_window_encode(codec, ws, kb, vb, DQ_DTYPE_BF16, win, NULL), DQ_OK);
        cr_assert(memcmp(win, dq_layer_window(one, i), wb) == 0,
                  "window %zu is not dq_window_encode of its BF16 tokens", i);
    }
    const size_t sealed = dq_layer_sealed_tokens(one), tail = T - sealed;
    const uint16_t *tk = dq_layer_tail(one, DQ_KIND_K), *tv = dq_layer_tail(one, DQ_KIND_V);
    for (size_t j = 0; j < tail * n; j++) {
        cr_assert_eq(tk[j], dq_f32_to_bf16(k[sealed * n + j]), "K tail element %zu", j);
        cr_assert_eq(tv[j], dq_f32_to_bf16(v[sealed * n + j]), "V tail element %zu", j);
    }
    free(kb);
    free(vb);
    free(win);
    free(k);
    free(v);
    dq_layer_free(one);
}

/* Expected decode of the whole layer: token decoder on each window, BF16 tail. */
static void expected_decode(const dq_layer *l, dq_kind kind, float *out)
{
    const size_t rb = dq_codec_record_bytes(codec, kind);
    for (size_t i = 0; i < dq_layer_window_count(l); i++) {
        const uint8_t *w = dq_layer_window(l, i);
        int rc = dq_tokens_decode(codec, ws, kind, kind == DQ_KIND_K ? dq_window_mean(codec, w) : NULL,
                                  dq_window_record(codec, w, kind, 0), rb, W, out + i * W * n, DQ_DTYPE_F32);
        cr_assert_eq(rc, DQ_OK, "window %zu: %s", i, dq_err_name(rc));
    }
    const size_t sealed = dq_layer_sealed_tokens(l), tail = dq_layer_tail_tokens(l);
    const uint16_t *tb = dq_layer_tail(l, kind);
    for (size_t j = 0; j < tail * n; j++)
        out[sealed * n + j] = dq_bf16_to_f32(tb[j]);
}

Test(layer, decode_ranges)
{
    const size_t T = 700;
    float *k = falloc(T * n), *v = falloc(T * n);
    gen_kv(T, k, v);
    dq_layer *l = NULL;
    cr_assert_eq(dq_layer_create(codec, &l), DQ_OK);
    cr_assert_eq(dq_layer_append(l, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
    float *exp[2] = {falloc(T * n), falloc(T * n)};
    expected_decode(l, DQ_KIND_K, exp[0]);
    expected_decode(l, DQ_KIND_V, exp[1]);
    /* Sanity of the reconstruction itself: close to the input. */
    cr_assert_lt(dqt_rel_l2_f(exp[0], k, T * n), 0.2, "keys reconstruct with error %.3f",
                 dqt_rel_l2_f(exp[0], k, T * n));
    cr_assert_lt(dqt_rel_l2_f(exp[1], v, T * n), 0.4, "values reconstruct with error %.3f",
                 dqt_rel_l2_f(exp[1], v, T * n));

    float *of = falloc(T * n);
    uint16_t *oh = dqt_xmalloc(T * n * 2);
    for (int r = 0; r < 300; r++) {
        size_t first, count;
        switch (r % 6) {
        case 0:
            first = 0;
            count = T;
            break;
        case 1:
            first = T - 1;
            count = 1;
            break;
        case 2:
            first = dqt_below(&rng, (uint32_t)T);
            count = 1;
            break;
        case 3:
            first = 127;
            count = 2;
            break;
        case 4:
            first = 600;
            count = T - 600;
            break;
        default:
            first = dqt_below(&rng, (uint32_t)T);
            count = 1 + dqt_below(&rng, (uint32_t)(T - first));
            break;
        }
        const dq_kind kind = (dq_kind)(r & 1);
        const float *e = exp[kind] + first * n;
        const size_t cnt = count * n;
        /* Exact-size outputs so an overrun shows. */
        float *o32 = falloc(cnt);
        cr_assert_eq(dq_layer_decode(l, ws, kind, first, count, o32, DQ_DTYPE_F32), DQ_OK);
        for (size_t j = 0; j < cnt; j++)
            if (memcmp(&o32[j], &e[j], sizeof(float)) != 0)
                cr_assert_fail("range [%zu, +%zu) kind %d: element %zu is %.9g, token decoder %.9g", first, count, kind,
                               j, (double)o32[j], (double)e[j]);
        free(o32);
        uint16_t *o16 = dqt_xmalloc(cnt * 2);
        cr_assert_eq(dq_layer_decode(l, ws, kind, first, count, o16, DQ_DTYPE_F16), DQ_OK);
        for (size_t j = 0; j < cnt; j++)
            cr_assert_eq(o16[j], dq_f32_to_f16(e[j]), "f16 output element %zu", j);
        cr_assert_eq(dq_layer_decode(l, ws, kind, first, count, o16, DQ_DTYPE_BF16), DQ_OK);
        for (size_t j = 0; j < cnt; j++)
            cr_assert_eq(o16[j], dq_f32_to_bf16(e[j]), "bf16 output element %zu", j);
        free(o16);
    }
    free(of);
    free(oh);
    free(exp[0]);
    free(exp[1]);
    free(k);
    free(v);
    dq_layer_free(l);
}

/* Input dtype does not matter for values every dtype holds exactly. */
Test(layer, input_dtypes)
{
    const size_t T = 300;
    float *k = falloc(T * n), *v = falloc(T * n);
    gen_kv(T, k, v);
    uint16_t *kh = dqt_xmalloc(T * n * 2), *vh = dqt_xmalloc(T * n * 2);
    uint16_t *kbf = dqt_xmalloc(T * n * 2), *vbf = dqt_xmalloc(T * n * 2);
    for (size_t j = 0; j < T * n; j++) {
        /* Values exact in bf16 and in f16: round to bf16 (8 significant bits) within f16 range. */
        k[j] = dq_bf16_to_f32(dq_f32_to_bf16(k[j]));
        v[j] = dq_bf16_to_f32(dq_f32_to_bf16(v[j]));
        kh[j] = dq_f32_to_f16(k[j]);
        vh[j] = dq_f32_to_f16(v[j]);
        kbf[j] = dq_f32_to_bf16(k[j]);
        vbf[j] = dq_f32_to_bf16(v[j]);
        if (dq_f16_to_f32(kh[j]) != k[j] || dq_f16_to_f32(vh[j]) != v[j]) { /* the rare f16 subnormal */
            kh[j] = vh[j] = kbf[j] = vbf[j] = 0;
            k[j] = v[j] = 0.0f;
        }
    }
    dq_layer *a = NULL, *b = NULL, *c = NULL;
    cr_assert_eq(dq_layer_create(codec, &a), DQ_OK);
    cr_assert_eq(dq_layer_create(codec, &b), DQ_OK);
    cr_assert_eq(dq_layer_create(codec, &c), DQ_OK);
    cr_assert_eq(dq_layer_append(a, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
    cr_assert_eq(dq_layer_append(b, ws, kh, vh, DQ_DTYPE_F16, T, NULL), DQ_OK);
    cr_assert_eq(dq_layer_append(c, ws, kbf, vbf, DQ_DTYPE_BF16, T, NULL), DQ_OK);
    check_same_layer(a, b, "f32 vs f16 input");
    check_same_layer(a, c, "f32 vs bf16 input");
    cr_assert_lt(dq_layer_append(a, ws, k, v, (dq_dtype)7, 1, NULL), 0, "unknown dtype accepted");
    check_counts(a, T, codec);
    free(k);
    free(v);
    free(kh);
    free(vh);
    free(kbf);
    free(vbf);
    dq_layer_free(a);
    dq_layer_free(b);
    dq_layer_free(c);
}

Test(layer, out_of_bounds)
{
    dq_layer *l = NULL;
    cr_assert_eq(dq_layer_create(codec, &l), DQ_OK);
    float *o = falloc(300 * (size_t)n);
    cr_assert_eq(dq_layer_decode(l, ws, DQ_KIND_K, 0, 1, o, DQ_DTYPE_F32), DQ_OUT_OF_BOUNDS, "empty layer");
    float *k = falloc(200 * (size_t)n), *v = falloc(200 * (size_t)n);
    gen_kv(200, k, v);
    cr_assert_eq(dq_layer_append(l, ws, k, v, DQ_DTYPE_F32, 200, NULL), DQ_OK);
    static const size_t bad[][2] = {{0, 201}, {200, 1}, {199, 2}, {128, 73}, {1000, 1}, {SIZE_MAX, 2}, {2, SIZE_MAX}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        for (int kind = 0; kind < 2; kind++) {
            int rc = dq_layer_decode(l, ws, (dq_kind)kind, bad[i][0], bad[i][1], o, DQ_DTYPE_F32);
            cr_assert_eq(rc, DQ_OUT_OF_BOUNDS, "range [%zu, +%zu) gave %s", bad[i][0], bad[i][1], dq_err_name(rc));
        }
    cr_assert_eq(dq_layer_decode(l, ws, DQ_KIND_V, 0, 200, o, DQ_DTYPE_F32), DQ_OK);
    cr_assert_eq(dq_layer_decode(l, ws, DQ_KIND_V, 199, 1, o, DQ_DTYPE_F32), DQ_OK);
    free(o);
    free(k);
    free(v);
    dq_layer_free(l);
}

Test(layer, restore)
{
    const size_t T = 555, more = 150;
    float *k = falloc((T + more) * n), *v = falloc((T + more) * n);
    gen_kv(T + more, k, v);
    dq_layer *a = NULL;
    cr_assert_eq(dq_layer_create(codec, &a), DQ_OK);
    cr_assert_eq(dq_layer_append(a, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
    const size_t nwin = dq_layer_window_count(a), tail = dq_layer_tail_tokens(a);
    uint8_t *raw = dqt_xmalloc(nwin * wb);
    for (size_t i = 0; i < nwin; i++)
        memcpy(raw + i * wb, dq_layer_window(a, i), wb);
    uint16_t *tk = dqt_xmalloc(tail * n * 2), *tv = dqt_xmalloc(tail * n * 2);
    memcpy(tk, dq_layer_tail(a, DQ_KIND_K), tail * n * 2);
    memcpy(tv, dq_layer_tail(a, DQ_KIND_V), tail * n * 2);

    dq_layer *r = NULL, *u = NULL;
    cr_assert_eq(dq_layer_restore(codec, raw, nwin, tk, tv, tail, &r), DQ_OK);
    cr_assert_eq(dq_layer_restore_unchecked(codec, raw, nwin, tk, tv, tail, &u), DQ_OK);
    check_same_layer(a, u, "layer restored unchecked");
    dq_layer_free(u);
    /* A copy is made: scribbling over the parts changes nothing. */
    memset(raw, 0, nwin * wb);
    memset(tk, 0, tail * n * 2);
    check_counts(r, T, codec);
    check_same_layer(a, r, "restored layer");
    float *da = falloc(T * n), *dr = falloc(T * n);
    for (int kind = 0; kind < 2; kind++) {
        cr_assert_eq(dq_layer_decode(a, ws, (dq_kind)kind, 0, T, da, DQ_DTYPE_F32), DQ_OK);
        cr_assert_eq(dq_layer_decode(r, ws, (dq_kind)kind, 0, T, dr, DQ_DTYPE_F32), DQ_OK);
        cr_assert(memcmp(da, dr, T * n * sizeof *da) == 0, "restored layer decodes differently");
    }
    /* Both continue identically. */
    cr_assert_eq(dq_layer_append(a, ws, k + T * n, v + T * n, DQ_DTYPE_F32, more, NULL), DQ_OK);
    cr_assert_eq(dq_layer_append(r, ws, k + T * n, v + T * n, DQ_DTYPE_F32, more, NULL), DQ_OK);
    check_same_layer(a, r, "restored layer after more appends");

    /* Damaged parts are refused. */
    for (size_t i = 0; i < nwin; i++)
        memcpy(raw + i * wb, dq_layer_window(a, i), wb);
    const size_t rk = dq_codec_record_bytes(codec, DQ_KIND_K);
    uint8_t *bad = raw + wb + 2 + n + 7 * rk + 4; /* window 1, key record 7: zero its state */
    memset(bad, 0, 4);
    dq_layer *x = NULL;
    cr_assert_eq(dq_layer_restore(codec, raw, nwin, tk, tv, tail, &x), DQ_CORRUPT);
    cr_assert(x == NULL, "a failed restore handed out a layer");
    /* Unchecked, the damaged record is taken; its decode reports it and stays in bounds. */
    cr_assert_eq(dq_layer_restore_unchecked(codec, raw, nwin, tk, tv, tail, &x), DQ_OK);
    cr_assert_eq(dq_layer_decode(x, ws, DQ_KIND_K, 0, T, dr, DQ_DTYPE_F32), DQ_CORRUPT);
    cr_assert_eq(dq_layer_decode(x, ws, DQ_KIND_V, 0, T, dr, DQ_DTYPE_F32), DQ_OK, "the values are intact");
    dq_layer_free(x);
    x = NULL;
    uint16_t *full = dqt_xmalloc((size_t)W * n * 2);
    memset(full, 0, (size_t)W * n * 2);
    cr_assert_lt(dq_layer_restore(codec, NULL, 0, full, full, W, &x), 0, "a tail of R tokens accepted");
    cr_assert_eq(dq_layer_restore_unchecked(codec, NULL, 0, full, full, W, &x), DQ_SHAPE);
    full[3] = 0x7fc0; /* a NaN in the tail */
    cr_assert_eq(dq_layer_restore_unchecked(codec, NULL, 0, full, full, 5, &x), DQ_CORRUPT, "the tail is checked");
    free(full);

    dq_layer *e = NULL;
    cr_assert_eq(dq_layer_restore(codec, NULL, 0, NULL, NULL, 0, &e), DQ_OK, "empty restore");
    check_counts(e, 0, codec);
    dq_layer_free(e);

    free(da);
    free(dr);
    free(raw);
    free(tk);
    free(tv);
    free(k);
    free(v);
    dq_layer_free(a);
    dq_layer_free(r);
}

/* ---- allocation failure ---- */

typedef struct counting_alloc {
    long allocs, live, fail_at;
    int bad_free;
} counting_alloc;

static void *ca_alloc(void *opaque, size_t size)
{
    counting_alloc *c = opaque;
    c->allocs++;
    if (c->fail_at && c->allocs == c->fail_at)
        return NULL;
    void *p = aligned_alloc(64, (size + 63) / 64 * 64 + (size == 0) * 64);
    if (p)
        c->live++;
    return p;
}

static void ca_free(void *opaque, void *ptr)
{
    counting_alloc *c = opaque;
    if (!ptr)
        return;
    if ((uintptr_t)ptr % 64)
        c->bad_free = 1;
    c->live--;
    free(ptr);
}

Test(layer, allocation_failure)
{
    counting_alloc ca = {0, 0, 0, 0};
    dq_allocator al = {ca_alloc, ca_free, &ca};
    dq_profile p;
    cr_assert_eq(dq_profile_builtin("dq226", 2, 128, &p), DQ_OK);

    /* Creation paths fail cleanly at every allocation. */
    for (long f = 1; f < 50; f++) {
        ca.fail_at = ca.allocs + f;
        dq_codec *c = NULL;
        dq_workspace *w = NULL;
        dq_layer *l = NULL;
        int rc = dq_codec_create(&p, &al, &c);
        if (rc == DQ_OK)
            rc = dq_workspace_create(c, &w);
        if (rc == DQ_OK)
            rc = dq_layer_create(c, &l);
        cr_assert(rc == DQ_OK || rc == DQ_NOMEM, "allocation %ld failing gave %s", f, dq_err_name(rc));
        dq_layer_free(l);
        dq_workspace_free(w);
        dq_codec_free(c);
        cr_assert_eq(ca.live, 0, "failing allocation %ld: %ld blocks leaked", f, ca.live);
        if (rc == DQ_OK && ca.allocs < ca.fail_at)
            break;
    }

    ca.fail_at = 0;
    dq_codec *c = NULL;
    cr_assert_eq(dq_codec_create(&p, &al, &c), DQ_OK);
    dq_workspace *w = NULL;
    cr_assert_eq(dq_workspace_create(c, &w), DQ_OK);
    dq_layer *l = NULL;
    cr_assert_eq(dq_layer_create(c, &l), DQ_OK);
    const uint32_t nn = dq_codec_stream_len(c);
    const size_t first = 100, chunk = 300, T = first + 2 * chunk;
    float *k = falloc(T * nn), *v = falloc(T * nn);
    gen_kv(T, k, v);
    cr_assert_eq(dq_layer_append(l, w, k, v, DQ_DTYPE_F32, first, NULL), DQ_OK);

    float *before[2] = {falloc(T * nn), falloc(T * nn)}, *after = falloc(T * nn);
    int nomem = 0;
    for (int round = 0; round < 2; round++) {
        const size_t t0 = dq_layer_tokens(l);
        for (int kind = 0; kind < 2; kind++)
            cr_assert_eq(dq_layer_decode(l, w, (dq_kind)kind, 0, t0, before[kind], DQ_DTYPE_F32), DQ_OK);
        const size_t stored = dq_layer_stored_bytes(l), nwin = dq_layer_window_count(l);
        long f;
        for (f = 1; f < 200; f++) {
            ca.fail_at = ca.allocs + f;
            int rc = dq_layer_append(l, w, k + t0 * nn, v + t0 * nn, DQ_DTYPE_F32, chunk, NULL);
            if (rc == DQ_OK)
                break;
            nomem++;
            cr_assert_eq(rc, DQ_NOMEM, "allocation %ld failing: append returned %s", f, dq_err_name(rc));
            cr_assert_eq(dq_layer_tokens(l), t0, "failed append changed the token count");
            cr_assert_eq(dq_layer_stored_bytes(l), stored);
            cr_assert_eq(dq_layer_window_count(l), nwin);
            for (int kind = 0; kind < 2; kind++) {
                cr_assert_eq(dq_layer_decode(l, w, (dq_kind)kind, 0, t0, after, DQ_DTYPE_F32), DQ_OK);
                cr_assert(memcmp(after, before[kind], t0 * nn * sizeof *after) == 0,
                          "failed append changed the data (allocation %ld)", f);
            }
        }
        cr_assert_lt(f, 200, "append never succeeded");
        check_counts(l, t0 + chunk, c);
    }
    cr_assert_gt(nomem, 0, "sealing windows made no allocation that could fail");

    /* The layer built under failures equals one built without. */
    ca.fail_at = 0;
    dq_layer *ref = NULL;
    cr_assert_eq(dq_layer_create(c, &ref), DQ_OK);
    cr_assert_eq(dq_layer_append(ref, w, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
    check_same_layer(ref, l, "layer built through allocation failures");
    dq_layer_free(ref);

    dq_layer_free(l);
    dq_workspace_free(w);
    dq_codec_free(c);
    cr_assert_eq(ca.live, 0, "%ld blocks leaked", ca.live);
    cr_assert_eq(ca.bad_free, 0, "a pointer not from the allocator was freed");
    free(k);
    free(v);
    free(before[0]);
    free(before[1]);
    free(after);
}

/* dq_window_check on good and damaged records, and dq_layer_append_windows: a layer built from
 * another's records equals it, refuses a tail (ORDER) and a damaged record (CORRUPT, its index),
 * and is unchanged by a refused append. */
Test(layer, append_windows)
{
    const size_t T = 3 * 128 + 5;
    float *k = falloc(T * n), *v = falloc(T * n);
    gen_kv(T, k, v);
    dq_layer *a = NULL, *b = NULL;
    cr_assert_eq(dq_layer_create(codec, &a), DQ_OK);
    cr_assert_eq(dq_layer_create(codec, &b), DQ_OK);
    cr_assert_eq(dq_layer_append(a, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
    const size_t nwin = dq_layer_window_count(a);
    cr_assert_eq(nwin, 3);
    uint8_t *raw = dqt_xmalloc(nwin * wb);
    for (size_t i = 0; i < nwin; i++) {
        memcpy(raw + i * wb, dq_layer_window(a, i), wb);
        cr_assert_eq(dq_window_check(codec, raw + i * wb), DQ_OK, "window %zu", i);
    }
    /* One window, then two: the same as the encoded layer's windows. */
    cr_assert_eq(dq_layer_append_windows(b, raw, 1, NULL), DQ_OK);
    cr_assert_eq(dq_layer_append_windows(b, raw + wb, 2, NULL), DQ_OK);
    cr_assert_eq(dq_layer_tokens(b), 3 * (size_t)W);
    for (size_t i = 0; i < nwin; i++)
        cr_assert(memcmp(dq_layer_window(a, i), dq_layer_window(b, i), wb) == 0, "window %zu differs", i);

    /* Damage: a trailing (zero) byte of the last value container, the rANS state of a key
     * container, an infinite key-mean scale. Each is CORRUPT, names its window, changes nothing. */
    const size_t rk = dq_codec_record_bytes(codec, DQ_KIND_K), rv = dq_codec_record_bytes(codec, DQ_KIND_V);
    uint8_t *w1 = raw + wb;
    uint8_t *last_v = w1 + 2 + n + (size_t)W * rk + ((size_t)W - 1) * rv;
    cr_assert_eq(last_v[rv - 1], 0, "the container's last byte is padding");
    last_v[rv - 1] = 0x5a;
    cr_assert_eq(dq_window_check(codec, w1), DQ_CORRUPT);
    size_t badw = 99;
    cr_assert_eq(dq_layer_append_windows(b, raw, 2, &badw), DQ_CORRUPT);
    cr_assert_eq(badw, 1);
    cr_assert_eq(dq_layer_window_count(b), 3, "a refused append changed the layer");
    last_v[rv - 1] = 0;
    cr_assert_eq(dq_window_check(codec, w1), DQ_OK);
    w1[2 + n + 5 * rk + 4] ^= 0x80; /* key record 5: its state's low byte */
    cr_assert_eq(dq_window_check(codec, w1), DQ_CORRUPT);
    w1[2 + n + 5 * rk + 4] ^= 0x80;
    w1[0] = 0x00;
    w1[1] = 0x7c; /* fp16 +inf */
    cr_assert_eq(dq_window_check(codec, w1), DQ_CORRUPT);

    /* A layer with a tail takes no windows. */
    cr_assert_eq(dq_layer_append_windows(a, raw, 1, NULL), DQ_ORDER);
    cr_assert_eq(dq_layer_window_count(a), nwin);
    free(raw);
    free(k);
    free(v);
    dq_layer_free(a);
    dq_layer_free(b);
}
