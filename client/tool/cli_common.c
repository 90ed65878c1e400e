/* dquant command-line tool: shared helpers (see cli_common.h). */
#include "cli_common.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eval_rng.h"
#include "dquant/types.h"

void cli_conn_init(cli_conn *cc)
{
    memset(cc, 0, sizeof *cc);
    const char *env = getenv("DQUANT_CONNECT");
    cc->addr = env && *env ? env : DQC_DEFAULT_ADDR;
    const char *sec = getenv("DQUANT_SECRET");
    if (sec && *sec) {
        cc->secret = strdup(sec);
        cc->secret_len = cc->secret ? strlen(sec) : 0;
    }
}

void cli_conn_free(cli_conn *cc)
{
    if (cc->secret) {
        explicit_bzero(cc->secret, cc->secret_len);
        free(cc->secret);
    }
    cc->secret = NULL;
    cc->secret_len = 0;
}

static int set_secret(cli_conn *cc, const char *s, size_t n)
{
    char *copy = malloc(n + 1);
    if (!copy)
        return -1;
    memcpy(copy, s, n);
    copy[n] = 0;
    cli_conn_free(cc);
    cc->secret = copy;
    cc->secret_len = n;
    return 0;
}

int cli_conn_option(cli_conn *cc, int opt, const char *arg, int *rc)
{
    *rc = 0;
    switch (opt) {
    case CLI_OPT_CONNECT:
        cc->addr = arg;
        return 1;
    case CLI_OPT_SECRET:
        if (set_secret(cc, arg, strlen(arg)))
            *rc = -1;
        return 1;
    case CLI_OPT_SECRET_FILE: {
        void *data = NULL;
        size_t len = 0;
        if (cli_read_file(arg, SIZE_MAX, &data, &len)) {
            *rc = -1;
            return 1;
        }
        /* One trailing newline is not part of the secret (as dquantd --secret-file reads it). */
        if (len && ((char *)data)[len - 1] == '\n')
            len--;
        if (set_secret(cc, data, len))
            *rc = -1;
        free(data);
        return 1;
    }
    case CLI_OPT_CLIENT_NAME:
        cc->client_name = arg;
        return 1;
    case CLI_OPT_TIMEOUT: {
        uint32_t ms;
        if (cli_u32(arg, &ms) || ms == 0 || ms > 86400000u) {
            fprintf(stderr, "dquant: --timeout: expected milliseconds, got '%s'\n", arg);
            *rc = -1;
        } else {
            cc->timeout_ms = (int)ms;
        }
        return 1;
    }
    default:
        return 0;
    }
}

int cli_connect(const cli_conn *cc, const char *prog, dqc_client **out)
{
    dqc_options o;
    dqc_options_default(&o);
    o.client_name = cc->client_name ? cc->client_name : "dquant";
    if (cc->timeout_ms) {
        o.connect_timeout_ms = cc->timeout_ms;
        o.io_timeout_ms = cc->timeout_ms;
    }
    o.secret = cc->secret;
    o.secret_len = cc->secret_len;
    char err[512];
    int rc = dqc_connect_ex(cc->addr, &o, out, err, sizeof err);
    if (rc)
        fprintf(stderr, "dquant %s: cannot connect to %s: %s: %s\n", prog, cc->addr, dqc_err_name(rc), err);
    return rc;
}

/* ---- option tables ---- */

/* Stores one option's value: 0, 1 when the value is not valid for it, -1 when o->fn said why. */
static int opt_store(const cli_opt *o, const char *value)
{
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    int bad = 0;
    switch (o->arg) {
    case CLI_ARG_FLAG:
        *(int *)o->dst = 1;
        break;
    case CLI_ARG_STR:
        *(const char **)o->dst = value;
        break;
    case CLI_ARG_U32:
        bad = cli_u32(value, &u32) || u32 < o->min || u32 > o->max;
        if (!bad)
            *(uint32_t *)o->dst = u32;
        break;
    case CLI_ARG_U64:
    case CLI_ARG_SIZE:
        bad = (o->arg == CLI_ARG_U64 ? cli_u64(value, &u64) : cli_size(value, &u64)) || u64 < o->min || u64 > o->max;
        if (!bad)
            *(uint64_t *)o->dst = u64;
        break;
    case CLI_ARG_DTYPE:
        bad = dq_dtype_parse(value, o->dst) != DQ_OK;
        break;
    case CLI_ARG_FN:
        bad = o->fn(o->dst, value);
        if (bad < 0)
            return -1;
        break;
    }
    if (!bad && o->given)
        *o->given = 1;
    return bad ? 1 : 0;
}

/* A bad value, in the words of the daemon subcommands or of the in-process ones. */
static int bad_value(const cli_opt *o, const char *value, const char *prog, int daemon)
{
    if (daemon)
        return cli_error(CLI_USAGE, prog, "--%s: bad value '%s' (see --help)", o->name, value);
    if (o->arg == CLI_ARG_DTYPE)
        return cli_error(CLI_USAGE, prog, "bad --%s '%s' (f32, f16, bf16)", o->name, value);
    if (o->min > 1)
        return cli_error(CLI_USAGE, prog, "bad --%s '%s' (at least %llu)", o->name, value, (unsigned long long)o->min);
    return cli_error(CLI_USAGE, prog, "bad --%s '%s'", o->name, value);
}

/* cli_parse (cc set) and cli_parse_local (cc NULL). */
static int parse(int argc, char **argv, const char *prog, const char *help, const cli_opt *opts, cli_conn *cc)
{
    /* getopt's table: the connection options and --help, then the subcommand's in their order (the
     * order of getopt's list of candidates for an ambiguous abbreviation); opts[i] is answered as
     * CLI_OPT_FIRST_OWN + i. */
    static const struct option conn_opts[] = {CLI_CONN_LONGOPTS};
    static const struct option help_opt[] = {{"help", no_argument, NULL, CLI_OPT_HELP}};
    const struct option *fixed = cc ? conn_opts : help_opt;
    const size_t nfixed = cc ? sizeof conn_opts / sizeof conn_opts[0] : 1;
    size_t n = 0;
    while (opts[n].name)
        n++;
    struct option *longopts = calloc(nfixed + n + 1, sizeof *longopts);
    if (!longopts)
        return cli_error(CLI_FAILED, prog, "out of memory");
    memcpy(longopts, fixed, nfixed * sizeof *fixed);
    for (size_t i = 0; i < n; i++)
        longopts[nfixed + i] = (struct option){opts[i].name,
                                               opts[i].arg == CLI_ARG_FLAG ? no_argument : required_argument, NULL,
                                               CLI_OPT_FIRST_OWN + (int)i};
    int status = CLI_CONTINUE, opt;
    optind = 1;
    opterr = cc != NULL; /* the in-process subcommands word their own complaint */
    while (status == CLI_CONTINUE && (opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        int rc;
        if (opt >= CLI_OPT_FIRST_OWN && opt < CLI_OPT_FIRST_OWN + (int)n) {
            const cli_opt *o = &opts[opt - CLI_OPT_FIRST_OWN];
            rc = opt_store(o, optarg);
            if (rc)
                status = rc > 0 ? bad_value(o, optarg, prog, cc != NULL) : CLI_USAGE;
        } else if (cc && cli_conn_option(cc, opt, optarg, &rc)) {
            if (rc)
                status = CLI_USAGE;
        } else if (opt == CLI_OPT_HELP) {
            fputs(help, stdout);
            status = CLI_OK;
        } else if (cc) {
            status = CLI_USAGE; /* getopt already printed the complaint */
        } else {
            status = cli_error(CLI_USAGE, prog, "unknown or incomplete option '%s' (see dquant %s --help)",
                               argv[optind - 1], prog);
        }
    }
    if (status == CLI_CONTINUE && cc && optind < argc)
        status = cli_error(CLI_USAGE, prog, "unexpected argument '%s'", argv[optind]);
    free(longopts);
    return status;
}

int cli_parse(int argc, char **argv, const char *prog, const char *help, const cli_opt *opts, cli_conn *cc)
{
    return parse(argc, argv, prog, help, opts, cc);
}

int cli_parse_local(int argc, char **argv, const char *prog, const char *help, const cli_opt *opts)
{
    return parse(argc, argv, prog, help, opts, NULL);
}

int cli_error(int status, const char *prog, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "dquant %s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return status;
}

int cli_call_error(const char *prog, const char *what, dqc_client *c, int rc)
{
    const char *msg = c ? dqc_last_error(c) : "";
    fprintf(stderr, "dquant %s: %s failed: %s\n", prog, what, msg && *msg ? msg : dqc_strerror(rc));
    return CLI_FAILED;
}

/* ---- numbers ---- */

/* The decimal number s starts with (a digit first: no blank, sign or base prefix); *end is what
 * follows it. 0, or -1 when s does not start with a digit or the number overflows. */
static int leading_u64(const char *s, uint64_t *out, const char **end)
{
    if (!s || !isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    char *e;
    unsigned long long v = strtoull(s, &e, 10);
    if (errno)
        return -1;
    *out = v;
    *end = e;
    return 0;
}

int cli_u64(const char *s, uint64_t *out)
{
    uint64_t v;
    const char *end;
    if (leading_u64(s, &v, &end) || *end)
        return -1;
    *out = v;
    return 0;
}

int cli_u32(const char *s, uint32_t *out)
{
    uint64_t v;
    if (cli_u64(s, &v) || v > UINT32_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int cli_double(const char *s, double *out)
{
    if (!s || !*s)
        return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int cli_size(const char *s, uint64_t *out)
{
    uint64_t v;
    const char *end;
    if (leading_u64(s, &v, &end))
        return -1;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K':
        shift = 10;
        break;
    case 'M':
        shift = 20;
        break;
    case 'G':
        shift = 30;
        break;
    case 'T':
        shift = 40;
        break;
    case 0:
        break;
    default:
        return -1;
    }
    if (shift) {
        end++;
        if (*end == 'i')
            end++;
        if (*end == 'B')
            end++;
    }
    if (*end || (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = v << shift;
    return 0;
}

int cli_hex_decode(const char *hex, uint8_t **out, size_t *len)
{
    size_t n = strlen(hex);
    if (n % 2)
        return -1;
    uint8_t *b = malloc(n / 2 + 1);
    if (!b)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = isxdigit((unsigned char)hex[2 * i]), lo = isxdigit((unsigned char)hex[2 * i + 1]);
        if (!hi || !lo) {
            free(b);
            return -1;
        }
        char pair[3] = {hex[2 * i], hex[2 * i + 1], 0};
        b[i] = (uint8_t)strtoul(pair, NULL, 16);
    }
    *out = b;
    *len = n / 2;
    return 0;
}

/* ---- files ---- */

/* Reads f to its end into a new buffer, or, when max is not SIZE_MAX, stops once more than max
 * bytes have come (then *len is max + 1). The buffer has a spare byte after the data (*len < its
 * size) unless the read stopped early. 0, -ENOMEM or -EIO. */
static int read_stream(FILE *f, size_t max, uint8_t **out, size_t *len)
{
    size_t cap = max != SIZE_MAX ? max + 1 : 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf)
            return -ENOMEM;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap || max != SIZE_MAX)
            break;
        uint8_t *nb = realloc(buf, cap * 2);
        if (!nb)
            free(buf);
        buf = nb;
        cap *= 2;
    }
    if (ferror(f)) {
        free(buf);
        return -EIO;
    }
    *out = buf;
    *len = n;
    return 0;
}

int cli_read_file(const char *path, size_t expect, void **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dquant: cannot open '%s': %s\n", path, strerror(errno));
        return -1;
    }
    uint8_t *buf;
    size_t n;
    int rc = read_stream(f, expect, &buf, &n);
    fclose(f);
    if (rc) {
        if (rc == -ENOMEM)
            fprintf(stderr, "dquant: out of memory reading '%s'\n", path);
        else
            fprintf(stderr, "dquant: error reading '%s'\n", path);
        return -1;
    }
    if (expect != SIZE_MAX && n != expect) {
        fprintf(stderr, "dquant: '%s' holds %s%zu bytes, expected %zu\n", path, n > expect ? "more than " : "",
                n > expect ? expect : n, expect);
        free(buf);
        return -1;
    }
    *out = buf;
    if (len)
        *len = n;
    return 0;
}

int cli_slurp(const char *path, void **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    uint8_t *b;
    int rc = read_stream(f, SIZE_MAX, &b, len);
    fclose(f);
    if (rc == 0)
        *buf = b;
    return rc;
}

int cli_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "dquant: cannot create '%s': %s\n", path, strerror(errno));
        return -1;
    }
    size_t w = len ? fwrite(data, 1, len, f) : 0;
    if (fclose(f) != 0 || w != len) {
        fprintf(stderr, "dquant: error writing '%s'\n", path);
        return -1;
    }
    return 0;
}

/* ---- tensors ---- */

void cli_fill_normal(void *dst, dq_dtype dtype, size_t count, uint64_t *state)
{
    for (size_t i = 0; i < count; i += 2) {
        /* Box–Muller: two draws per pair of uniforms. */
        double r = sqrt(-2.0 * log(rng_unit_open(rng_splitmix64(state))));
        double t = 6.283185307179586 * rng_unit_open(rng_splitmix64(state));
        float v[2] = {(float)(r * cos(t)), (float)(r * sin(t))};
        for (size_t j = 0; j < 2 && i + j < count; j++) {
            switch (dtype) {
            case DQ_DTYPE_F32:
                ((float *)dst)[i + j] = v[j];
                break;
            case DQ_DTYPE_F16:
                ((uint16_t *)dst)[i + j] = dq_f32_to_f16(v[j]);
                break;
            case DQ_DTYPE_BF16:
                ((uint16_t *)dst)[i + j] = dq_f32_to_bf16(v[j]);
                break;
            }
        }
    }
}

void cli_to_f32(const void *src, dq_dtype dtype, size_t count, float *dst)
{
    dq_convert(src, dtype, dst, DQ_DTYPE_F32, count);
}

uint64_t cli_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double cli_seconds_since(uint64_t t0_ns)
{
    return (double)(cli_now_ns() - t0_ns) / 1e9;
}
