/* `dquant codec`: the D-Quant codec from the command line, for users and for checks.
 *
 *   dquant codec roundtrip  encode a [tokens, heads, head_dim] file as one layer's K or V, decode,
 *                           write the reconstruction, print one JSON line of figures
 *   dquant codec info       print a profile, frequency tables included
 *   dquant codec demo       run the round trip over the real KV in ../shared/data (or generated
 *                           Gaussian KV when absent) with every built-in profile; print a table */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "eval_rng.h"
#include "codec_run.h"
#include "commands.h"
#include "dquant/dquant.h"

#define PROG "codec"

static double nmse_of(const float *x, const float *xhat, size_t count)
{
    double se = 0, sx = 0;
    for (size_t i = 0; i < count; i++) {
        double d = (double)x[i] - (double)xhat[i];
        se += d * d;
        sx += (double)x[i] * (double)x[i];
    }
    return sx > 0 ? se / sx : (se > 0 ? INFINITY : 0.0);
}

static int write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -errno;
    size_t put = fwrite(buf, 1, len, f);
    int rc = fclose(f);
    return put == len && rc == 0 ? 0 : -EIO;
}

static void print_profile_json(const dq_profile *p)
{
    printf("{\"name\":\"%s\",\"format_version\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"stream_values\":%u,"
           "\"alpha\":%.4g,\"window\":%u,\"residual\":%u,\"rotation_seed\":%" PRIu64 ",",
           p->name, p->format_version, p->kv_heads, p->head_dim, p->kv_heads * p->head_dim, (double)p->alpha, p->window,
           p->residual, p->rotation_seed);
    static const char *kinds[2] = {"k", "v"};
    for (int k = 0; k < 2; k++) {
        printf("\"%s\":{\"container_bytes\":%u,\"levels\":%u,\"bits_per_value\":%.4f,\"freq\":[", kinds[k],
               p->container_bytes[k], p->levels[k], dq_profile_bits_per_value(p, (dq_kind)k));
        for (uint32_t m = 0; m < p->levels[k]; m++)
            printf("%s%u", m ? "," : "", p->freq[k][m]);
        printf("]},");
    }
    printf("\"bits_per_value_mean\":%.4f}\n", dq_profile_bits_per_value_mean(p));
}

static const char g_codec_help[] =
    "NAME\n"
    "   dquant codec - the D-Quant KV-cache codec from the command line\n"
    "\n"
    "SYNOPSIS\n"
    "   dquant codec roundtrip --kind k|v --heads H --head-dim D --dtype f32|f16|bf16 --in FILE --out FILE\n"
    "                          [--profile NAME | --container-bytes C --levels M [--alpha A]] [--window W]\n"
    "   dquant codec info --profile NAME [--heads H --head-dim D]\n"
    "   dquant codec demo [--data DIR]\n"
    "\n"
    "DESCRIPTION\n"
    "   roundtrip reads FILE as little-endian [tokens, H, D] values of the given dtype, encodes them as one\n"
    "   layer's keys (--kind k: per-head Hadamard rotation, INT8 mean of each window of W tokens removed,\n"
    "   the last partial window using the mean of its own tokens) or values (--kind v), every token into\n"
    "   its fixed-size container (no BF16 tail), decodes, writes the reconstruction to --out in the input\n"
    "   dtype and prints one JSON line: streams, tokens, container_bytes, bits_per_value (every stored byte:\n"
    "   containers, fp16 scale/offset, window means), nmse (sum (x - x^)^2 / sum x^2 over the input),\n"
    "   max_payload_bytes_used, streams_that_needed_retry, and drift figures.\n"
    "\n"
    "   The profile is a built-in one (dq226: 2.26 bits/value, dq196: 1.96 bits/value; default dq226)\n"
    "   instantiated for H x D, or a custom one: --container-bytes C and --levels M for the chosen kind,\n"
    "   --alpha A (sharpening, default 1.4), --window W (default 128).\n"
    "\n"
    "   info prints a profile as JSON, frequency tables included (default shape 8 x 128).\n"
    "\n"
    "   demo runs roundtrip in memory over the real KV in DIR (default ../shared/data: bytellama-19m and\n"
    "   tinystories-656k), or over generated Gaussian KV when DIR is absent, with every built-in profile,\n"
    "   and prints a table of bits/value and NMSE for keys and values.\n"
    "\n"
    "EXIT STATUS\n"
    "   0 success, 1 failure (I/O, codec error), 2 usage error.\n";

typedef struct codec_args {
    int kind; /* -1 unset */
    uint32_t heads, head_dim, cbytes, levels, window;
    double alpha;
    int have_dtype;
    dq_dtype dtype;
    const char *in, *out, *profile, *data;
} codec_args;

/* --kind k|v (cli_opt callback). */
static int kind_arg(void *dst, const char *v)
{
    int *kind = dst;
    if (strcmp(v, "k") == 0 || strcmp(v, "K") == 0) {
        *kind = DQ_KIND_K;
    } else if (strcmp(v, "v") == 0 || strcmp(v, "V") == 0) {
        *kind = DQ_KIND_V;
    } else {
        cli_error(CLI_USAGE, PROG, "--kind must be k or v, not '%s'", v);
        return -1;
    }
    return 0;
}

/* --alpha A > 0 (cli_opt callback). */
static int alpha_arg(void *dst, const char *v)
{
    char *end;
    double *alpha = dst;
    *alpha = strtod(v, &end);
    return end == v || *end || !(*alpha > 0);
}

/* Parses the options of every codec subcommand: CLI_CONTINUE, or the exit status to return now. */
static int parse_args(int argc, char **argv, codec_args *a)
{
    memset(a, 0, sizeof *a);
    a->kind = -1;
    a->alpha = 1.4;
    const cli_opt opts[] = {
        CLI_FN("kind", kind_arg, &a->kind),
        CLI_U32("heads", &a->heads, 1),
        CLI_U32("head-dim", &a->head_dim, 1),
        CLI_DTYPE_GIVEN("dtype", &a->dtype, &a->have_dtype),
        CLI_STR("in", &a->in),
        CLI_STR("out", &a->out),
        CLI_STR("profile", &a->profile),
        CLI_U32("container-bytes", &a->cbytes, 1),
        CLI_U32("levels", &a->levels, 0),
        CLI_FN("alpha", alpha_arg, &a->alpha),
        CLI_U32("window", &a->window, 1),
        CLI_STR("data", &a->data),
        CLI_OPT_END,
    };
    return cli_parse_local(argc, argv, PROG, g_codec_help, opts);
}

/* The profile from --profile or the custom flags, for heads × head_dim. */
static int make_profile(const codec_args *a, uint32_t heads, uint32_t head_dim, int kind, dq_profile *p)
{
    int rc;
    if (a->cbytes || a->levels) {
        if (a->profile)
            return cli_error(CLI_USAGE, PROG, "--profile and --container-bytes/--levels exclude each other");
        if (!a->cbytes || !a->levels)
            return cli_error(CLI_USAGE, PROG, "a custom profile needs both --container-bytes and --levels");
        dq_profile base;
        rc = dq_profile_builtin("dq226", heads, head_dim, &base);
        if (rc != DQ_OK)
            return cli_error(CLI_USAGE, PROG, "shape %u x %u: %s", heads, head_dim, dq_strerror(rc));
        dq_profile_params pp;
        dq_profile_params_default(&pp);
        pp.kv_heads = heads;
        pp.head_dim = head_dim;
        pp.alpha = (float)a->alpha;
        pp.name = "custom";
        for (int k = 0; k < 2; k++) {
            pp.container_bytes[k] = k == kind ? a->cbytes : base.container_bytes[k];
            pp.levels[k] = k == kind ? a->levels : base.levels[k];
        }
        if (a->window)
            pp.window = pp.residual = a->window;
        rc = dq_profile_make(&pp, p);
    } else {
        rc = dq_profile_builtin(a->profile ? a->profile : "dq226", heads, head_dim, p);
        if (rc == DQ_OK && a->window) {
            p->window = p->residual = a->window;
            rc = dq_profile_validate(p);
        }
    }
    if (rc != DQ_OK)
        return cli_error(CLI_USAGE, PROG, "profile: %s (%s)", dq_strerror(rc), dq_err_name(rc));
    return 0;
}

static int cmd_roundtrip(const codec_args *a)
{
    int rc;
    if (a->kind < 0 || !a->heads || !a->head_dim || !a->have_dtype || !a->in || !a->out)
        return cli_error(CLI_USAGE, PROG, "roundtrip needs --kind, --heads, --head-dim, --dtype, --in and --out");
    dq_profile p;
    if ((rc = make_profile(a, a->heads, a->head_dim, a->kind, &p)))
        return rc;
    void *raw = NULL;
    size_t len = 0;
    if ((rc = cli_slurp(a->in, &raw, &len)) != 0)
        return cli_error(CLI_FAILED, PROG, "%s: %s", a->in, strerror(-rc));
    const size_t n = (size_t)a->heads * a->head_dim, esz = dq_dtype_size(a->dtype);
    if (len == 0 || len % (n * esz)) {
        free(raw);
        return cli_error(CLI_FAILED, PROG, "%s: %zu bytes is not a whole number of [%u, %u] %s tokens", a->in, len,
                         a->heads, a->head_dim, dq_dtype_name(a->dtype));
    }
    const size_t ntok = len / (n * esz);
    float *x = malloc(ntok * n * sizeof(float)), *xhat = malloc(ntok * n * sizeof(float));
    void *outb = malloc(len);
    int status = CLI_FAILED;
    if (!x || !xhat || !outb) {
        cli_error(CLI_FAILED, PROG, "out of memory for %zu tokens", ntok);
        goto done;
    }
    dq_convert(raw, a->dtype, x, DQ_DTYPE_F32, ntok * n);
    codec_rt_result r;
    rc = codec_roundtrip_f32(&p, (dq_kind)a->kind, x, ntok, xhat, NULL, &r);
    if (rc != DQ_OK) {
        cli_error(CLI_FAILED, PROG, "%s: %s (%s)", a->in, dq_strerror(rc), dq_err_name(rc));
        goto done;
    }
    /* The figures describe what is written: the reconstruction in the input dtype. */
    dq_convert(xhat, DQ_DTYPE_F32, outb, a->dtype, ntok * n);
    dq_convert(outb, a->dtype, xhat, DQ_DTYPE_F32, ntok * n);
    if ((rc = write_file(a->out, outb, len)) != 0) {
        cli_error(CLI_FAILED, PROG, "%s: %s", a->out, strerror(-rc));
        goto done;
    }
    printf("{\"kind\":\"%s\",\"profile\":\"%s\",\"streams\":%" PRIu64 ",\"tokens\":%" PRIu64
           ",\"stream_values\":%zu,\"levels\":%u,\"container_bytes\":%u,\"bits_per_value\":%.4f,\"nmse\":%.6g,"
           "\"max_payload_bytes_used\":%u,\"streams_that_needed_retry\":%" PRIu64 ",\"fallbacks\":%" PRIu64
           ",\"symbols_moved_fraction\":%.5f,\"max_move_levels\":%u,\"encode_streams_per_s\":%.0f}\n",
           a->kind == DQ_KIND_K ? "k" : "v", p.name, r.streams, r.tokens, n, p.levels[a->kind], r.container_bytes,
           r.bits_per_value, nmse_of(x, xhat, ntok * n), r.max_payload, r.retries, r.fallbacks, r.moved_fraction,
           r.max_move, r.encode_s > 0 ? (double)r.streams / r.encode_s : 0.0);
    status = CLI_OK;
done:
    free(raw);
    free(x);
    free(xhat);
    free(outb);
    return status;
}

static int cmd_info(const codec_args *a)
{
    uint32_t heads = a->heads ? a->heads : 8, hd = a->head_dim ? a->head_dim : 128;
    dq_profile p;
    int rc = make_profile(a, heads, hd, a->kind < 0 ? DQ_KIND_K : a->kind, &p);
    if (rc)
        return rc;
    print_profile_json(&p);
    return CLI_OK;
}

/* One dataset of the demo: f16 arrays sliced as [tokens, heads, head_dim] per (kind, layer). */
typedef struct demo_set {
    const char *name;
    uint32_t heads, head_dim, layers, tokens;
    float *k, *v; /* [layers][tokens][n] */
} demo_set;

static int load_f16_kv(const char *path, size_t seqs_skip_bytes, demo_set *s)
{
    void *file;
    size_t len;
    if (cli_slurp(path, &file, &len) != 0)
        return -1;
    const uint8_t *raw = file;
    const size_t n = (size_t)s->heads * s->head_dim, per = (size_t)s->layers * s->tokens * n;
    if (len < seqs_skip_bytes + 2 * per * 2) {
        free(file);
        return -1;
    }
    s->k = malloc(per * sizeof(float));
    s->v = malloc(per * sizeof(float));
    if (!s->k || !s->v) {
        free(file);
        return -1;
    }
    dq_convert(raw + seqs_skip_bytes, DQ_DTYPE_F16, s->k, DQ_DTYPE_F32, per);
    dq_convert(raw + seqs_skip_bytes + per * 2, DQ_DTYPE_F16, s->v, DQ_DTYPE_F32, per);
    free(file);
    return 0;
}

static int demo_run(const demo_set *s)
{
    const size_t n = (size_t)s->heads * s->head_dim, per = (size_t)s->tokens * n;
    float *xhat = malloc(per * sizeof(float));
    if (!xhat)
        return -1;
    const char *const *names = dq_profile_builtin_names();
    for (size_t i = 0; names[i]; i++) {
        dq_profile p;
        if (dq_profile_builtin(names[i], s->heads, s->head_dim, &p) != DQ_OK)
            continue;
        for (int kind = 0; kind < 2; kind++) {
            double se = 0, sx = 0, bits = 0, secs = 0;
            uint64_t retries = 0, streams = 0;
            for (uint32_t l = 0; l < s->layers; l++) {
                const float *x = (kind == 0 ? s->k : s->v) + (size_t)l * per;
                codec_rt_result r;
                if (codec_roundtrip_f32(&p, (dq_kind)kind, x, s->tokens, xhat, NULL, &r) != DQ_OK) {
                    free(xhat);
                    return -1;
                }
                for (size_t j = 0; j < per; j++) {
                    double d = (double)x[j] - xhat[j];
                    se += d * d;
                    sx += (double)x[j] * x[j];
                }
                bits += r.bits_per_value;
                retries += r.retries;
                streams += r.streams;
                secs += r.encode_s;
            }
            printf("%-18s %-6s %-2s %6u x %-4zu %8.4f %10.5f %8" PRIu64 " %12.0f\n", s->name, names[i],
                   kind ? "V" : "K", s->tokens * s->layers, n, bits / s->layers, se / sx, retries,
                   secs > 0 ? streams / secs : 0.0);
        }
    }
    free(xhat);
    return 0;
}

static int cmd_demo(const codec_args *a)
{
    /* The real KV of ../shared/data (sequence 0 of each file). */
    static const struct {
        demo_set shape;
        const char *file;
    } real[] = {
        {{"bytellama-19m", 2, 128, 6, 1024, NULL, NULL}, "bytellama-19m/kv_f16.bin"},
        {{"tinystories-656k", 4, 16, 2, 495, NULL, NULL}, "tinystories-656k/kv/kv_f16.bin"},
    };
    const char *dir = a->data ? a->data : "../shared/data";
    char path[4096];
    printf("%-18s %-6s %-2s %13s %8s %10s %8s %12s\n", "data", "prof", "KV", "tokens x n", "bits/val", "nmse",
           "retries", "enc streams/s");
    int ran = 0, rc;
    for (size_t i = 0; i < sizeof real / sizeof real[0]; i++) {
        demo_set d = real[i].shape;
        snprintf(path, sizeof path, "%s/%s", dir, real[i].file);
        if (load_f16_kv(path, 0, &d) != 0)
            continue;
        rc = demo_run(&d);
        free(d.k);
        free(d.v);
        if (rc)
            return cli_error(CLI_FAILED, PROG, "%s: codec failed", d.name);
        ran++;
    }
    if (!ran)
        fprintf(stderr, "dquant codec demo: no real KV under %s; using generated Gaussian KV\n", dir);
    /* Gaussian KV in the Qwen3-8B / Llama-3.1-8B stream shape (8 × 128), always shown as the reference. */
    demo_set g = {"gaussian", 8, 128, 1, 2048, NULL, NULL};
    const size_t cnt = (size_t)g.tokens * g.heads * g.head_dim;
    g.k = malloc(cnt * sizeof(float));
    g.v = malloc(cnt * sizeof(float));
    if (!g.k || !g.v)
        return cli_error(CLI_FAILED, PROG, "out of memory");
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (size_t j = 0; j < cnt; j++) {
        g.k[j] = (float)rng_gauss(&rng) + 0.5f * (float)((j % 128) % 5);
        g.v[j] = (float)rng_gauss(&rng);
    }
    rc = demo_run(&g);
    free(g.k);
    free(g.v);
    return rc ? cli_error(CLI_FAILED, PROG, "gaussian: codec failed") : CLI_OK;
}

int dq_cmd_codec(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*run)(const codec_args *);
    } subcmds[] = {{"roundtrip", cmd_roundtrip}, {"info", cmd_info}, {"demo", cmd_demo}};
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
        fputs(g_codec_help, argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    for (size_t i = 0; i < sizeof subcmds / sizeof subcmds[0]; i++) {
        if (strcmp(argv[1], subcmds[i].name) != 0)
            continue;
        codec_args a;
        int status = parse_args(argc - 1, argv + 1, &a);
        return status != CLI_CONTINUE ? status : subcmds[i].run(&a);
    }
    return cli_error(CLI_USAGE, PROG, "unknown subcommand '%s' (roundtrip, info, demo)", argv[1]);
}
