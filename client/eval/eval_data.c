/* Loading the KV and query arrays of an evaluation (eval_data.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"
#include "eval_data.h"

#define DEFAULT_DATA_DIR "../shared/data"

int eval_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

int eval_read_file(const char *path, void **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? DQ_NOT_FOUND : DQ_IO;
    int rc = DQ_IO;
    long sz = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        sz = ftell(f);
    if (sz >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        *buf = malloc((size_t)sz + 1);
        if (!*buf)
            rc = DQ_NOMEM;
        else if (fread(*buf, 1, (size_t)sz, f) == (size_t)sz) {
            *len = (size_t)sz;
            rc = DQ_OK;
        } else {
            free(*buf);
            *buf = NULL;
        }
    }
    fclose(f);
    return rc;
}

/* Reads path as exactly count values of dtype, converted to a new f32 array. */
static int load_array(const char *path, dq_dtype dtype, size_t count, float **out, char *err, size_t errlen)
{
    void *raw = NULL;
    size_t len = 0;
    int rc = eval_read_file(path, &raw, &len);
    if (rc != DQ_OK)
        return eval_fail(err, errlen, rc, "%s: %s", path, rc == DQ_NOT_FOUND ? "not found" : dq_strerror(rc));
    const size_t esz = dq_dtype_size(dtype);
    if (len != count * esz) {
        free(raw);
        return eval_fail(err, errlen, DQ_SHAPE, "%s: %zu bytes, expected %zu (%zu %s values)", path, len, count * esz,
                         count, dq_dtype_name(dtype));
    }
    *out = malloc(count * sizeof **out + 1);
    if (!*out) {
        free(raw);
        return eval_fail(err, errlen, DQ_NOMEM, "%s: out of memory", path);
    }
    dq_convert(raw, dtype, *out, DQ_DTYPE_F32, count);
    free(raw);
    return DQ_OK;
}

size_t eval_data_stream_len(const eval_data *d)
{
    return (size_t)d->kv_heads * d->head_dim;
}

const float *eval_data_slab(const eval_data *d, dq_kind kind, uint32_t seq, uint32_t layer)
{
    const size_t per = (size_t)d->tokens * eval_data_stream_len(d);
    return (kind == DQ_KIND_K ? d->k : d->v) + ((size_t)seq * d->layers + layer) * per;
}

void eval_data_free(eval_data *d)
{
    if (!d)
        return;
    free(d->k);
    free(d->v);
    free(d->q);
    memset(d, 0, sizeof *d);
}

/* Splits a file laid out [seqs][2 (K,V)][layers][tokens][n] into d->k and d->v. */
static int split_kv(const float *all, eval_data *d)
{
    const size_t per = (size_t)d->layers * d->tokens * eval_data_stream_len(d);
    d->k = malloc((size_t)d->seqs * per * sizeof *d->k);
    d->v = malloc((size_t)d->seqs * per * sizeof *d->v);
    if (!d->k || !d->v)
        return DQ_NOMEM;
    for (uint32_t s = 0; s < d->seqs; s++) {
        memcpy(d->k + s * per, all + (2 * (size_t)s) * per, per * sizeof *d->k);
        memcpy(d->v + s * per, all + (2 * (size_t)s + 1) * per, per * sizeof *d->v);
    }
    return DQ_OK;
}

typedef struct named_layout {
    const char *name, *kv_file, *q_file;
    uint32_t seqs, layers, tokens, kv_heads, head_dim, q_heads;
} named_layout;

static const named_layout g_layouts[] = {
    {"bytellama-n1024", "bytellama-n1024/kv_f16.bin", "bytellama-n1024/q_f16.bin", 1, 4, 512, 8, 128, 16},
    {"bytellama-19m", "bytellama-19m/kv_f16.bin", "bytellama-19m/q_f16.bin", 2, 6, 1024, 2, 128, 4},
    {"tinystories-656k", "tinystories-656k/kv/kv_f16.bin", "tinystories-656k/kv/q_f16.bin", 1, 2, 495, 4, 16, 8},
};

int eval_data_load_named(const char *name, const char *dir, eval_data *d, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    const named_layout *l = NULL;
    for (size_t i = 0; i < sizeof g_layouts / sizeof g_layouts[0]; i++)
        if (name && strcmp(name, g_layouts[i].name) == 0)
            l = &g_layouts[i];
    if (!l)
        return eval_fail(err, errlen, DQ_NOT_FOUND,
                         "unknown dataset '%s' (bytellama-n1024, bytellama-19m, tinystories-656k)", name ? name : "");
    snprintf(d->name, sizeof d->name, "%s", l->name);
    d->seqs = l->seqs;
    d->layers = l->layers;
    d->tokens = l->tokens;
    d->kv_heads = l->kv_heads;
    d->head_dim = l->head_dim;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : DEFAULT_DATA_DIR, l->kv_file);
    const size_t n = eval_data_stream_len(d), per = (size_t)l->layers * l->tokens * n;
    float *all = NULL;
    int rc = load_array(path, DQ_DTYPE_F16, 2 * (size_t)l->seqs * per, &all, err, errlen);
    if (rc != DQ_OK)
        return rc;
    rc = split_kv(all, d);
    free(all);
    if (rc != DQ_OK) {
        eval_data_free(d);
        return eval_fail(err, errlen, rc, "%s: out of memory", path);
    }
    snprintf(path, sizeof path, "%s/%s", dir ? dir : DEFAULT_DATA_DIR, l->q_file);
    rc = load_array(path, DQ_DTYPE_F16, (size_t)l->layers * l->tokens * l->q_heads * l->head_dim, &d->q, err, errlen);
    if (rc == DQ_OK)
        d->q_heads = l->q_heads;
    else if (rc != DQ_NOT_FOUND) {
        eval_data_free(d);
        return rc;
    }
    if (err && errlen)
        err[0] = 0;
    return DQ_OK;
}

int eval_data_load_files(const char *k, const char *v, const char *q, uint32_t kv_heads, uint32_t head_dim,
                         uint32_t q_heads, dq_dtype dtype, eval_data *d, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    const size_t esz = dq_dtype_size(dtype), n = (size_t)kv_heads * head_dim;
    if (!k || !v || !kv_heads || !head_dim || !esz)
        return eval_fail(err, errlen, DQ_INVALID_ARGUMENT, "need --k, --v, --kv-heads, --head-dim and --dtype");
    if (q && (!q_heads || q_heads % kv_heads))
        return eval_fail(err, errlen, DQ_SHAPE, "--q-heads must be a positive multiple of --kv-heads (%u)", kv_heads);
    /* the token count comes from the key file's size */
    FILE *f = fopen(k, "rb");
    if (!f)
        return eval_fail(err, errlen, errno == ENOENT ? DQ_NOT_FOUND : DQ_IO, "%s: %s", k, strerror(errno));
    long sz = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    fclose(f);
    if (sz <= 0 || (size_t)sz % (n * esz))
        return eval_fail(err, errlen, DQ_SHAPE, "%s: %ld bytes is not a whole number of [%u, %u] %s tokens", k, sz,
                         kv_heads, head_dim, dq_dtype_name(dtype));
    snprintf(d->name, sizeof d->name, "%s", k);
    d->seqs = d->layers = 1;
    d->tokens = (uint32_t)((size_t)sz / (n * esz));
    d->kv_heads = kv_heads;
    d->head_dim = head_dim;
    int rc = load_array(k, dtype, d->tokens * n, &d->k, err, errlen);
    if (rc == DQ_OK)
        rc = load_array(v, dtype, d->tokens * n, &d->v, err, errlen);
    if (rc == DQ_OK && q) {
        rc = load_array(q, dtype, (size_t)d->tokens * q_heads * head_dim, &d->q, err, errlen);
        d->q_heads = q_heads;
    }
    if (rc != DQ_OK)
        eval_data_free(d);
    return rc;
}
