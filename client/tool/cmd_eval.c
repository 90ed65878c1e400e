/* `dquant eval`: codec quality on given KV data — bits/value, key/value NMSE, attention-score KL
 * and attention-output error with bootstrap intervals, for any list of codecs; ablations of
 * D-Quant's design choices. The computation lives in eval_core.c / eval_ablation.c. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"
#include "dquant/error.h"
#include "eval_ablation.h"
#include "eval_claims.h"
#include "eval_core.h"
#include "eval_model.h"
#include "eval_ppl.h"
#include "eval_vskip.h"

#define PROG "eval"
#define DEFAULT_CODECS "dq226,dq196,int2,quarot2,kivi2,turbo2,bf16"
#define DEFAULT_PPL_CODECS "fp32,bf16,dq226,dq196,fixed226,int2,quarot2,kivi2,turbo2,int3,quarot3,int4,quarot4"
#define MAX_CODECS 64

static const char g_eval_help[] =
    "NAME\n"
    "   dquant eval - KV-cache codec quality on real keys, values and queries\n"
    "\n"
    "SYNOPSIS\n"
    "   dquant eval --dataset bytellama-n1024|bytellama-19m|tinystories-656k [--data DIR] [OPTIONS]\n"
    "   dquant eval --claims --dataset NAME [--data DIR] [--claims-chunks N] [--json]\n"
    "   dquant eval --ppl --dataset NAME [--data DIR] [--chunks N] [--context C] [--targets T] [OPTIONS]\n"
    "   dquant eval --value-mass LIST --dataset NAME [--data DIR] [--codecs dq226,...] [OPTIONS]\n"
    "   dquant eval --k FILE --v FILE [--q FILE --q-heads QH] --kv-heads H --head-dim D --dtype f16|bf16|f32\n"
    "               [OPTIONS]\n"
    "\n"
    "DESCRIPTION\n"
    "   Encodes every token of every layer with each codec (window by window, the last partial window\n"
    "   with its own statistics, no BF16 tail), decodes, and prints a markdown table per codec:\n"
    "   bits/value (every stored byte: records, scales, window headers; mean of K and V), key and value\n"
    "   NMSE (sum (x - x^)^2 / sum x^2), attention-score KL and attention-output relative error, each with\n"
    "   a 95% percentile-bootstrap interval over tokens.\n"
    "\n"
    "   Attention uses the data's own queries (post-RoPE, like the keys): for query position t, every\n"
    "   layer and query head (GQA), p = softmax(q.k_s / sqrt(head_dim)) over s = 0..t (causal) with the\n"
    "   original keys and p^ with the reconstructed ones; KL(p || p^) in nats, and ||o - o^|| / ||o||\n"
    "   with o = sum p_s v_s, o^ = sum p^_s v^_s. Positions T-1, T-1-S, ... are evaluated (stride S).\n"
    "\n"
    "   With --ppl, the KVQuant++ paper's protocol (seed 001, section 5.1) on the model itself: a float32\n"
    "   C forward of the Llama model in DIR/NAME (config.json, model.safetensors) prefills C context\n"
    "   tokens (default 128) of held-out text at full precision; the whole prefill cache (every token of\n"
    "   every layer, keys after RoPE; no BF16 tail) is replaced by each codec's reconstruction; then T\n"
    "   tokens (default 64) run teacher-forced on it and their predictions of the next T tokens are\n"
    "   scored. Per codec: bits/value of the stored prefill cache, key/value NMSE, perplexity, dPPL =\n"
    "   PPL_codec - PPL_fp32 and the mean KL(p_fp32 || p_codec) in nats over scored positions, with 95%%\n"
    "   bootstrap intervals over chunks. Chunks are non-overlapping (C + T + 1 tokens each) and follow\n"
    "   the calibration sequences (--calib-seqs, default 8 of C tokens, at the start of the text).\n"
    "   Text: heldout.txt (byte models) or kv/tokens_i32.bin (tinystories-656k: 495 tokens, 2 chunks).\n"
    "   Codec 'fp32' is the identity through the same cache hook (dPPL and KL exactly 0).\n"
    "\n"
    "   With --value-mass TAU[,TAU...] (each in (0, 1), e.g. 0.99,0.999), certified value skipping\n"
    "   (libdquant dquant/vskip.h, dquantd --attention-value-mass) on D-Quant codecs (default dq226):\n"
    "   each layer of sequence 0 is appended token by token as in decoding (sealed windows plus the BF16\n"
    "   tail), and at every evaluated position each query attends causally once exactly (dq_attend) and\n"
    "   once per TAU (dq_attend_vskip). Per TAU: the share of sealed value streams decoded, the share of\n"
    "   value tokens used (decoded plus tail), the share of aligned 16-token blocks holding a decoded\n"
    "   token (the GPU hot kernel's value granularity), the output relative error against the exact result\n"
    "   (mean over layers and heads, 95%% bootstrap interval over positions, and the largest), the\n"
    "   returned error bound relative to ||o||, the share of heads within it, and the time in each call.\n"
    "\n"
    "   With --claims, each quantitative claim of the KVQuant++ paper (seed 001) next to our figure on\n"
    "   the dataset's real K/V (and queries), with a verdict (agrees / partly / disagrees) and a note on\n"
    "   why ours differs: attention-weighted bit assignment, delta coding, rank-4 correction (MSE,\n"
    "   storage, and dPPL/KL recovery at 2 bits through the --ppl protocol on --claims-chunks chunks,\n"
    "   default 8), PQ at 2 bits/dim vs 3-bit scalar, k-means++ seeding, K/V asymmetric +\n"
    "   delta + outlier values, bucketize vs argmin speed, Huffman at 4 bits. Calibrated codecs learn\n"
    "   on the first half of the tokens (256 of tinystories-656k's 495) and all are measured on the rest.\n"
    "\n"
    "   Datasets (DIR default ../shared/data): bytellama-n1024 (1 x 4 layers x 512 tokens, 8 KV heads\n"
    "   x 128: n = 1024 as in Qwen3-8B; queries 16 heads), bytellama-19m (2 sequences x 6 layers x 1024 tokens,\n"
    "   2 KV heads x 128; queries of sequence 0, 4 heads) and tinystories-656k (1 x 2 x 495, 4 KV heads\n"
    "   x 16; 8 query heads). --k/--v/--q read one layer of raw little-endian [tokens, heads, head_dim].\n"
    "\n"
    "OPTIONS\n"
    "   --codecs LIST\n"
    "       Comma-separated codecs (default " DEFAULT_CODECS "):\n"
    "         dq226, dq196          D-Quant built-in profiles (containers keep the n = 1024 payload rate)\n"
    "         dq226p, dq196p        the same in container format version 2 (joint two-symbol rANS)\n"
    "         bf16, intB, quarotB, kiviB, turboB   baselines in the library (B = 1..8 bits)\n"
    "         intB-gG, quarotB-gG   INT-B with G channels per fp16 scale/zero (default G = 128)\n"
    "         dq226@BITS            dq226's levels and K/V rate split, containers scaled to the largest\n"
    "                               stored mean <= BITS bits/value (likewise dq196@BITS)\n"
    "         fixed226, fixed196    the fixed-width profiles at the storage of dq226 / dq196 (seed\n"
    "                               Appendix B; dq_profile_fixed): same rotation and INT8 key window\n"
    "                               mean, M = floor(2^(8C/n)) levels, nearest rounding, least-squares\n"
    "                               refit, fp16 s/o, base-M packed containers, charged every stored\n"
    "                               byte; fixed226@BITS matches dq226@BITS; fixedkAvB: M_K = A, M_V = B\n"
    "         lmB, lmhB, ipB, olB, pqMxB, suffixes +oO +lrR +dN   the KVQuant++ family (dquant/kvq.h,\n"
    "                               e.g. lm3, ip3, lm2+lr4, ol3+d16, pq32x8); olB and pqMxB need\n"
    "                               calibration: --ppl calibrates them per layer on its calibration\n"
    "                               sequences, the tensor evaluation cannot run them\n"
    "   --ablation levels|budget|split|alpha|drift\n"
    "       levels: (M_K, M_V) at dq226's containers; budget: containers x0.7..x1.5 (M 8/6); split:\n"
    "       C_K + C_V = 562 bytes at n = 1024; alpha: sharpening 1.0..2.0; drift: per D-Quant codec of\n"
    "       --codecs (default dq226,dq196), symbols moved by drift, largest move, container fill, and the\n"
    "       excess rate of the coding table over the empirical symbol entropy (bits/value).\n"
    "   --query-stride S\n"
    "       Evaluate every S-th query position counted back from the last (default: tokens / 128).\n"
    "   --value-mass LIST  the value-skipping table above for these mass targets; with --ppl one TAU:\n"
    "                      every codec's run of the targets skips prefill values as dquant/vskip.h\n"
    "                      selects them (the union over all query heads; no renormalization), the\n"
    "                      fp32 reference stays exact, and a 'values used %%' column is added\n"
    "   --claims           the claims table above\n"
    "   --claims-chunks N  --claims: chunks of the dPPL/KL parts (default 8; 0: tensor figures only)\n"
    "   --ppl              the perplexity / KL protocol above (default codecs " DEFAULT_PPL_CODECS ")\n"
    "   --chunks N         --ppl: scored chunks (default 50, the paper's; fewer when the text is short)\n"
    "   --context C, --targets T, --calib-seqs S   --ppl: 128, 64, 8\n"
    "   --resamples R      bootstrap resamples (default 2000, at least 1000 recommended)\n"
    "   --seed N           bootstrap seed (default fixed: runs are reproducible)\n"
    "   --json             one JSON object per codec (or ablation row) instead of the table\n"
    "   --help             print this page\n"
    "\n"
    "EXIT STATUS\n"
    "   0 success, 1 failure (missing data, codec error), 2 usage error.\n"
    "\n"
    "EXAMPLES\n"
    "   dquant eval --dataset bytellama-19m --codecs dq226,fixed226,int2,kivi2,quarot2,turbo2\n"
    "   dquant eval --dataset tinystories-656k --ablation budget\n";

typedef struct eval_args {
    const char *dataset, *data, *k, *v, *q, *codecs, *ablation, *value_mass;
    uint32_t kv_heads, head_dim, q_heads;
    int have_dtype, json, ppl, claims;
    eval_claims_opts claims_opts;
    eval_ppl_opts ppl_opts;
    dq_dtype dtype;
    eval_opts opts;
} eval_args;

/* --seed N: any base strtoull reads (cli_opt callback). */
static int seed_arg(void *dst, const char *v)
{
    char *end;
    errno = 0;
    *(uint64_t *)dst = strtoull(v, &end, 0);
    return errno || end == v || *end;
}

/* CLI_CONTINUE, or the exit status to return now. */
static int parse_args(int argc, char **argv, eval_args *a)
{
    memset(a, 0, sizeof *a);
    eval_opts_default(&a->opts);
    eval_ppl_opts_default(&a->ppl_opts);
    eval_claims_opts_default(&a->claims_opts);
    const cli_opt opts[] = {
        CLI_STR("dataset", &a->dataset),
        CLI_STR("data", &a->data),
        CLI_STR("k", &a->k),
        CLI_STR("v", &a->v),
        CLI_STR("q", &a->q),
        CLI_U32("kv-heads", &a->kv_heads, 1),
        CLI_U32("head-dim", &a->head_dim, 1),
        CLI_U32("q-heads", &a->q_heads, 1),
        CLI_DTYPE_GIVEN("dtype", &a->dtype, &a->have_dtype),
        CLI_STR("codecs", &a->codecs),
        CLI_STR("ablation", &a->ablation),
        CLI_STR("value-mass", &a->value_mass),
        CLI_U32("query-stride", &a->opts.query_stride, 1),
        CLI_U32("resamples", &a->opts.resamples, 10),
        CLI_FN("seed", seed_arg, &a->opts.seed),
        CLI_FLAG("json", &a->json),
        CLI_FLAG("ppl", &a->ppl),
        CLI_FLAG("claims", &a->claims),
        CLI_U32("claims-chunks", &a->claims_opts.ppl_chunks, 0),
        CLI_U32("chunks", &a->ppl_opts.chunks, 1),
        CLI_U32("context", &a->ppl_opts.context, 1),
        CLI_U32("targets", &a->ppl_opts.targets, 1),
        CLI_U32("calib-seqs", &a->ppl_opts.calib_seqs, 0),
        CLI_OPT_END,
    };
    int status = cli_parse_local(argc, argv, PROG, g_eval_help, opts);
    if (status != CLI_CONTINUE)
        return status;
    if (optind < argc)
        return cli_error(CLI_USAGE, PROG, "unexpected argument '%s'", argv[optind]);
    if (a->claims && (!a->dataset || a->ppl || a->ablation))
        return cli_error(CLI_USAGE, PROG, "--claims needs --dataset NAME and runs alone (not with --ppl/--ablation)");
    if (a->ppl && !a->dataset)
        return cli_error(CLI_USAGE, PROG, "--ppl needs --dataset NAME (a model folder under --data)");
    if (a->value_mass && (a->ablation || a->claims))
        return cli_error(CLI_USAGE, PROG, "--value-mass runs alone or with --ppl (not with --ablation/--claims)");
    if (a->ppl && a->ablation)
        return cli_error(CLI_USAGE, PROG, "--ppl and --ablation are separate runs");
    if (!a->dataset == !a->k)
        return cli_error(CLI_USAGE, PROG, "give either --dataset NAME or --k/--v files (see dquant eval --help)");
    if (a->k && (!a->v || !a->kv_heads || !a->head_dim || !a->have_dtype))
        return cli_error(CLI_USAGE, PROG, "--k needs --v, --kv-heads, --head-dim and --dtype");
    if (a->q && !a->q_heads)
        return cli_error(CLI_USAGE, PROG, "--q needs --q-heads");
    return CLI_CONTINUE;
}

/* ---- output ---- */

static void print_data_header(const eval_data *d, const eval_opts *o, const char *what)
{
    const size_t n = eval_data_stream_len(d);
    printf("%s on %s: %u sequence%s x %u layer%s x %u tokens, %u KV heads x %u (n = %zu values per stream); "
           "every token encoded (no BF16 tail).\n",
           what, d->name, d->seqs, d->seqs == 1 ? "" : "s", d->layers, d->layers == 1 ? "" : "s", d->tokens,
           d->kv_heads, d->head_dim, n);
    if (d->q && !o->skip_attention) {
        const uint32_t S = eval_query_stride(d, o);
        printf("Attention: the data's queries of sequence 0 (%u heads, GQA), causal; query positions T-1, T-1-%u, "
               "... (stride %u: %u of %u per layer), all layers and heads.\n",
               d->q_heads, S, S, (d->tokens - 1) / S + 1, d->tokens);
    } else if (!o->skip_attention) {
        printf("Attention: no queries in the data; attention columns are empty.\n");
    }
    if (!o->collect_levels)
        printf("95%% intervals: percentile bootstrap over tokens, %u resamples, seed %#" PRIx64 ".\n", o->resamples,
               o->seed);
    if (n < 1024)
        printf("Note: at n = %zu the per-token fp16 scale/offset of D-Quant costs %.3f bits/value (%.3f at n = 1024); "
               "NAME@BITS gives a D-Quant profile at a chosen total.\n",
               n, 32.0 / (double)n, 32.0 / 1024.0);
    printf("\n");
}

static void fmt_ci(char *buf, size_t len, const eval_ci *c, int have)
{
    if (!have)
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.4g [%.4g, %.4g]", c->est, c->lo, c->hi);
}

static void print_table_head(void)
{
    printf("| codec | bits/value | K bits | V bits | K NMSE [95%% CI] | V NMSE [95%% CI] | score KL, nats [95%% CI] | "
           "attn out rel. err [95%% CI] |\n");
    printf("|---|---:|---:|---:|---|---|---|---|\n");
}

static void print_row(const char *lead, const eval_result *r)
{
    char nk[64], nv[64], kl[64], ae[64];
    fmt_ci(nk, sizeof nk, &r->nmse[0], 1);
    fmt_ci(nv, sizeof nv, &r->nmse[1], 1);
    fmt_ci(kl, sizeof kl, &r->kl, r->have_attn);
    fmt_ci(ae, sizeof ae, &r->attn_err, r->have_attn);
    printf("| %s%s | %.4f | %.4f | %.4f | %s | %s | %s | %s |\n", lead, r->label, r->bits_mean, r->bits[0], r->bits[1],
           nk, nv, kl, ae);
}

static void json_ci(const char *key, const eval_ci *c, int have)
{
    if (have)
        printf(",\"%s\":{\"est\":%.9g,\"lo\":%.9g,\"hi\":%.9g}", key, c->est, c->lo, c->hi);
    else
        printf(",\"%s\":null", key);
}

static void print_json(const eval_data *d, const eval_codec *c, const eval_result *r, const char *panel)
{
    printf("{\"dataset\":\"%s\",\"codec\":\"%s\",\"type\":\"%s\"", d->name, r->label,
           c->profile.codec_type == DQ_CODEC_FIXED    ? "fixed-width"
           : c->profile.codec_type == DQ_CODEC_DQUANT ? "dquant"
                                                      : "baseline");
    if (panel)
        printf(",\"ablation\":\"%s\"", panel);
    printf(",\"stream_values\":%zu,\"tokens\":%u,\"layers\":%u,\"sequences\":%u", eval_data_stream_len(d), d->tokens,
           d->layers, d->seqs);
    if (c->profile.codec_type == DQ_CODEC_FIXED)
        printf(",\"levels\":[%u,%u],\"container_bytes\":[%u,%u]", c->profile.levels[0], c->profile.levels[1],
               c->profile.container_bytes[0], c->profile.container_bytes[1]);
    else if (c->profile.codec_type == DQ_CODEC_DQUANT)
        printf(",\"levels\":[%u,%u],\"container_bytes\":[%u,%u],\"alpha\":%.3g", c->profile.levels[0],
               c->profile.levels[1], c->profile.container_bytes[0], c->profile.container_bytes[1],
               (double)c->profile.alpha);
    printf(",\"bits_per_value\":%.6f,\"bits_k\":%.6f,\"bits_v\":%.6f", r->bits_mean, r->bits[0], r->bits[1]);
    json_ci("nmse_k", &r->nmse[0], 1);
    json_ci("nmse_v", &r->nmse[1], 1);
    json_ci("attn_kl", &r->kl, r->have_attn);
    json_ci("attn_rel_err", &r->attn_err, r->have_attn);
    printf(",\"query_stride\":%u,\"query_positions_per_layer\":%u,\"resamples\":%u", r->query_stride,
           r->query_positions, r->resamples);
    if (c->profile.codec_type == DQ_CODEC_DQUANT)
        printf(",\"symbols_moved_fraction\":[%.6f,%.6f],\"max_move\":[%u,%u],\"retries\":[%" PRIu64 ",%" PRIu64 "]",
               r->streams[0] ? (double)r->symbols_moved[0] / ((double)r->streams[0] * eval_data_stream_len(d)) : 0.0,
               r->streams[1] ? (double)r->symbols_moved[1] / ((double)r->streams[1] * eval_data_stream_len(d)) : 0.0,
               r->max_move[0], r->max_move[1], r->retries[0], r->retries[1]);
    printf(",\"seconds\":%.3f}\n", r->seconds);
}

/* ---- subcommand ---- */

static int load_data(const eval_args *a, eval_data *d)
{
    char err[512];
    int rc = a->dataset ? eval_data_load_named(a->dataset, a->data, d, err, sizeof err)
                        : eval_data_load_files(a->k, a->v, a->q, a->kv_heads, a->head_dim, a->q_heads, a->dtype, d, err,
                                               sizeof err);
    if (rc != DQ_OK)
        return cli_error(CLI_FAILED, PROG, "%s", err);
    return 0;
}

/* The codecs of --codecs, resolved for the data's shape. */
typedef struct codec_list {
    eval_codec *codecs; /* [MAX_CODECS] */
    char (*why)[256];   /* [MAX_CODECS]: why codecs[i] cannot be made at this shape; "" when it can */
    size_t n;
} codec_list;

/* Splits the codec list and resolves each name for the data's shape. A codec that exists but cannot
 * be made at this shape (containers too small for its levels) gets its reason in why[i] and a row
 * saying so; an unknown name is a usage error. Returns 0 or the exit status after saying why;
 * codec_list_free(l) either way. */
static int codec_list_parse(const char *list, const eval_data *d, codec_list *l)
{
    char buf[1024], err[256];
    l->codecs = calloc(MAX_CODECS, sizeof *l->codecs);
    l->why = calloc(MAX_CODECS, sizeof *l->why);
    l->n = 0;
    if (!l->codecs || !l->why)
        return cli_error(CLI_FAILED, PROG, "out of memory");
    if (strlen(list) >= sizeof buf)
        return cli_error(CLI_USAGE, PROG, "--codecs list too long");
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (l->n == MAX_CODECS)
            return cli_error(CLI_USAGE, PROG, "at most %d codecs", MAX_CODECS);
        const int rc = eval_codec_parse(tok, d->kv_heads, d->head_dim, &l->codecs[l->n], err, sizeof err);
        l->why[l->n][0] = 0;
        if (rc == DQ_CONTAINER_TOO_SMALL)
            snprintf(l->why[l->n], sizeof l->why[l->n], "%s", err);
        else if (rc != DQ_OK)
            return cli_error(CLI_USAGE, PROG, "%s", err);
        l->n++;
    }
    return l->n ? 0 : cli_error(CLI_USAGE, PROG, "--codecs is empty");
}

static void codec_list_free(codec_list *l)
{
    free(l->codecs);
    free(l->why);
}

static int run_codecs(const eval_args *a, const eval_data *d)
{
    codec_list l;
    int status = codec_list_parse(a->codecs ? a->codecs : DEFAULT_CODECS, d, &l);
    if (status)
        goto out;
    if (!a->json) {
        print_data_header(d, &a->opts, "Codec quality");
        print_table_head();
    }
    for (size_t i = 0; i < l.n; i++) {
        if (l.why[i][0]) {
            if (a->json)
                printf("{\"dataset\":\"%s\",\"codec\":\"%s\",\"error\":\"CONTAINER_TOO_SMALL\"}\n", d->name,
                       l.codecs[i].label);
            else
                printf("| %s | - | - | - | cannot be made at n = %zu (see below) | | | |\n", l.codecs[i].label,
                       eval_data_stream_len(d));
            continue;
        }
        eval_result r;
        char err[512];
        if (eval_run(d, &l.codecs[i], &a->opts, &r, err, sizeof err) != DQ_OK) {
            status = cli_error(CLI_FAILED, PROG, "%s", err);
            goto out;
        }
        if (a->json)
            print_json(d, &l.codecs[i], &r, NULL);
        else
            print_row("", &r);
        fflush(stdout);
    }
    if (!a->json) {
        for (size_t i = 0; i < l.n; i++) {
            const eval_codec *c = &l.codecs[i];
            if (l.why[i][0])
                printf("\n%s", l.why[i]);
            else if (c->profile.codec_type == DQ_CODEC_FIXED)
                printf("\n%s: fixed-width profile (dq_profile_fixed): M %u/%u levels, base-M packed containers of "
                       "%u/%u bytes, fp16 s/o and the INT8 key mean as D-Quant.",
                       c->label, c->profile.levels[0], c->profile.levels[1], c->profile.container_bytes[0],
                       c->profile.container_bytes[1]);
        }
        printf("\n");
    }
out:
    codec_list_free(&l);
    return status;
}

static int run_ablation(const eval_args *a, const eval_data *d)
{
    eval_ablation_row *rows = NULL;
    size_t nrows = 0;
    int rc = eval_ablation_rows(a->ablation, d->kv_heads, d->head_dim, &rows, &nrows);
    if (rc == DQ_INVALID_ARGUMENT)
        return cli_error(CLI_USAGE, PROG, "unknown ablation '%s' (levels, budget, split, alpha, drift)", a->ablation);
    if (rc != DQ_OK)
        return cli_error(CLI_FAILED, PROG, "out of memory");
    if (!a->json) {
        char what[64];
        snprintf(what, sizeof what, "Ablation '%s'", a->ablation);
        print_data_header(d, &a->opts, what);
        printf("| panel: configuration | C K/V bytes | M K/V | alpha | moved K/V %% | bits/value | K bits | V bits | K "
               "NMSE [95%% CI] | "
               "V NMSE [95%% CI] | score KL, nats [95%% CI] | attn out rel. err [95%% CI] |\n");
        printf("|---|---|---|---|---|---:|---:|---:|---|---|---|---|\n");
    }
    int status = CLI_OK;
    for (size_t i = 0; i < nrows; i++) {
        const eval_ablation_row *row = &rows[i];
        if (row->rc != DQ_OK) {
            if (a->json)
                printf("{\"dataset\":\"%s\",\"ablation\":\"%s\",\"codec\":\"%s\",\"container_bytes\":[%u,%u],"
                       "\"levels\":[%u,%u],\"alpha\":%.3g,\"error\":\"%s\"}\n",
                       d->name, row->panel, row->codec.label, row->containers[0], row->containers[1], row->levels[0],
                       row->levels[1], (double)row->alpha, dq_err_name(row->rc));
            else
                printf("| %s: %s | %u/%u | %u/%u | %.1f | - | - | - | - | does not fit: %s | | | |\n", row->panel,
                       row->codec.label, row->containers[0], row->containers[1], row->levels[0], row->levels[1],
                       (double)row->alpha, dq_err_name(row->rc));
            continue;
        }
        eval_result r;
        char err[512];
        if (eval_run(d, &row->codec, &a->opts, &r, err, sizeof err) != DQ_OK) {
            status = cli_error(CLI_FAILED, PROG, "%s", err);
            break;
        }
        if (a->json) {
            print_json(d, &row->codec, &r, row->panel);
        } else {
            char lead[256];
            const double nv = (double)eval_data_stream_len(d);
            snprintf(lead, sizeof lead, "%s: %s | %u/%u | %u/%u | %.1f | %.2f/%.2f", row->panel, row->codec.label,
                     row->containers[0], row->containers[1], row->levels[0], row->levels[1], (double)row->alpha,
                     100.0 * (double)r.symbols_moved[0] / ((double)r.streams[0] * nv),
                     100.0 * (double)r.symbols_moved[1] / ((double)r.streams[1] * nv));
            /* the label is the configuration; the lead columns carry it already */
            r.label[0] = 0;
            print_row(lead, &r);
        }
        fflush(stdout);
    }
    free(rows);
    return status;
}

static int run_drift(const eval_args *a, const eval_data *d)
{
    codec_list l;
    int status = codec_list_parse(a->codecs ? a->codecs : "dq226,dq196", d, &l);
    if (status)
        goto out;
    eval_opts o = a->opts;
    o.collect_levels = 1;
    o.skip_attention = 1;
    if (!a->json) {
        print_data_header(d, &o, "Drift statistics");
        printf("| codec | kind | M | C bytes | symbols moved %% | max move | retries | fallbacks | container fill %% | "
               "H bits/value | table CE - H | analytic CE - H | log2 M - H |\n");
        printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    }
    for (size_t i = 0; i < l.n; i++) {
        const eval_codec *c = &l.codecs[i];
        if (l.why[i][0]) {
            fprintf(stderr, "dquant eval: drift: %s\n", l.why[i]);
            continue;
        }
        if (c->profile.codec_type != DQ_CODEC_DQUANT) {
            fprintf(stderr, "dquant eval: drift: %s is not a D-Quant codec, skipped\n", c->label);
            continue;
        }
        eval_result r;
        char err[512];
        if (eval_run(d, c, &o, &r, err, sizeof err) != DQ_OK) {
            status = cli_error(CLI_FAILED, PROG, "%s", err);
            goto out;
        }
        for (int k = 0; k < 2; k++) {
            eval_drift dr;
            if (eval_drift_summary(&r, &c->profile, (dq_kind)k, &dr) != DQ_OK) {
                status = cli_error(CLI_FAILED, PROG, "%s: no symbols collected", c->label);
                goto out;
            }
            if (a->json)
                printf("{\"dataset\":\"%s\",\"ablation\":\"drift\",\"codec\":\"%s\",\"kind\":\"%s\",\"levels\":%u,"
                       "\"container_bytes\":%u,\"symbols_moved_fraction\":%.6g,\"max_move\":%u,\"retries\":%" PRIu64
                       ",\"fallbacks\":%" PRIu64 ",\"fill\":%.6f,\"entropy\":%.6f,\"excess_table\":%.6f,"
                       "\"excess_model\":%.6f,\"coding_gain\":%.6f}\n",
                       d->name, c->label, k ? "v" : "k", dr.levels, dr.container, dr.moved_fraction, dr.max_move,
                       dr.retries, dr.fallbacks, dr.fill, dr.entropy, dr.excess_table, dr.excess_model, dr.coding_gain);
            else
                printf("| %s | %s | %u | %u | %.3f | %u | %" PRIu64 " | %" PRIu64
                       " | %.2f | %.4f | %.4f | %.4f | %.4f |\n",
                       c->label, k ? "V" : "K", dr.levels, dr.container, 100.0 * dr.moved_fraction, dr.max_move,
                       dr.retries, dr.fallbacks, 100.0 * dr.fill, dr.entropy, dr.excess_table, dr.excess_model,
                       dr.coding_gain);
        }
        fflush(stdout);
    }
    if (!a->json)
        printf("\nH: empirical entropy of the final (drifted) symbols; table CE: cross-entropy under the profile's "
               "sharpened integer table (what the coder pays per symbol); analytic CE: under the unsharpened "
               "Gaussian order-statistics model. Fill: rANS bytes used / container.\n");
out:
    codec_list_free(&l);
    return status;
}

/* ---- the perplexity / KL protocol ---- */

static int run_ppl(const eval_args *a)
{
    char dir[4096], err[512];
    snprintf(dir, sizeof dir, "%s/%s", a->data ? a->data : "../shared/data", a->dataset);
    eval_model *m = NULL;
    eval_text text = {0};
    eval_ppl_codec *codecs = NULL;
    eval_ppl_result *res = NULL;
    codec_list l = {0};
    int status = CLI_OK;
    if (eval_model_load(dir, &m, err, sizeof err) != DQ_OK ||
        eval_text_load(dir, eval_model_cfg(m)->vocab, &text, err, sizeof err) != DQ_OK) {
        status = cli_error(CLI_FAILED, PROG, "%s", err);
        goto out;
    }
    const eval_model_config *cfg = eval_model_cfg(m);
    eval_ppl_opts o = a->ppl_opts;
    o.resamples = a->opts.resamples;
    o.seed = a->opts.seed;
    if (a->value_mass) {
        char *end;
        errno = 0;
        o.value_mass = strtod(a->value_mass, &end);
        if (end == a->value_mass || *end || errno || !(o.value_mass > 0.0 && o.value_mass < 1.0)) {
            status = cli_error(CLI_USAGE, PROG, "--ppl --value-mass takes one mass target in (0, 1), not '%s'",
                               a->value_mass);
            goto out;
        }
    }
    if (eval_ppl_fit(&o, text.len) != DQ_OK) {
        status = cli_error(CLI_FAILED, PROG, "%s: %zu tokens hold no chunk of %u + %u + 1", text.source, text.len,
                           o.context, o.targets);
        goto out;
    }
    /* "fp32" is the protocol's own; the rest resolve like the tensor evaluation's codecs */
    const char *list = a->codecs ? a->codecs : DEFAULT_PPL_CODECS;
    char buf[1024], rest[1024] = "";
    if (strlen(list) >= sizeof buf) {
        status = cli_error(CLI_USAGE, PROG, "--codecs list too long");
        goto out;
    }
    snprintf(buf, sizeof buf, "%s", list);
    size_t nid = 0, order = 0;
    int identity_at[MAX_CODECS];
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), order++) {
        if (order == MAX_CODECS) {
            status = cli_error(CLI_USAGE, PROG, "at most %d codecs", MAX_CODECS);
            goto out;
        }
        identity_at[order] = strcmp(tok, "fp32") == 0;
        if (identity_at[order])
            nid++;
        else
            snprintf(rest + strlen(rest), sizeof rest - strlen(rest), "%s%s", rest[0] ? "," : "", tok);
    }
    eval_data shape = {.kv_heads = cfg->kv_heads, .head_dim = cfg->head_dim};
    if (rest[0] && (status = codec_list_parse(rest, &shape, &l)) != 0)
        goto out;
    codecs = calloc(order ? order : 1, sizeof *codecs);
    res = calloc(order ? order : 1, sizeof *res);
    if (!codecs || !res) {
        status = cli_error(CLI_FAILED, PROG, "out of memory");
        goto out;
    }
    for (size_t i = 0, j = 0; i < order; i++) {
        if (identity_at[i]) {
            codecs[i].identity = 1;
            continue;
        }
        if (l.why[j][0])
            codecs[i].unavailable = l.why[j];
        codecs[i].codec = l.codecs[j++];
    }
    if (!a->json) {
        printf("Perplexity / KL protocol (KVQuant++ seed section 5.1) on %s: %u layers, %u KV heads x %u (n = %u), "
               "%llu parameters, float32 C forward.\n",
               a->dataset, cfg->layers, cfg->kv_heads, cfg->head_dim, cfg->kv_heads * cfg->head_dim,
               (unsigned long long)eval_model_params(m));
        printf("%u chunks of %u prefill + %u teacher-forced tokens (%u scored each) from %s tokens [%llu, %llu); "
               "calibration: %u sequences of %u at [%llu, %llu).\n",
               o.chunks, o.context, o.targets, o.targets, text.source, (unsigned long long)o.offset,
               (unsigned long long)(o.offset + (uint64_t)o.chunks * (o.context + o.targets + 1)), o.calib_seqs,
               o.context, (unsigned long long)o.calib_offset,
               (unsigned long long)(o.calib_offset + (uint64_t)o.calib_seqs * o.context));
        printf("Every prefill token quantized (no BF16 tail); targets' own K/V float32. 95%% intervals: bootstrap "
               "over chunks, %u resamples.\n",
               o.resamples);
        if (o.value_mass > 0)
            printf(
                "Value skipping at mass %g (dquant/vskip.h's selection) in every codec's run: the targets' attention "
                "sums a prefill token's value only when it is in the union over all query heads of each head's "
                "smallest set holding that share of its mass (the targets' own tokens always count, no "
                "renormalization); the fp32 reference run is exact. 'values used': prefill values summed / "
                "offered.\n",
                o.value_mass);
        printf("\n");
    }
    if (eval_ppl_run(m, &text, codecs, order, &o, res, err, sizeof err) != DQ_OK) {
        status = cli_error(CLI_FAILED, PROG, "%s", err);
        goto out;
    }
    const int vs = o.value_mass > 0;
    if (!a->json) {
        printf("| codec | bits/value | K bits | V bits | K NMSE | V NMSE | PPL | dPPL [95%% CI] | KL, nats [95%% CI] "
               "|%s\n",
               vs ? " values used % |" : "");
        printf("|---|---:|---:|---:|---:|---:|---:|---|---|%s\n", vs ? "---:|" : "");
    }
    for (size_t i = 0; i < order; i++) {
        const eval_ppl_result *r = &res[i];
        if (a->json) {
            printf("{\"dataset\":\"%s\",\"protocol\":\"ppl\",\"codec\":\"%s\"", a->dataset, r->label);
            if (r->rc != DQ_OK) {
                printf(",\"error\":\"%s\",\"why\":\"%s\"}\n", dq_err_name(r->rc), r->why);
                continue;
            }
            printf(",\"stream_values\":%u,\"chunks\":%u,\"context\":%u,\"targets\":%u,\"bits_per_value\":%.6f,"
                   "\"bits_k\":%.6f,\"bits_v\":%.6f,\"nmse_k\":%.9g,\"nmse_v\":%.9g,\"ppl_fp32\":%.9g,\"ppl\":%.9g,"
                   "\"dppl\":{\"est\":%.9g,\"lo\":%.9g,\"hi\":%.9g},\"kl\":{\"est\":%.9g,\"lo\":%.9g,\"hi\":%.9g},"
                   "\"seconds\":%.3f",
                   cfg->kv_heads * cfg->head_dim, r->chunks, o.context, r->targets, r->bits_mean, r->bits[0],
                   r->bits[1], r->nmse[0], r->nmse[1], r->ppl_ref, r->ppl, r->dppl_ci.est, r->dppl_ci.lo, r->dppl_ci.hi,
                   r->kl.est, r->kl.lo, r->kl.hi, r->seconds);
            if (vs)
                printf(",\"value_mass\":%.9g,\"values_used\":%.6f", o.value_mass, r->value_kept);
            printf("}\n");
        } else if (r->rc != DQ_OK) {
            printf("| %s | - | - | - | - | - | - | cannot run: %s | |\n", r->label, r->why);
        } else {
            printf("| %s | %.4f | %.4f | %.4f | %.4g | %.4g | %.4f | %+.4g [%+.4g, %+.4g] | %.4g [%.4g, %.4g] |",
                   r->label, r->bits_mean, r->bits[0], r->bits[1], r->nmse[0], r->nmse[1], r->ppl, r->dppl_ci.est,
                   r->dppl_ci.lo, r->dppl_ci.hi, r->kl.est, r->kl.lo, r->kl.hi);
            if (vs)
                printf(" %.1f |", 100 * r->value_kept);
            printf("\n");
        }
        fflush(stdout);
    }
    if (!a->json && order)
        printf("\nPPL_fp32 = %.4f (%.4f bits/token over %u scored targets).\n", res[0].ppl_ref,
               res[0].nll_ref / log(2.0), o.chunks * o.targets);
out:
    if (l.codecs)
        codec_list_free(&l);
    free(codecs);
    free(res);
    eval_text_free(&text);
    eval_model_free(m);
    return status;
}

/* ---- the claims table ---- */

static void json_str(const char *key, const char *v)
{
    printf(",\"%s\":\"", key);
    for (const char *p = v; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if ((unsigned char)*p < 0x20)
            printf("\\u%04x", (unsigned char)*p);
        else
            putchar(*p);
    }
    putchar('"');
}

static int run_claims(const eval_args *a, const eval_data *d)
{
    char dir[4096], err[512];
    snprintf(dir, sizeof dir, "%s/%s", a->data ? a->data : "../shared/data", a->dataset);
    eval_model *m = NULL;
    eval_text text = {0};
    int status = CLI_OK;
    if (a->claims_opts.ppl_chunks && (eval_model_load(dir, &m, err, sizeof err) != DQ_OK ||
                                      eval_text_load(dir, eval_model_cfg(m)->vocab, &text, err, sizeof err) != DQ_OK)) {
        status = cli_error(CLI_FAILED, PROG, "%s (--claims-chunks 0 runs the tensor figures without the model)", err);
        goto out;
    }
    eval_claim rows[16];
    if (eval_claims_count() > sizeof rows / sizeof rows[0] ||
        eval_claims_run(d, m, &text, &a->claims_opts, rows, err, sizeof err) != DQ_OK) {
        status = cli_error(CLI_FAILED, PROG, "%s", err);
        goto out;
    }
    const size_t n = eval_claims_count();
    if (a->json) {
        for (size_t i = 0; i < n; i++) {
            printf("{\"dataset\":\"%s\",\"claim_id\":\"%s\"", d->name, rows[i].id);
            json_str("claim", rows[i].claim);
            json_str("paper", rows[i].paper);
            json_str("ours", rows[i].ours);
            json_str("verdict", eval_verdict_name(rows[i].verdict));
            json_str("note", rows[i].note);
            printf(",\"values\":{");
            for (size_t j = 0; j < rows[i].nvalues; j++)
                printf("%s\"%s\":%.9g", j ? "," : "", rows[i].values[j].key,
                       isfinite(rows[i].values[j].value) ? rows[i].values[j].value : 0.0);
            printf("}}\n");
        }
        goto out;
    }
    printf("KVQuant++ claims on %s (%u layers x %u tokens, %u KV heads x %u; calibrated codecs learn on tokens "
           "[0, %u), all measured on [%u, %u))%s.\n\n",
           d->name, d->layers, d->tokens, d->kv_heads, d->head_dim, eval_claims_split(d->tokens),
           eval_claims_split(d->tokens), d->tokens, m ? "; dPPL/KL through the --ppl protocol" : "");
    printf("| # | claim | paper | ours | verdict |\n|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++)
        printf("| %zu | %s | %s | %s | %s |\n", i + 1, rows[i].claim, rows[i].paper, rows[i].ours,
               eval_verdict_name(rows[i].verdict));
    printf("\nNotes:\n");
    for (size_t i = 0; i < n; i++)
        if (rows[i].note[0])
            printf("%zu. (%s) %s\n", i + 1, rows[i].id, rows[i].note);
out:
    eval_text_free(&text);
    eval_model_free(m);
    return status;
}

#define MAX_TAUS 16

/* --value-mass LIST: the value-skipping table (eval_vskip.h) per D-Quant codec of --codecs. */
static int run_vskip(const eval_args *a, const eval_data *d)
{
    double taus[MAX_TAUS];
    size_t ntau = 0;
    char buf[512];
    if (strlen(a->value_mass) >= sizeof buf)
        return cli_error(CLI_USAGE, PROG, "--value-mass list too long");
    snprintf(buf, sizeof buf, "%s", a->value_mass);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        errno = 0;
        const double t = strtod(tok, &end);
        if (end == tok || *end || errno || !(t > 0.0 && t < 1.0))
            return cli_error(CLI_USAGE, PROG, "--value-mass: '%s' is not a mass target in (0, 1)", tok);
        if (ntau == MAX_TAUS)
            return cli_error(CLI_USAGE, PROG, "--value-mass: at most %d targets", MAX_TAUS);
        taus[ntau++] = t;
    }
    if (!ntau)
        return cli_error(CLI_USAGE, PROG, "--value-mass is empty");
    if (!d->q)
        return cli_error(CLI_FAILED, PROG, "%s has no queries: value skipping needs them", d->name);
    codec_list l;
    int status = codec_list_parse(a->codecs ? a->codecs : "dq226", d, &l);
    if (status)
        goto out;
    if (!a->json) {
        const uint32_t S = eval_query_stride(d, &a->opts);
        printf("Value skipping on %s: sequence 0, %u layers x %u tokens appended in order (sealed windows + BF16 "
               "tail), %u query heads over %u KV heads x %u; positions T-1, T-1-%u, ... (%u per layer), causal.\n",
               d->name, d->layers, d->tokens, d->q_heads, d->kv_heads, d->head_dim, S, (d->tokens - 1) / S + 1);
        printf("Error: ||o_tau - o|| / ||o|| per head against dq_attend (tau off); 95%% percentile-bootstrap "
               "interval over positions, %u resamples, seed %#" PRIx64 ".\n\n",
               a->opts.resamples, a->opts.seed);
        printf(
            "| codec | tau | value streams decoded %% | value tokens used %% | 16-token blocks decoded %% | out rel. "
            "err "
            "[95%% CI] | max rel. err | bound / ||o|| (mean) | within bound %% | dq_attend s | dq_attend_vskip s |\n");
        printf("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n");
    }
    eval_vskip_row rows[MAX_TAUS];
    for (size_t i = 0; i < l.n; i++) {
        char err[512];
        if (l.why[i][0] || eval_vskip_run(d, &l.codecs[i], &a->opts, taus, ntau, rows, err, sizeof err) != DQ_OK) {
            status = cli_error(CLI_FAILED, PROG, "%s", l.why[i][0] ? l.why[i] : err);
            goto out;
        }
        for (size_t t = 0; t < ntau; t++) {
            const eval_vskip_row *r = &rows[t];
            if (a->json)
                printf(
                    "{\"dataset\":\"%s\",\"codec\":\"%s\",\"value_mass\":%.9g,\"value_streams_decoded\":%.6f,"
                    "\"value_tokens_used\":%.6f,\"blocks16_decoded\":%.6f,\"out_rel_err\":{\"est\":%.9g,"
                    "\"lo\":%.9g,\"hi\":%.9g},\"out_rel_err_max\":%.9g,\"bound_rel_mean\":%.9g,\"within_bound\":%.6f,"
                    "\"positions\":%u,\"items\":%u,\"seconds_exact\":%.3f,\"seconds_vskip\":%.3f}\n",
                    d->name, l.codecs[i].label, r->tau, r->decoded, r->used, r->blocks16, r->rel_err.est, r->rel_err.lo,
                    r->rel_err.hi, r->rel_err_max, r->bound_rel, r->held, r->positions, r->items, r->seconds_exact,
                    r->seconds_vskip);
            else
                printf("| %s | %g | %.1f | %.1f | %.1f | %.3g [%.3g, %.3g] | %.3g | %.3g | %.1f | %.2f | %.2f |\n",
                       l.codecs[i].label, r->tau, 100 * r->decoded, 100 * r->used, 100 * r->blocks16, r->rel_err.est,
                       r->rel_err.lo, r->rel_err.hi, r->rel_err_max, r->bound_rel, 100 * r->held, r->seconds_exact,
                       r->seconds_vskip);
        }
        fflush(stdout);
    }
out:
    codec_list_free(&l);
    return status;
}

int dq_cmd_eval(int argc, char **argv)
{
    eval_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != CLI_CONTINUE)
        return rc;
    if (a.ppl)
        return run_ppl(&a);
    eval_data d;
    if ((rc = load_data(&a, &d)) != 0)
        return rc;
    if (a.value_mass)
        rc = run_vskip(&a, &d);
    else if (a.claims)
        rc = run_claims(&a, &d);
    else if (!a.ablation)
        rc = run_codecs(&a, &d);
    else if (strcmp(a.ablation, "drift") == 0)
        rc = run_drift(&a, &d);
    else
        rc = run_ablation(&a, &d);
    eval_data_free(&d);
    return rc;
}
