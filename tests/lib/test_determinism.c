/* Encoding is a pure function of the input and the profile: the same bytes run to run (also in a
 * fresh process), workspace to workspace, thread to thread, whatever the alignment of the buffers
 * and whatever the workspace held before. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dqtest_util.h"

static void suite_init(void)
{
}

static void suite_fini(void)
{
}

TestSuite(determinism, .init = suite_init, .fini = suite_fini);

struct det_param {
    char name[16];
    uint32_t kv_heads, head_dim;
};

ParameterizedTestParameters(determinism, window_encode)
{
    static struct det_param p[] = {{"dq226", 8, 128}, {"dq196", 8, 128},  {"dq226", 2, 128},
                                   {"dq196", 1, 16},  {"dq226p", 8, 128}, {"dq196p", 1, 16}};
    return cr_make_param_array(struct det_param, p, sizeof p / sizeof p[0]);
}

typedef struct job {
    const dq_codec *codec;
    const float *k, *v;
    uint8_t *window;
    int rounds;
    int rc;
} job;

/* Fixed pseudo-random K/V: Gaussian with per-channel offsets and a few outliers, like real keys. */
static void fixed_input(uint64_t seed, uint32_t W, uint32_t n, float *k, float *v)
{
    dqt_rng r;
    dqt_rng_seed(&r, seed);
    for (uint32_t j = 0; j < n; j++) {
        double off = 2.0 * dqt_normal(&r);
        for (uint32_t t = 0; t < W; t++) {
            k[(size_t)t * n + j] = (float)(off + dqt_normal(&r));
            v[(size_t)t * n + j] = (float)(0.3 * dqt_normal(&r));
        }
    }
    for (int i = 0; i < 20; i++)
        k[dqt_below(&r, W * n)] = (float)(40.0 * dqt_normal(&r));
}

static void *encode_job(void *arg)
{
    job *jb = arg;
    dq_workspace *ws = NULL;
    jb->rc = dq_workspace_create(jb->codec, &ws);
    for (int i = 0; i < jb->rounds && jb->rc == DQ_OK; i++)
        jb->rc = dq_window_encode(jb->codec, ws, jb->k, jb->v, DQ_DTYPE_F32, jb->window, NULL);
    dq_workspace_free(ws);
    return NULL;
}

ParameterizedTest(struct det_param *dp, determinism, window_encode)
{
    dq_codec *codec = dqt_codec_builtin(dp->name, dp->kv_heads, dp->head_dim);
    const uint32_t n = dq_codec_stream_len(codec), W = dq_codec_profile(codec)->window;
    const size_t wb = dq_codec_window_bytes(codec), vals = (size_t)W * n;
    float *k = dqt_xmalloc(vals * sizeof *k), *v = dqt_xmalloc(vals * sizeof *v);
    fixed_input(0xd37e4u, W, n, k, v);

    dq_workspace *ws1 = NULL, *ws2 = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws1), DQ_OK);
    cr_assert_eq(dq_workspace_create(codec, &ws2), DQ_OK);
    uint8_t *a = dqt_xmalloc(wb), *b = dqt_xmalloc(wb);

    memset(a, 0x11, wb);
    memset(b, 0x22, wb);
    dq_encode_stats sa, sb;
    memset(&sa, 0, sizeof sa);
    memset(&sb, 0, sizeof sb);
    cr_assert_eq(dq_window_encode(codec, ws1, k, v, DQ_DTYPE_F32, a, &sa), DQ_OK);
    cr_assert_eq(dq_window_encode(codec, ws1, k, v, DQ_DTYPE_F32, b, &sb), DQ_OK);
    cr_assert(memcmp(a, b, wb) == 0, "%s: same workspace, different bytes", dp->name);
    cr_assert(memcmp(&sa, &sb, sizeof sa) == 0, "%s: same input, different statistics", dp->name);
    const uint64_t h = dqt_fnv1a64(a, wb, DQT_FNV_INIT);
    fprintf(stderr, "%s %u×%u: window of %zu bytes, fnv1a64 %016llx\n", dp->name, dp->kv_heads, dp->head_dim, wb,
            (unsigned long long)h);

    /* A second workspace, and the first one dirtied by another input. */
    memset(b, 0x33, wb);
    cr_assert_eq(dq_window_encode(codec, ws2, k, v, DQ_DTYPE_F32, b, NULL), DQ_OK);
    cr_assert(memcmp(a, b, wb) == 0, "%s: second workspace, different bytes", dp->name);
    float *k2 = dqt_xmalloc(vals * sizeof *k2), *v2 = dqt_xmalloc(vals * sizeof *v2);
    fixed_input(0x0dd, W, n, k2, v2);
    cr_assert_eq(dq_window_encode(codec, ws1, k2, v2, DQ_DTYPE_F32, b, NULL), DQ_OK);
    cr_assert(memcmp(a, b, wb) != 0, "%s: different input, same bytes", dp->name);
    cr_assert_eq(dq_window_encode(codec, ws1, k, v, DQ_DTYPE_F32, b, NULL), DQ_OK);
    cr_assert(memcmp(a, b, wb) == 0, "%s: workspace state leaks into the output", dp->name);

    /* Unaligned input (float-aligned only) and an output at an odd address. */
    float *kbuf = dqt_xmalloc((vals + 1) * sizeof *kbuf), *vbuf = dqt_xmalloc((vals + 3) * sizeof *vbuf);
    memcpy(kbuf + 1, k, vals * sizeof *k);
    memcpy(vbuf + 3, v, vals * sizeof *v);
    uint8_t *obuf = dqt_xmalloc(wb + 1);
    cr_assert_eq(dq_window_encode(codec, ws2, kbuf + 1, vbuf + 3, DQ_DTYPE_F32, obuf + 1, NULL), DQ_OK);
    cr_assert(memcmp(a, obuf + 1, wb) == 0, "%s: alignment changes the bytes", dp->name);

    /* A second codec from the same profile. */
    dq_codec *codec2 = dqt_codec_builtin(dp->name, dp->kv_heads, dp->head_dim);
    dq_workspace *ws3 = NULL;
    cr_assert_eq(dq_workspace_create(codec2, &ws3), DQ_OK);
    cr_assert_eq(dq_window_encode(codec2, ws3, k, v, DQ_DTYPE_F32, b, NULL), DQ_OK);
    cr_assert(memcmp(a, b, wb) == 0, "%s: second codec, different bytes", dp->name);
    dq_workspace_free(ws3);
    dq_codec_free(codec2);

    /* Two threads at once, each with its own workspace, sharing the codec. */
    uint8_t *t1 = dqt_xmalloc(wb), *t2 = dqt_xmalloc(wb);
    job j1 = {codec, k, v, t1, 3, -1}, j2 = {codec, k, v, t2, 3, -1};
    pthread_t th1, th2;
    cr_assert_eq(pthread_create(&th1, NULL, encode_job, &j1), 0);
    cr_assert_eq(pthread_create(&th2, NULL, encode_job, &j2), 0);
    pthread_join(th1, NULL);
    pthread_join(th2, NULL);
    cr_assert_eq(j1.rc, DQ_OK);
    cr_assert_eq(j2.rc, DQ_OK);
    cr_assert(memcmp(a, t1, wb) == 0, "%s: thread 1 produced different bytes", dp->name);
    cr_assert(memcmp(a, t2, wb) == 0, "%s: thread 2 produced different bytes", dp->name);

    /* A fresh process (new address space, fresh dsp table and codec) gives the same checksum. */
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(pfd[0]);
        dq_codec *cc = NULL;
        dq_profile p;
        dq_workspace *cw = NULL;
        uint64_t ch = 0;
        uint8_t *cwin = malloc(wb);
        if (cwin && dq_profile_builtin(dp->name, dp->kv_heads, dp->head_dim, &p) == DQ_OK &&
            dq_codec_create(&p, NULL, &cc) == DQ_OK && dq_workspace_create(cc, &cw) == DQ_OK &&
            dq_window_encode(cc, cw, k, v, DQ_DTYPE_F32, cwin, NULL) == DQ_OK)
            ch = dqt_fnv1a64(cwin, wb, DQT_FNV_INIT);
        ssize_t wr = write(pfd[1], &ch, sizeof ch);
        dq_workspace_free(cw);
        dq_codec_free(cc);
        free(cwin);
        _exit(wr == (ssize_t)sizeof ch ? 0 : 1);
    }
    close(pfd[1]);
    uint64_t child_h = 0;
    cr_assert_eq(read(pfd[0], &child_h, sizeof child_h), (ssize_t)sizeof child_h);
    close(pfd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    cr_assert_eq(child_h, h, "%s: another process produced checksum %016llx, this one %016llx", dp->name,
                 (unsigned long long)child_h, (unsigned long long)h);

    free(t1);
    free(t2);
    free(kbuf);
    free(vbuf);
    free(obuf);
    free(k2);
    free(v2);
    free(a);
    free(b);
    free(k);
    free(v);
    dq_workspace_free(ws1);
    dq_workspace_free(ws2);
    dq_codec_free(codec);
}

/* Values are coded token by token: a window of V records equals the tokens encoded one at a time,
 * and a window record's parts equal dq_tokens_encode of the same tokens. */
Test(determinism, token_granularity)
{
    dq_codec *codec = dqt_codec_builtin("dq226", 2, 128);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec), W = dq_codec_profile(codec)->window;
    const size_t rk = dq_codec_record_bytes(codec, DQ_KIND_K), rv = dq_codec_record_bytes(codec, DQ_KIND_V);
    const size_t wb = dq_codec_window_bytes(codec), mb = dq_codec_mean_bytes(codec);
    float *k = dqt_xmalloc((size_t)W * n * sizeof *k), *v = dqt_xmalloc((size_t)W * n * sizeof *v);
    fixed_input(42, W, n, k, v);
    uint8_t *win = dqt_xmalloc(wb);
    cr_assert_eq(dq_window_encode(codec, ws, k, v, DQ_DTYPE_F32, win, NULL), DQ_OK);

    uint8_t *one = dqt_xmalloc(rv);
    for (uint32_t t = 0; t < W; t++) {
        cr_assert_eq(dq_tokens_encode(codec, ws, DQ_KIND_V, v + (size_t)t * n, DQ_DTYPE_F32, 1, NULL, one, rv, NULL),
                     DQ_OK);
        cr_assert(memcmp(one, dq_window_record(codec, win, DQ_KIND_V, t), rv) == 0,
                  "value record %u depends on its neighbours", t);
    }
    uint8_t *mean = dqt_xmalloc(mb), *krecs = dqt_xmalloc((size_t)W * rk);
    cr_assert_eq(dq_tokens_encode(codec, ws, DQ_KIND_K, k, DQ_DTYPE_F32, W, mean, krecs, rk, NULL), DQ_OK);
    cr_assert(memcmp(mean, dq_window_mean(codec, win), mb) == 0, "window mean differs from dq_tokens_encode");
    cr_assert(memcmp(krecs, dq_window_record(codec, win, DQ_KIND_K, 0), (size_t)W * rk) == 0,
              "window key records differ from dq_tokens_encode");
    free(one);
    free(mean);
    free(krecs);
    free(win);
    free(k);
    free(v);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}
