/* dquant command-line tool: shared helpers (see cli_common.h). */
#include "cli_common.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    o.client_name = "dquant";
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

int cli_u64(const char *s, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
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
    if (!s || !isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
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
    *out = (uint64_t)v << shift;
    return 0;
}

int cli_dtype(const char *s, dq_dtype *out)
{
    static const struct {
        const char *name;
        dq_dtype d;
    } names[] = {
        {"f32", DQ_DTYPE_F32},  {"float32", DQ_DTYPE_F32},  {"fp32", DQ_DTYPE_F32}, {"f16", DQ_DTYPE_F16},
        {"float16", DQ_DTYPE_F16}, {"fp16", DQ_DTYPE_F16}, {"bf16", DQ_DTYPE_BF16}, {"bfloat16", DQ_DTYPE_BF16},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].d;
            return 0;
        }
    return -1;
}

const char *cli_dtype_name(dq_dtype d)
{
    switch (d) {
    case DQ_DTYPE_F32:
        return "f32";
    case DQ_DTYPE_F16:
        return "f16";
    case DQ_DTYPE_BF16:
        return "bf16";
    }
    return "?";
}

size_t cli_dtype_size(dq_dtype d)
{
    return d == DQ_DTYPE_F32 ? 4 : 2;
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

int cli_read_file(const char *path, size_t expect, void **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dquant: cannot open '%s': %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = expect != SIZE_MAX ? expect + 1 : 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fprintf(stderr, "dquant: out of memory reading '%s'\n", path);
            fclose(f);
            return -1;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        if (expect != SIZE_MAX)
            break;   /* one byte more than expected: too long */
        uint8_t *nb = realloc(buf, cap * 2);
        if (!nb)
            free(buf);
        buf = nb;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        fprintf(stderr, "dquant: error reading '%s'\n", path);
        free(buf);
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

static uint64_t next_u64(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s)
{
    return ((double)(next_u64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

void cli_fill_normal(void *dst, dq_dtype dtype, size_t count, uint64_t *state)
{
    for (size_t i = 0; i < count; i += 2) {
        /* Box–Muller: two draws per pair of uniforms. */
        double r = sqrt(-2.0 * log(uniform01(state))), t = 6.283185307179586 * uniform01(state);
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
