/* dquant command-line tool: one subcommand per daemon operation — register, unregister, put, get,
 * attend, delete, pin, unpin, stats, ping. Each is a thin layer over libdquant-client. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_common.h"
#include "commands.h"

#define EXIT_HELP                                                                       \
    "EXIT STATUS\n"                                                                     \
    "       0 on success, 1 when the request failed (connection or server error, the\n" \
    "       reason on stderr), 2 on a usage error.\n"

/* The subcommands' checks: when cond holds, say why on stderr, set status to st and leave through
 * the exit label `out` (every subcommand here has `int status`, `const char *prog` and `out:`). */
#define EXIT_IF(cond, st, ...)                           \
    do {                                                 \
        if (cond) {                                      \
            status = cli_error((st), prog, __VA_ARGS__); \
            goto out;                                    \
        }                                                \
    } while (0)

/* ---- sequence options shared by several subcommands ---- */

#define SEQ_HELP                                                         \
    "   --ns NAMESPACE\n"                                                \
    "       Namespace of the sequence (default: the empty namespace).\n" \
    "   --key KEY, --key-hex HEX\n"                                      \
    "       The sequence's key, as text or as hex-encoded bytes (one of them is required).\n"

typedef struct seq_arg {
    const char *ns;
    uint8_t *key; /* owned */
    size_t key_len;
    int set;
} seq_arg;

/* --key TEXT into a seq_arg (cli_opt callback). */
static int key_text(void *dst, const char *arg)
{
    seq_arg *s = dst;
    free(s->key);
    s->key_len = strlen(arg);
    s->key = malloc(s->key_len + 1);
    if (!s->key)
        return -1;
    memcpy(s->key, arg, s->key_len + 1);
    s->set = 1;
    return 0;
}

/* --key-hex HEX into a seq_arg (cli_opt callback). */
static int key_hex(void *dst, const char *arg)
{
    seq_arg *s = dst;
    free(s->key);
    s->key = NULL;
    s->set = 1;
    if (cli_hex_decode(arg, &s->key, &s->key_len)) {
        fprintf(stderr, "dquant: --key-hex: '%s' is not an even number of hex digits\n", arg);
        return -1;
    }
    return 0;
}

/* The options of one sequence: --ns, --key, --key-hex. */
#define SEQ_OPTS(s) CLI_STR("ns", &(s)->ns), CLI_FN("key", key_text, (s)), CLI_FN("key-hex", key_hex, (s))

static dqc_seq seq_of(const seq_arg *s)
{
    return (dqc_seq){.ns = s->ns, .key = s->key, .key_len = s->key_len};
}

/* ================================ register ================================ */

static const char register_help[] =
    "NAME\n"
    "       dquant register - register a model with dquantd\n"
    "\n"
    "SYNOPSIS\n"
    "       dquant register --model NAME --layers N --q-heads Q --kv-heads H --head-dim D\n"
    "                       [--profile NAME | --profile-file FILE] [--calibration FILE]\n"
    "                       [--save-profile FILE]\n"
    "\n"
    "DESCRIPTION\n"
    "       Registers a model shape with its codec profile under a global name. Registering the same\n"
    "       name with an identical spec again succeeds (\"existed\"); a different spec under the same\n"
    "       name fails with EXISTS. Prints the profile's stored bits per value.\n"
    "\n"
    "OPTIONS\n"
    "   --model NAME\n"
    "       Model name (required).\n"
    "   --layers N, --q-heads Q, --kv-heads H, --head-dim D\n"
    "       The model's shape (defaults: 1 layer, 32 query heads, 8 KV heads of 128).\n"
    "   --profile NAME\n"
    "       A built-in codec profile, instantiated for the shape (default dq226; also dq196).\n"
    "   --profile-file FILE\n"
    "       A serialized dq_profile instead (as written by --save-profile).\n"
    "   --calibration FILE\n"
    "       The model's KVQuant++ calibration: the bytes dq_kvq_calibrate (or dquant.kvq.calibrate)\n"
    "       wrote, with the calibrated profile they go with (--profile-file). Profiles with outlier\n"
    "       channels or product quantization (ol*, pq*) need one; its layer count must be --layers.\n"
    "   --save-profile FILE\n"
    "       Write the serialized profile the daemon uses to FILE.\n" CLI_CONN_HELP "\n" EXIT_HELP "\n"
    "EXAMPLES\n"
    "       dquant register --model llama3-8b --layers 32 --q-heads 32 --kv-heads 8 --head-dim 128\n";

int dq_cmd_register(int argc, char **argv)
{
    const char *prog = "register";
    cli_conn cc;
    cli_conn_init(&cc);
    dqc_model_spec spec = {.layers = 1, .q_heads = 32, .kv_heads = 8, .head_dim = 128, .profile_name = "dq226"};
    const char *profile_file = NULL, *save = NULL, *calib_file = NULL;
    void *profile = NULL, *calib = NULL;
    size_t calib_len = 0;
    dqc_client *c = NULL;
    const cli_opt opts[] = {
        CLI_STR("model", &spec.name),           CLI_U32("layers", &spec.layers, 1),
        CLI_U32("q-heads", &spec.q_heads, 1),   CLI_U32("kv-heads", &spec.kv_heads, 1),
        CLI_U32("head-dim", &spec.head_dim, 1), CLI_STR("profile", &spec.profile_name),
        CLI_STR("profile-file", &profile_file), CLI_STR("calibration", &calib_file),
        CLI_STR("save-profile", &save),         CLI_OPT_END,
    };
    int status = cli_parse(argc, argv, prog, register_help, opts, &cc);
    if (status != CLI_CONTINUE)
        goto out;
    EXIT_IF(!spec.name, CLI_USAGE, "--model is required");
    status = CLI_USAGE; /* an unreadable --profile-file is a usage error */
    if (profile_file) {
        size_t len;
        if (cli_read_file(profile_file, SIZE_MAX, &profile, &len))
            goto out;
        spec.profile = profile;
        spec.profile_len = len;
        spec.profile_name = NULL;
    }
    if (calib_file && cli_read_file(calib_file, SIZE_MAX, &calib, &calib_len))
        goto out;
    status = CLI_FAILED;
    if (cli_connect(&cc, prog, &c))
        goto out;
    dqc_model_info info;
    int rc = dqc_register_model_calibrated(c, &spec, 0, calib, calib_len, &info, NULL);
    if (rc) {
        cli_call_error(prog, "register", c, rc);
        goto out;
    }
    printf("model %s: %s, %.4f bits/value, profile %zu bytes\n", spec.name,
           info.existed ? "already registered" : "registered", info.bits_per_value, info.profile_len);
    if (save && cli_write_file(save, info.profile, info.profile_len))
        goto out;
    status = CLI_OK;
out:
    dqc_free(c);
    free(profile);
    free(calib);
    cli_conn_free(&cc);
    return status;
}

/* ================================ unregister ================================ */

static const char unregister_help[] =
    "NAME\n"
    "       dquant unregister - remove a registered model from dquantd\n"
    "\n"
    "SYNOPSIS\n"
    "       dquant unregister --model NAME [OPTIONS]\n"
    "\n"
    "DESCRIPTION\n"
    "       Removes a model, freeing its name and its place in the registry (dquantd counts models\n"
    "       per client name: max_models_per_client). Fails with BUSY while sequences or chunks of the\n"
    "       model exist (delete them first; nothing is deleted for you) or a request is using it, and\n"
    "       with NOT_FOUND for an unknown name.\n"
    "\n"
    "OPTIONS\n"
    "   --model NAME\n"
    "       Model name (required).\n" CLI_CONN_HELP "\n" EXIT_HELP "\n"
    "EXAMPLES\n"
    "       dquant unregister --model llama3-8b\n";

int dq_cmd_unregister(int argc, char **argv)
{
    const char *prog = "unregister";
    cli_conn cc;
    cli_conn_init(&cc);
    const char *name = NULL;
    dqc_client *c = NULL;
    const cli_opt opts[] = {
        CLI_STR("model", &name),
        CLI_OPT_END,
    };
    int status = cli_parse(argc, argv, prog, unregister_help, opts, &cc);
    if (status != CLI_CONTINUE)
        goto out;
    EXIT_IF(!name || !*name, CLI_USAGE, "--model is required");
    status = CLI_FAILED;
    if (cli_connect(&cc, prog, &c))
        goto out;
    int rc = dqc_unregister_model(c, name);
    if (rc) {
        cli_call_error(prog, "unregister", c, rc);
        goto out;
    }
    printf("model %s: unregistered\n", name);
    status = CLI_OK;
out:
    dqc_free(c);
    cli_conn_free(&cc);
    return status;
}

/* ================================ put ================================ */

static const char put_help[] =
    "NAME\n"
    "       dquant put - append K/V tokens to a sequence stored by dquantd\n"
    "\n"
    "SYNOPSIS\n"
    "       dquant put --model NAME (--key KEY | --key-hex HEX) --tokens T\n"
    "                  (--k FILE --v FILE | --random SEED) [OPTIONS]\n"
    "\n"
    "DESCRIPTION\n"
    "       Appends tokens [START, START + T) to layers [LAYER, LAYER + N) of a sequence; the daemon\n"
    "       compresses them with the model's profile. The sequence is created by its first PUT;\n"
    "       START must equal each written layer's current length. All-or-nothing.\n"
    "       K and V files hold raw little-endian values of DTYPE laid out as\n"
    "       [N, T, KV_HEADS, HEAD_DIM]; --random fills both with N(0,1) draws instead.\n"
    "\n"
    "OPTIONS\n"
    "   --model NAME\n"
    "       A registered model (see dquant register).\n" SEQ_HELP "   --start START\n"
    "       First token position (default 0).\n"
    "   --layer LAYER, --layers N\n"
    "       First layer and number of layers written (defaults 0 and 1).\n"
    "   --tokens T\n"
    "       Tokens per layer (required).\n"
    "   --kv-heads H, --head-dim D\n"
    "       The model's KV shape (defaults 8 and 128).\n"
    "   --dtype f32|f16|bf16\n"
    "       Element type of the files (default bf16).\n"
    "   --k FILE, --v FILE\n"
    "       The keys and values.\n"
    "   --random SEED\n"
    "       Send random normal K/V generated from SEED.\n" CLI_CONN_HELP "\n" EXIT_HELP "\n"
    "EXAMPLES\n"
    "       dquant register --model m --layers 2\n"
    "       dquant put --model m --key req-1 --layers 2 --tokens 256 --random 1\n";

int dq_cmd_put(int argc, char **argv)
{
    const char *prog = "put";
    cli_conn cc;
    cli_conn_init(&cc);
    seq_arg seq = {0};
    dqc_put_args a = {.num_layers = 1, .kv_heads = 8, .head_dim = 128, .dtype = DQ_DTYPE_BF16};
    const char *kfile = NULL, *vfile = NULL;
    uint64_t seed = 0;
    int have_seed = 0;
    void *k = NULL, *v = NULL;
    dqc_client *c = NULL;
    const cli_opt opts[] = {
        SEQ_OPTS(&seq),
        CLI_STR("model", &a.model),
        CLI_U64("start", &a.start_token, 0),
        CLI_U32("layer", &a.first_layer, 0),
        CLI_U32("layers", &a.num_layers, 1),
        CLI_U64("tokens", &a.tokens, 1),
        CLI_U32("kv-heads", &a.kv_heads, 1),
        CLI_U32("head-dim", &a.head_dim, 1),
        CLI_DTYPE("dtype", &a.dtype),
        CLI_STR("k", &kfile),
        CLI_STR("v", &vfile),
        CLI_U64_GIVEN("random", &seed, &have_seed),
        CLI_OPT_END,
    };
    int status = cli_parse(argc, argv, prog, put_help, opts, &cc);
    if (status != CLI_CONTINUE)
        goto out;
    EXIT_IF(!a.model || !seq.set || !a.tokens, CLI_USAGE, "--model, --key and --tokens are required");
    EXIT_IF(have_seed == !!(kfile || vfile) || (!have_seed && !(kfile && vfile)), CLI_USAGE,
            "give either --k FILE and --v FILE, or --random SEED");
    size_t count = (size_t)a.num_layers * a.tokens * a.kv_heads * a.head_dim;
    size_t bytes = count * dq_dtype_size(a.dtype);
    status = CLI_FAILED;
    if (have_seed) {
        k = malloc(bytes);
        v = malloc(bytes);
        EXIT_IF(!k || !v, CLI_FAILED, "out of memory for %zu bytes", bytes);
        cli_fill_normal(k, a.dtype, count, &seed);
        cli_fill_normal(v, a.dtype, count, &seed);
    } else if (cli_read_file(kfile, bytes, &k, NULL) || cli_read_file(vfile, bytes, &v, NULL)) {
        goto out;
    }
    a.seq = seq_of(&seq);
    a.k = k;
    a.v = v;
    if (cli_connect(&cc, prog, &c))
        goto out;
    dqc_put_result r;
    uint64_t t0 = cli_now_ns();
    int rc = dqc_put(c, &a, &r);
    double ms = 1e3 * cli_seconds_since(t0);
    if (rc) {
        cli_call_error(prog, "put", c, rc);
        goto out;
    }
    printf("put %llu tokens x %u layers (%zu bytes of %s K+V) in %.3f ms: sequence now %llu tokens, "
           "%llu bytes stored, %llu streams encoded, %llu retries\n",
           (unsigned long long)a.tokens, a.num_layers, 2 * bytes, dq_dtype_name(a.dtype), ms,
           (unsigned long long)r.tokens, (unsigned long long)r.stored_bytes, (unsigned long long)r.streams_encoded,
           (unsigned long long)r.retries);
    status = CLI_OK;
out:
    dqc_free(c);
    free(k);
    free(v);
    free(seq.key);
    cli_conn_free(&cc);
    return status;
}

/* ================================ get ================================ */

static const char get_help[] =
    "NAME\n"
    "       dquant get - read K/V tokens of a sequence back from dquantd\n"
    "\n"
    "SYNOPSIS\n"
    "       dquant get (--key KEY | --key-hex HEX) [--layer L] [--layers N] [--start S]\n"
    "                  [--tokens T] [--dtype f32|f16|bf16] [--out-k FILE] [--out-v FILE]\n"
    "       dquant get (--key KEY | --key-hex HEX) --raw [--layer L] [--layers N] [--out PREFIX]\n"
    "\n"
    "DESCRIPTION\n"
    "       Decompressed form: tokens [S, S + T) of layers [L, L + N) as [N, T, KV_HEADS, HEAD_DIM]\n"
    "       of DTYPE. Prints the shape and the RMS and largest magnitude of K and V; --out-k and\n"
    "       --out-v write the raw little-endian tensors.\n"
    "       Raw form (--raw): the stored containers of whole layers. Prints per layer the tokens,\n"
    "       sealed windows and BF16 tail; --out PREFIX writes PREFIX.profile (serialized profile),\n"
    "       PREFIX.L<layer>.records (window records back to back) and PREFIX.L<layer>.tail_k /\n"
    "       .tail_v (BF16 tail), ready for libdquant's dq_profile_deserialize / dq_layer_restore.\n"
    "\n"
    "OPTIONS\n" SEQ_HELP "   --layer L, --layers N\n"
    "       First layer (default 0) and number of layers (default 0: every layer from L).\n"
    "   --start S, --tokens T\n"
    "       Token range (defaults 0 and 0: up to the end).\n"
    "   --dtype f32|f16|bf16\n"
    "       Element type of the returned tensors (default f32).\n"
    "   --out-k FILE, --out-v FILE\n"
    "       Write the keys / values.\n"
    "   --raw\n"
    "       Fetch the raw containers instead.\n"
    "   --out PREFIX\n"
    "       With --raw: write the profile, records and tails to files named from PREFIX.\n"
    "   --quiet\n"
    "       Print nothing on success.\n" CLI_CONN_HELP "\n" EXIT_HELP "\n"
    "EXAMPLES\n"
    "       dquant get --key req-1 --layer 0 --layers 1 --dtype bf16 --out-k k.bin --out-v v.bin\n"
    "       dquant get --key req-1 --raw --out /tmp/req1\n";

static void tensor_summary(const char *name, const void *data, dq_dtype dtype, size_t count)
{
    double ss = 0, mx = 0;
    float buf[1024];
    size_t es = dq_dtype_size(dtype);
    for (size_t i = 0; i < count; i += 1024) {
        size_t n = count - i < 1024 ? count - i : 1024;
        cli_to_f32((const uint8_t *)data + i * es, dtype, n, buf);
        for (size_t j = 0; j < n; j++) {
            ss += (double)buf[j] * buf[j];
            if (fabs(buf[j]) > mx)
                mx = fabs(buf[j]);
        }
    }
    printf("  %s: rms %.6g, max |x| %.6g\n", name, count ? sqrt(ss / (double)count) : 0.0, mx);
}

static int get_raw(dqc_client *c, const char *prog, const seq_arg *seq, uint32_t layer, uint32_t layers,
                   const char *prefix, int quiet)
{
    dqc_raw_result r = {0};
    dqc_seq s = seq_of(seq);
    int status = CLI_FAILED;
    int rc = dqc_get_raw(c, &s, layer, layers, &r);
    if (rc) {
        cli_call_error(prog, "get raw", c, rc);
        goto out;
    }
    if (!quiet)
        printf("profile %zu bytes, %zu layers\n", r.profile_len, r.nlayers);
    char path[4096];
    if (prefix) {
        snprintf(path, sizeof path, "%s.profile", prefix);
        if (cli_write_file(path, r.profile, r.profile_len))
            goto out;
    }
    for (size_t i = 0; i < r.nlayers; i++) {
        const dqc_raw_layer *l = &r.layers[i];
        if (!quiet)
            printf("  layer %u: %llu tokens = %llu windows (%zu record bytes) + %llu tail tokens\n", l->layer,
                   (unsigned long long)l->tokens, (unsigned long long)l->windows, l->records_bytes,
                   (unsigned long long)l->tail_tokens);
        if (!prefix)
            continue;
        snprintf(path, sizeof path, "%s.L%u.records", prefix, l->layer);
        if (cli_write_file(path, l->records, l->records_bytes))
            goto out;
        snprintf(path, sizeof path, "%s.L%u.tail_k", prefix, l->layer);
        if (cli_write_file(path, l->tail_k, l->tail_bytes))
            goto out;
        snprintf(path, sizeof path, "%s.L%u.tail_v", prefix, l->layer);
        if (cli_write_file(path, l->tail_v, l->tail_bytes))
            goto out;
    }
    status = CLI_OK;
out:
    dqc_raw_result_free(&r);
    return status;
}

int dq_cmd_get(int argc, char **argv)
{
    const char *prog = "get";
    cli_conn cc;
    cli_conn_init(&cc);
    seq_arg seq = {0};
    dqc_get_args a = {.dtype = DQ_DTYPE_F32};
    const char *outk = NULL, *outv = NULL, *prefix = NULL;
    int raw = 0, quiet = 0;
    dqc_client *c = NULL;
    dqc_get_result r = {0};
    const cli_opt opts[] = {
        SEQ_OPTS(&seq),
        CLI_U32("layer", &a.first_layer, 0),
        CLI_U32("layers", &a.num_layers, 0),
        CLI_U64("start", &a.start_token, 0),
        CLI_U64("tokens", &a.tokens, 0),
        CLI_DTYPE("dtype", &a.dtype),
        CLI_STR("out-k", &outk),
        CLI_STR("out-v", &outv),
        CLI_FLAG("raw", &raw),
        CLI_STR("out", &prefix),
        CLI_FLAG("quiet", &quiet),
        CLI_OPT_END,
    };
    int status = cli_parse(argc, argv, prog, get_help, opts, &cc);
    if (status != CLI_CONTINUE)
        goto out;
    EXIT_IF(!seq.set, CLI_USAGE, "--key or --key-hex is required");
    EXIT_IF(raw && (outk || outv), CLI_USAGE, "--raw writes with --out PREFIX, not --out-k/--out-v");
    EXIT_IF(!raw && prefix, CLI_USAGE, "--out PREFIX needs --raw (use --out-k/--out-v)");
    status = CLI_FAILED;
    if (cli_connect(&cc, prog, &c))
        goto out;
    if (raw) {
        status = get_raw(c, prog, &seq, a.first_layer, a.num_layers, prefix, quiet);
        goto out;
    }
    a.seq = seq_of(&seq);
    uint64_t t0 = cli_now_ns();
    int rc = dqc_get(c, &a, &r);
    double ms = 1e3 * cli_seconds_since(t0);
    if (rc) {
        cli_call_error(prog, "get", c, rc);
        goto out;
    }
    if (!quiet) {
        printf("tokens [%llu, %llu) of %u layers x %u kv heads x %u, %s, %zu bytes each of K and V, %.3f ms\n",
               (unsigned long long)r.start_token, (unsigned long long)(r.start_token + r.tokens), r.num_layers,
               r.kv_heads, r.head_dim, dq_dtype_name(r.dtype), r.bytes, ms);
        size_t count = r.bytes / dq_dtype_size(r.dtype);
        tensor_summary("k", r.k, r.dtype, count);
        tensor_summary("v", r.v, r.dtype, count);
    }
    if (outk && cli_write_file(outk, r.k, r.bytes))
        goto out;
    if (outv && cli_write_file(outv, r.v, r.bytes))
        goto out;
    status = CLI_OK;
out:
    dqc_get_result_free(&r);
    dqc_free(c);
    free(seq.key);
    cli_conn_free(&cc);
    return status;
}

/* ================================ attend ================================ */

static const char attend_help[] =
    "NAME\n"
    "       dquant attend - decode attention computed by dquantd on compressed KV\n"
    "\n"
    "SYNOPSIS\n"
    "       dquant attend (--key KEY | --key-hex HEX)... --layer L (--q FILE | --random SEED)\n"
    "                     [--q-heads Q] [--head-dim D] [--dtype f32|f16|bf16] [--scale S]\n"
    "                     [--append-k FILE --append-v FILE --kv-heads H] [--out FILE] [--lse FILE]\n"
    "\n"
    "DESCRIPTION\n"
    "       One batched ATTEND request with one item per --key (all in the --ns namespace, all at\n"
    "       layer L): softmax(scale q.K^T) V over every token of the layer, computed on the\n"
    "       containers. The query file holds [ITEMS, Q, D] values of DTYPE; with --append-k/-v\n"
    "       ([ITEMS, 1, H, D] each) every item's sequence first gets one more token. Prints each\n"
    "       item's output RMS and the log-sum-exp of its first heads; --out writes the f32 output\n"
    "       [ITEMS, Q, D] and --lse the f32 log-sum-exp [ITEMS, Q].\n"
    "\n"
    "OPTIONS\n" SEQ_HELP "       Repeat --key / --key-hex for a batch of items.\n"
    "   --layer L\n"
    "       Layer attended (default 0).\n"
    "   --q-heads Q, --head-dim D, --kv-heads H\n"
    "       Query heads (default 32), head size (default 128), KV heads for appends (default 8).\n"
    "   --dtype f32|f16|bf16\n"
    "       Element type of the query and appended files (default f32).\n"
    "   --q FILE | --random SEED\n"
    "       The queries, from a file or random normal.\n"
    "   --scale S\n"
    "       Logit scale (default 0: 1/sqrt(D)).\n"
    "   --append-k FILE, --append-v FILE\n"
    "       Append one token per item before attending (not retried after a broken connection).\n"
    "   --out FILE, --lse FILE\n"
    "       Write the outputs / log-sum-exps.\n"
    "   --quiet\n"
    "       Print nothing on success.\n" CLI_CONN_HELP "\n" EXIT_HELP "\n"
    "EXAMPLES\n"
    "       dquant attend --key req-1 --key req-2 --layer 3 --random 7\n";

#define MAX_ATTEND_KEYS 4096

/* The batch of an attend: one sequence per --key / --key-hex, in order. */
typedef struct key_list {
    seq_arg *keys; /* MAX_ATTEND_KEYS */
    size_t n;
} key_list;

static int key_list_add(key_list *l, int (*parse)(void *, const char *), const char *arg)
{
    if (l->n == MAX_ATTEND_KEYS) {
        cli_error(CLI_USAGE, "attend", "more than %d keys", MAX_ATTEND_KEYS);
        return -1;
    }
    return parse(&l->keys[l->n++], arg);
}

static int batch_key_text(void *dst, const char *arg)
{
    return key_list_add(dst, key_text, arg);
}

static int batch_key_hex(void *dst, const char *arg)
{
    return key_list_add(dst, key_hex, arg);
}

/* --scale: a logit scale, finite and >= 0. */
static int scale_arg(void *dst, const char *arg)
{
    double s;
    if (cli_double(arg, &s) || s < 0)
        return 1;
    *(float *)dst = (float)s;
    return 0;
}

int dq_cmd_attend(int argc, char **argv)
{
    const char *prog = "attend";
    cli_conn cc;
    cli_conn_init(&cc);
    key_list batch = {.keys = calloc(MAX_ATTEND_KEYS, sizeof(seq_arg))};
    const char *ns = NULL, *qfile = NULL, *akfile = NULL, *avfile = NULL, *outfile = NULL, *lsefile = NULL;
    uint32_t layer = 0;
    dqc_attend_args a = {.q_heads = 32, .kv_heads = 8, .head_dim = 128, .dtype = DQ_DTYPE_F32};
    uint64_t seed = 0;
    int have_seed = 0, quiet = 0;
    void *q = NULL, *ak = NULL, *av = NULL;
    float *out = NULL, *lse = NULL;
    dqc_attend_item *items = NULL;
    dqc_client *c = NULL;
    if (!batch.keys)
        return cli_error(CLI_FAILED, prog, "out of memory");
    const cli_opt opts[] = {
        CLI_STR("ns", &ns),
        CLI_FN("key", batch_key_text, &batch),
        CLI_FN("key-hex", batch_key_hex, &batch),
        CLI_U32("layer", &layer, 0),
        CLI_U32("q-heads", &a.q_heads, 1),
        CLI_U32("kv-heads", &a.kv_heads, 1),
        CLI_U32("head-dim", &a.head_dim, 1),
        CLI_DTYPE("dtype", &a.dtype),
        CLI_STR("q", &qfile),
        CLI_U64_GIVEN("random", &seed, &have_seed),
        CLI_FN("scale", scale_arg, &a.scale),
        CLI_STR("append-k", &akfile),
        CLI_STR("append-v", &avfile),
        CLI_STR("out", &outfile),
        CLI_STR("lse", &lsefile),
        CLI_FLAG("quiet", &quiet),
        CLI_OPT_END,
    };
    int status = cli_parse(argc, argv, prog, attend_help, opts, &cc);
    if (status != CLI_CONTINUE)
        goto out;
    EXIT_IF(!batch.n, CLI_USAGE, "at least one --key is required");
    EXIT_IF(have_seed == !!qfile, CLI_USAGE, "give either --q FILE or --random SEED");
    EXIT_IF(!akfile != !avfile, CLI_USAGE, "--append-k and --append-v go together");
    status = CLI_FAILED;
    size_t es = dq_dtype_size(a.dtype);
    size_t qcount = batch.n * a.q_heads * a.head_dim, acount = batch.n * a.kv_heads * a.head_dim;
    if (qfile) {
        if (cli_read_file(qfile, qcount * es, &q, NULL))
            goto out;
    } else {
        q = malloc(qcount * es);
        EXIT_IF(!q, CLI_FAILED, "out of memory");
        cli_fill_normal(q, a.dtype, qcount, &seed);
    }
    if (akfile && (cli_read_file(akfile, acount * es, &ak, NULL) || cli_read_file(avfile, acount * es, &av, NULL)))
        goto out;
    items = calloc(batch.n, sizeof *items);
    out = malloc(qcount * sizeof *out);
    lse = malloc(batch.n * a.q_heads * sizeof *lse);
    EXIT_IF(!items || !out || !lse, CLI_FAILED, "out of memory");
    for (size_t i = 0; i < batch.n; i++) {
        batch.keys[i].ns = ns;
        items[i].seq = seq_of(&batch.keys[i]);
        items[i].layer = layer;
        items[i].q = (const uint8_t *)q + i * a.q_heads * a.head_dim * es;
        if (ak) {
            items[i].append_k = (const uint8_t *)ak + i * a.kv_heads * a.head_dim * es;
            items[i].append_v = (const uint8_t *)av + i * a.kv_heads * a.head_dim * es;
        }
    }
    a.items = items;
    a.nitems = batch.n;
    if (cli_connect(&cc, prog, &c))
        goto out;
    uint64_t t0 = cli_now_ns();
    int rc = dqc_attend(c, &a, out, lse);
    double ms = 1e3 * cli_seconds_since(t0);
    if (rc) {
        cli_call_error(prog, "attend", c, rc);
        goto out;
    }
    if (!quiet) {
        printf("attend: %zu items x %u heads x %u at layer %u in %.3f ms\n", batch.n, a.q_heads, a.head_dim, layer, ms);
        for (size_t i = 0; i < batch.n; i++) {
            double ss = 0;
            const float *o = out + i * a.q_heads * a.head_dim;
            for (size_t j = 0; j < (size_t)a.q_heads * a.head_dim; j++)
                ss += (double)o[j] * o[j];
            printf("  item %zu: out rms %.6g, lse", i, sqrt(ss / ((double)a.q_heads * a.head_dim)));
            for (uint32_t h = 0; h < a.q_heads && h < 4; h++)
                printf(" %.6g", lse[i * a.q_heads + h]);
            printf("%s\n", a.q_heads > 4 ? " ..." : "");
        }
    }
    if (outfile && cli_write_file(outfile, out, qcount * sizeof *out))
        goto out;
    if (lsefile && cli_write_file(lsefile, lse, batch.n * a.q_heads * sizeof *lse))
        goto out;
    status = CLI_OK;
out:
    dqc_free(c);
    for (size_t i = 0; i < batch.n; i++)
        free(batch.keys[i].key);
    free(batch.keys);
    free(items);
    free(q);
    free(ak);
    free(av);
    free(out);
    free(lse);
    cli_conn_free(&cc);
    return status;
}

/* ============================ delete / pin / unpin ============================ */

static const char delete_help[] =
    "NAME\n"
    "       dquant delete - delete a sequence from dquantd\n"
    "\n"
    "SYNOPSIS\n"
    "       dquant delete (--key KEY | --key-hex HEX) [--ns NS]\n"
    "\n"
    "DESCRIPTION\n"
    "       Frees every layer of the sequence. Fails with NOT_FOUND when it does not exist.\n"
    "\n"
    "OPTIONS\n" SEQ_HELP CLI_CONN_HELP "\n" EXIT_HELP;

static const char pin_help[] =
    "NAME\n"
    "       dquant pin - protect a sequence from eviction\n"
    "\n"
    "SYNOPSIS\n"
    "       dquant pin (--key KEY | --key-hex HEX) [--ns NS]\n"
    "\n"
    "DESCRIPTION\n"
    "       A pinned sequence is never evicted to make room (a PUT that cannot fit without evicting\n"
    "       it fails with RESOURCE_EXHAUSTED instead). Undo with dquant unpin.\n"
    "\n"
    "OPTIONS\n" SEQ_HELP CLI_CONN_HELP "\n" EXIT_HELP;

static const char unpin_help[] = "NAME\n"
                                 "       dquant unpin - make a pinned sequence evictable again\n"
                                 "\n"
                                 "SYNOPSIS\n"
                                 "       dquant unpin (--key KEY | --key-hex HEX) [--ns NS]\n"
                                 "\n"
                                 "OPTIONS\n" SEQ_HELP CLI_CONN_HELP "\n" EXIT_HELP;

static int seq_command(int argc, char **argv, const char *prog, const char *help,
                       int (*fn)(dqc_client *, const dqc_seq *))
{
    cli_conn cc;
    cli_conn_init(&cc);
    seq_arg seq = {0};
    dqc_client *c = NULL;
    const cli_opt opts[] = {SEQ_OPTS(&seq), CLI_OPT_END};
    int status = cli_parse(argc, argv, prog, help, opts, &cc);
    if (status != CLI_CONTINUE)
        goto out;
    EXIT_IF(!seq.set, CLI_USAGE, "--key or --key-hex is required");
    status = CLI_FAILED;
    if (cli_connect(&cc, prog, &c))
        goto out;
    dqc_seq s = seq_of(&seq);
    int rc = fn(c, &s);
    if (rc) {
        cli_call_error(prog, prog, c, rc);
        goto out;
    }
    status = CLI_OK;
out:
    dqc_free(c);
    free(seq.key);
    cli_conn_free(&cc);
    return status;
}

int dq_cmd_delete(int argc, char **argv)
{
    return seq_command(argc, argv, "delete", delete_help, dqc_delete);
}

int dq_cmd_pin(int argc, char **argv)
{
    return seq_command(argc, argv, "pin", pin_help, dqc_pin);
}

int dq_cmd_unpin(int argc, char **argv)
{
    return seq_command(argc, argv, "unpin", unpin_help, dqc_unpin);
}

/* ================================ stats ================================ */

static const char stats_help[] =
    "NAME\n"
    "       dquant stats - print dquantd's counters and gauges\n"
    "\n"
    "SYNOPSIS\n"
    "       dquant stats [--counter NAME | --gauge NAME]\n"
    "\n"
    "DESCRIPTION\n"
    "       Prints every counter and gauge as \"NAME VALUE\", sorted by name, under a \"# counters\"\n"
    "       and a \"# gauges\" heading. With --counter or --gauge prints only that value (exit\n"
    "       status 1 if the daemon has no such name), for scripts.\n"
    "\n"
    "OPTIONS\n"
    "   --counter NAME, --gauge NAME\n"
    "       Print one value.\n" CLI_CONN_HELP "\n" EXIT_HELP "\n"
    "EXAMPLES\n"
    "       dquant stats --connect tcp://127.0.0.1:7733\n"
    "       dquant stats --gauge store_bytes\n";

int dq_cmd_stats(int argc, char **argv)
{
    const char *prog = "stats";
    cli_conn cc;
    cli_conn_init(&cc);
    const char *counter = NULL, *gauge = NULL;
    dqc_client *c = NULL;
    dqc_stats_result r = {0};
    const cli_opt opts[] = {
        CLI_STR("counter", &counter),
        CLI_STR("gauge", &gauge),
        CLI_OPT_END,
    };
    int status = cli_parse(argc, argv, prog, stats_help, opts, &cc);
    if (status != CLI_CONTINUE)
        goto out;
    EXIT_IF(counter && gauge, CLI_USAGE, "give --counter or --gauge, not both");
    status = CLI_FAILED;
    if (cli_connect(&cc, prog, &c))
        goto out;
    int rc = dqc_stats(c, &r);
    if (rc) {
        cli_call_error(prog, "stats", c, rc);
        goto out;
    }
    if (counter) {
        uint64_t v;
        EXIT_IF(dqc_stats_counter(&r, counter, &v), CLI_FAILED, "no counter named '%s'", counter);
        printf("%llu\n", (unsigned long long)v);
    } else if (gauge) {
        double v;
        EXIT_IF(dqc_stats_gauge(&r, gauge, &v), CLI_FAILED, "no gauge named '%s'", gauge);
        printf("%.17g\n", v);
    } else {
        printf("# counters\n");
        for (size_t i = 0; i < r.ncounters; i++)
            printf("%s %llu\n", r.counters[i].name, (unsigned long long)r.counters[i].value);
        printf("# gauges\n");
        for (size_t i = 0; i < r.ngauges; i++)
            printf("%s %.17g\n", r.gauges[i].name, r.gauges[i].value);
    }
    status = CLI_OK;
out:
    dqc_stats_result_free(&r);
    dqc_free(c);
    cli_conn_free(&cc);
    return status;
}

/* ================================ ping ================================ */

static const char ping_help[] =
    "NAME\n"
    "       dquant ping - check that dquantd answers, and how fast\n"
    "\n"
    "SYNOPSIS\n"
    "       dquant ping [--count N] [--size BYTES] [--interval MS] [--quiet]\n"
    "\n"
    "DESCRIPTION\n"
    "       Connects (HELLO), prints what the daemon announced (version, backend, limits,\n"
    "       profiles), then sends N PINGs carrying BYTES random bytes each, checks every echo and\n"
    "       prints each round trip and a min/avg/max summary.\n"
    "\n"
    "OPTIONS\n"
    "   --count N\n"
    "       Number of pings (default 1).\n"
    "   --size BYTES\n"
    "       Payload of each ping (default 0; K/M suffixes allowed).\n"
    "   --interval MS\n"
    "       Pause between pings (default 0).\n"
    "   --quiet\n"
    "       Print only the summary line.\n" CLI_CONN_HELP "\n" EXIT_HELP "\n"
    "EXAMPLES\n"
    "       dquant ping\n"
    "       dquant ping --connect tcp://127.0.0.1:7733 --count 5 --size 4K\n";

int dq_cmd_ping(int argc, char **argv)
{
    const char *prog = "ping";
    cli_conn cc;
    cli_conn_init(&cc);
    uint64_t count = 1, size = 0;
    uint32_t interval = 0;
    int quiet = 0;
    dqc_client *c = NULL;
    uint8_t *data = NULL;
    const cli_opt opts[] = {
        CLI_U64("count", &count, 1),
        CLI_SIZE("size", &size, 1ull << 30),
        CLI_U32("interval", &interval, 0),
        CLI_FLAG("quiet", &quiet),
        CLI_OPT_END,
    };
    int status = cli_parse(argc, argv, prog, ping_help, opts, &cc);
    if (status != CLI_CONTINUE)
        goto out;
    status = CLI_FAILED;
    data = malloc(size ? size : 1);
    EXIT_IF(!data, CLI_FAILED, "out of memory");
    uint64_t st = 42;
    for (uint64_t i = 0; i < size; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        data[i] = (uint8_t)(st >> 56);
    }
    if (cli_connect(&cc, prog, &c))
        goto out;
    if (!quiet) {
        dqc_server_info in;
        dqc_server(c, &in);
        printf("PING %s: dquantd %s, protocol %u, backend %s, max payload %llu, max batch %u, profiles", cc.addr,
               in.server_version, in.version, in.backend, (unsigned long long)in.max_payload_bytes, in.max_batch_items);
        for (size_t i = 0; i < in.nprofiles; i++)
            printf("%s%s", i ? "," : " ", in.profiles[i]);
        printf("\n");
    }
    double mn = 1e300, mx = 0, sum = 0;
    uint64_t ok = 0;
    for (uint64_t i = 0; i < count; i++) {
        if (i && interval) {
            struct timespec ts = {.tv_sec = interval / 1000, .tv_nsec = (long)(interval % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        uint64_t t0 = cli_now_ns();
        int rc = dqc_ping(c, data, size);
        double ms = 1e3 * cli_seconds_since(t0);
        if (rc) {
            cli_call_error(prog, "ping", c, rc);
            continue;
        }
        ok++;
        sum += ms;
        mn = ms < mn ? ms : mn;
        mx = ms > mx ? ms : mx;
        if (!quiet)
            printf("%llu bytes: seq=%llu time=%.3f ms\n", (unsigned long long)size, (unsigned long long)(i + 1), ms);
    }
    printf("%llu sent, %llu ok", (unsigned long long)count, (unsigned long long)ok);
    if (ok)
        printf(", rtt min/avg/max = %.3f/%.3f/%.3f ms", mn, sum / (double)ok, mx);
    printf("\n");
    status = ok == count ? CLI_OK : CLI_FAILED;
out:
    dqc_free(c);
    free(data);
    cli_conn_free(&cc);
    return status;
}

/* ================================ lookup ================================ */

static const char lookup_help[] =
    "NAME\n"
    "       dquant lookup - how much of a prompt's prefix the shared KV tier holds\n"
    "\n"
    "SYNOPSIS\n"
    "       dquant lookup --model NAME [--ns NS] [--chunk-tokens N] --tokens FILE\n"
    "\n"
    "DESCRIPTION\n"
    "       Reads the prompt's token ids (decimal, separated by blanks, commas or newlines) from\n"
    "       FILE (- for stdin), computes the keys of its full chunks (dqc_chunk_keys) and asks the\n"
    "       daemon how many leading chunks it holds. Prints \"HITS of CHUNKS chunks, TOKENS\n"
    "       tokens\".\n"
    "\n"
    "OPTIONS\n"
    "   --model NAME\n"
    "       The registered model whose chunks to look up.\n"
    "   --ns NS\n"
    "       The namespace (default: the default namespace).\n"
    "   --chunk-tokens N\n"
    "       The model's chunk size (default 256).\n"
    "   --tokens FILE\n"
    "       The prompt's token ids.\n" CLI_CONN_HELP "\n" EXIT_HELP "\n"
    "EXAMPLES\n"
    "       dquant lookup --model m --tokens prompt.txt\n";

/* Token ids from f into *out (malloc'd). 0, or -1 on a bad id or no memory. */
static int read_tokens(FILE *f, uint32_t **out, size_t *n)
{
    size_t cap = 1024, len = 0;
    uint32_t *t = malloc(cap * sizeof *t);
    unsigned long long v;
    int ch;
    while (t) {
        while ((ch = getc(f)) == ' ' || ch == ',' || ch == '\n' || ch == '\t' || ch == '\r')
            ;
        if (ch == EOF)
            break;
        ungetc(ch, f);
        if (fscanf(f, "%llu", &v) != 1 || v > UINT32_MAX) {
            free(t);
            return -1;
        }
        if (len == cap) {
            uint32_t *nt = realloc(t, (cap *= 2) * sizeof *t);
            if (!nt)
                free(t);
            t = nt;
            if (!t)
                break;
        }
        t[len++] = (uint32_t)v;
    }
    *out = t;
    *n = len;
    return t ? 0 : -1;
}

int dq_cmd_lookup(int argc, char **argv)
{
    const char *prog = "lookup";
    cli_conn cc;
    cli_conn_init(&cc);
    const char *model = NULL, *ns = NULL, *path = NULL;
    uint32_t chunk_tokens = 256;
    dqc_client *c = NULL;
    uint32_t *tok = NULL;
    uint8_t *keys = NULL;
    FILE *f = NULL;
    const cli_opt opts[] = {
        CLI_STR("model", &model), CLI_STR("ns", &ns), CLI_U32("chunk-tokens", &chunk_tokens, 1),
        CLI_STR("tokens", &path), CLI_OPT_END,
    };
    int status = cli_parse(argc, argv, prog, lookup_help, opts, &cc);
    if (status != CLI_CONTINUE)
        goto out;
    EXIT_IF(!model || !path, CLI_USAGE, "--model and --tokens are required");
    f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    EXIT_IF(!f, CLI_FAILED, "cannot open %s", path);
    size_t n = 0;
    EXIT_IF(read_tokens(f, &tok, &n) < 0, CLI_FAILED, "%s: not a list of token ids", path);
    const size_t nkeys = n / chunk_tokens;
    keys = malloc(nkeys ? nkeys * DQC_CHUNK_KEY_BYTES : 1);
    EXIT_IF(!keys, CLI_FAILED, "out of memory");
    dqc_chunk_keys(ns, tok, n, chunk_tokens, NULL, keys, nkeys);
    status = CLI_FAILED;
    if (cli_connect(&cc, prog, &c))
        goto out;
    dqc_lookup_result r;
    int rc = dqc_lookup(c, ns, model, keys, nkeys, 0, &r);
    if (rc) {
        cli_call_error(prog, "lookup", c, rc);
        goto out;
    }
    printf("%llu of %zu chunks, %llu tokens\n", (unsigned long long)r.hits, nkeys, (unsigned long long)r.hit_tokens);
    status = CLI_OK;
out:
    if (f && f != stdin)
        fclose(f);
    free(tok);
    free(keys);
    dqc_free(c);
    cli_conn_free(&cc);
    return status;
}
