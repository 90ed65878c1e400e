/* The float32 Llama forward of dquant eval (eval_model.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"
#include "dquant/types.h"
#include "dquant/vskip.h"
#include "eval_data.h"
#include "eval_json.h"
#include "eval_model.h"

typedef struct model_layer {
    float *ln1, *ln2, *wq, *wk, *wv, *wo, *wg, *wu, *wd;
} model_layer;

struct eval_model {
    eval_model_config cfg;
    float *embed, *lm_head, *norm; /* lm_head == embed when tied */
    model_layer *layer;
    float *inv_freq; /* [head_dim / 2] */
    uint64_t params;
};

const eval_model_config *eval_model_cfg(const eval_model *m)
{
    return &m->cfg;
}

uint64_t eval_model_params(const eval_model *m)
{
    return m->params;
}

void eval_model_free(eval_model *m)
{
    if (!m)
        return;
    if (m->lm_head != m->embed)
        free(m->lm_head);
    free(m->embed);
    free(m->norm);
    if (m->layer)
        for (uint32_t l = 0; l < m->cfg.layers; l++) {
            model_layer *L = &m->layer[l];
            float *all[] = {L->ln1, L->ln2, L->wq, L->wk, L->wv, L->wo, L->wg, L->wu, L->wd};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                free(all[i]);
        }
    free(m->layer);
    free(m->inv_freq);
    free(m);
}

/* ---- config.json ---- */

static int cfg_u32(const eval_json *j, const char *key, uint32_t *out, int required, char *err, size_t errlen)
{
    uint64_t v;
    if (eval_json_u64(j, key, &v) != 0) {
        if (!required && !eval_json_get(j, key))
            return DQ_OK;
        return eval_fail(err, errlen, DQ_CORRUPT, "config.json: '%s' missing or not a non-negative integer", key);
    }
    if (v == 0 || v > (1u << 24))
        return eval_fail(err, errlen, DQ_UNSUPPORTED, "config.json: '%s' = %llu out of range", key,
                         (unsigned long long)v);
    *out = (uint32_t)v;
    return DQ_OK;
}

static int cfg_float(const eval_json *j, const char *key, float *out, char *err, size_t errlen)
{
    const eval_json *v = eval_json_get(j, key);
    if (!v || v->type != EVAL_JSON_NUMBER || !(v->number > 0))
        return eval_fail(err, errlen, DQ_CORRUPT, "config.json: '%s' missing or not a positive number", key);
    *out = (float)v->number;
    return DQ_OK;
}

static int parse_config(const char *dir, eval_model_config *c, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    void *text = NULL;
    size_t len = 0;
    int rc = eval_read_file(path, &text, &len);
    if (rc != DQ_OK)
        return eval_fail(err, errlen, rc, "%s: %s", path, rc == DQ_NOT_FOUND ? "not found" : dq_strerror(rc));
    eval_json *j = NULL;
    char jerr[256];
    rc = eval_json_parse(text, len, &j, jerr, sizeof jerr);
    free(text);
    if (rc != DQ_OK)
        return eval_fail(err, errlen, rc, "%s: %s", path, jerr);
    memset(c, 0, sizeof *c);
    c->max_positions = 1u << 20;
    if (j->type != EVAL_JSON_OBJECT)
        rc = eval_fail(err, errlen, DQ_CORRUPT, "%s: not a JSON object", path);
    if (rc == DQ_OK)
        rc = cfg_u32(j, "num_hidden_layers", &c->layers, 1, err, errlen);
    if (rc == DQ_OK)
        rc = cfg_u32(j, "hidden_size", &c->hidden, 1, err, errlen);
    if (rc == DQ_OK)
        rc = cfg_u32(j, "intermediate_size", &c->intermediate, 1, err, errlen);
    if (rc == DQ_OK)
        rc = cfg_u32(j, "num_attention_heads", &c->heads, 1, err, errlen);
    if (rc == DQ_OK) {
        c->kv_heads = c->heads;
        rc = cfg_u32(j, "num_key_value_heads", &c->kv_heads, 0, err, errlen);
    }
    if (rc == DQ_OK)
        rc = cfg_u32(j, "vocab_size", &c->vocab, 1, err, errlen);
    if (rc == DQ_OK)
        rc = cfg_u32(j, "max_position_embeddings", &c->max_positions, 0, err, errlen);
    if (rc == DQ_OK) {
        c->head_dim = c->hidden / c->heads;
        const eval_json *hd = eval_json_get(j, "head_dim");
        if (hd && hd->type != EVAL_JSON_NULL)
            rc = cfg_u32(j, "head_dim", &c->head_dim, 1, err, errlen);
    }
    if (rc == DQ_OK)
        rc = cfg_float(j, "rms_norm_eps", &c->rms_eps, err, errlen);
    if (rc == DQ_OK) {
        /* transformers >= 5 nests the RoPE settings; older configs keep rope_theta at the top */
        const eval_json *rp = eval_json_get(j, "rope_parameters");
        const eval_json *scaling = eval_json_get(j, "rope_scaling");
        const eval_json *type = rp ? eval_json_get(rp, "rope_type") : NULL;
        if (scaling && scaling->type != EVAL_JSON_NULL)
            rc = eval_fail(err, errlen, DQ_UNSUPPORTED, "config.json: rope_scaling is not implemented");
        else if (type && (type->type != EVAL_JSON_STRING || strcmp(type->str, "default") != 0))
            rc = eval_fail(err, errlen, DQ_UNSUPPORTED, "config.json: only rope_type 'default' is implemented");
        else
            rc = cfg_float(rp && eval_json_get(rp, "rope_theta") ? rp : j, "rope_theta", &c->rope_theta, err, errlen);
    }
    if (rc == DQ_OK) {
        const eval_json *tie = eval_json_get(j, "tie_word_embeddings");
        c->tied = tie && tie->type == EVAL_JSON_BOOL ? tie->boolean : 1; /* transformers' default */
        const eval_json *dt = eval_json_get(j, "dtype");
        if (!dt || dt->type != EVAL_JSON_STRING)
            dt = eval_json_get(j, "torch_dtype");
        c->rope_bf16 = dt && dt->type == EVAL_JSON_STRING && strcmp(dt->str, "bfloat16") == 0;
        const eval_json *act = eval_json_get(j, "hidden_act");
        const eval_json *ab = eval_json_get(j, "attention_bias"), *mb = eval_json_get(j, "mlp_bias");
        if (act && (act->type != EVAL_JSON_STRING || strcmp(act->str, "silu") != 0))
            rc = eval_fail(err, errlen, DQ_UNSUPPORTED, "config.json: only hidden_act 'silu' is implemented");
        else if ((ab && ab->type == EVAL_JSON_BOOL && ab->boolean) || (mb && mb->type == EVAL_JSON_BOOL && mb->boolean))
            rc = eval_fail(err, errlen, DQ_UNSUPPORTED, "config.json: attention/MLP biases are not implemented");
        else if (c->heads % c->kv_heads || c->head_dim % 2)
            rc = eval_fail(err, errlen, DQ_UNSUPPORTED,
                           "config.json: heads %u not a multiple of kv heads %u, or odd "
                           "head_dim %u",
                           c->heads, c->kv_heads, c->head_dim);
    }
    eval_json_free(j);
    return rc;
}

/* ---- model.safetensors ---- */

typedef struct st_file {
    const uint8_t *data; /* the tensor data section */
    size_t data_len;
    eval_json *header;
} st_file;

/* Converts the tensor name, which must be of shape {rows, cols} (cols 0: a vector of rows), into a
 * new float32 array. DQ_NOT_FOUND when absent (quietly: the caller decides). */
static int st_tensor(const st_file *f, const char *name, uint32_t rows, uint32_t cols, float **out, char *err,
                     size_t errlen)
{
    const eval_json *t = eval_json_get(f->header, name);
    if (!t)
        return DQ_NOT_FOUND;
    const eval_json *dt = eval_json_get(t, "dtype"), *shape = eval_json_get(t, "shape"),
                    *off = eval_json_get(t, "data_offsets");
    if (!dt || dt->type != EVAL_JSON_STRING || !shape || shape->type != EVAL_JSON_ARRAY || !off ||
        off->type != EVAL_JSON_ARRAY || off->len != 2)
        return eval_fail(err, errlen, DQ_CORRUPT, "safetensors: tensor '%s' lacks dtype, shape or data_offsets", name);
    dq_dtype dtype;
    if (strcmp(dt->str, "BF16") == 0)
        dtype = DQ_DTYPE_BF16;
    else if (strcmp(dt->str, "F16") == 0)
        dtype = DQ_DTYPE_F16;
    else if (strcmp(dt->str, "F32") == 0)
        dtype = DQ_DTYPE_F32;
    else
        return eval_fail(err, errlen, DQ_DTYPE, "safetensors: tensor '%s' has dtype %s (BF16, F16, F32 supported)",
                         name, dt->str);
    const uint32_t want[2] = {rows, cols};
    const size_t dims = cols ? 2 : 1;
    if (shape->len != dims)
        return eval_fail(err, errlen, DQ_SHAPE, "safetensors: tensor '%s' has %zu dimensions, expected %zu", name,
                         shape->len, dims);
    for (size_t i = 0; i < dims; i++) {
        const eval_json *s = shape->items[i];
        if (s->type != EVAL_JSON_NUMBER || s->number != (double)want[i])
            return eval_fail(err, errlen, DQ_SHAPE, "safetensors: tensor '%s' dimension %zu is not %u", name, i,
                             want[i]);
    }
    double b = off->items[0]->type == EVAL_JSON_NUMBER ? off->items[0]->number : -1;
    double e = off->items[1]->type == EVAL_JSON_NUMBER ? off->items[1]->number : -1;
    const size_t count = (size_t)rows * (cols ? cols : 1), bytes = count * dq_dtype_size(dtype);
    if (b < 0 || e < b || b != floor(b) || e != floor(e) || e > (double)f->data_len || (size_t)(e - b) != bytes)
        return eval_fail(err, errlen, DQ_CORRUPT,
                         "safetensors: tensor '%s' data_offsets [%.0f, %.0f] do not hold %zu bytes within the %zu-byte "
                         "data section",
                         name, b, e, bytes, f->data_len);
    *out = malloc(count * sizeof **out);
    if (!*out)
        return eval_fail(err, errlen, DQ_NOMEM, "out of memory for '%s'", name);
    dq_convert(f->data + (size_t)b, dtype, *out, DQ_DTYPE_F32, count);
    return DQ_OK;
}

static int need(const st_file *f, const char *name, uint32_t rows, uint32_t cols, float **out, char *err, size_t errlen)
{
    int rc = st_tensor(f, name, rows, cols, out, err, errlen);
    if (rc == DQ_NOT_FOUND)
        return eval_fail(err, errlen, DQ_SHAPE, "safetensors: tensor '%s' missing", name);
    return rc;
}

static int load_weights(eval_model *m, const st_file *f, char *err, size_t errlen)
{
    const eval_model_config *c = &m->cfg;
    const uint32_t qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim;
    int rc = st_tensor(f, "model.embed_tokens.weight", c->vocab, c->hidden, &m->embed, err, errlen);
    if (rc != DQ_OK && rc != DQ_NOT_FOUND)
        return rc;
    int rc2 = st_tensor(f, "lm_head.weight", c->vocab, c->hidden, &m->lm_head, err, errlen);
    if (rc2 != DQ_OK && rc2 != DQ_NOT_FOUND)
        return rc2;
    /* a tied model may store either name (tinystories-656k keeps lm_head only) */
    if (c->tied) {
        if (m->embed && m->lm_head) {
            free(m->lm_head);
            m->lm_head = NULL;
        }
        if (!m->embed)
            m->embed = m->lm_head;
        m->lm_head = m->embed;
    }
    if (!m->embed || !m->lm_head)
        return eval_fail(err, errlen, DQ_SHAPE, "safetensors: %s missing",
                         !m->embed ? "model.embed_tokens.weight" : "lm_head.weight");
    m->params = (uint64_t)c->vocab * c->hidden * (c->tied ? 1 : 2) + c->hidden;
    if ((rc = need(f, "model.norm.weight", c->hidden, 0, &m->norm, err, errlen)) != DQ_OK)
        return rc;
    m->layer = calloc(c->layers, sizeof *m->layer);
    if (!m->layer)
        return eval_fail(err, errlen, DQ_NOMEM, "out of memory");
    for (uint32_t l = 0; l < c->layers && rc == DQ_OK; l++) {
        model_layer *L = &m->layer[l];
        char name[128];
        const struct {
            const char *suffix;
            float **dst;
            uint32_t rows, cols;
        } t[] = {
            {"input_layernorm.weight", &L->ln1, c->hidden, 0},
            {"post_attention_layernorm.weight", &L->ln2, c->hidden, 0},
            {"self_attn.q_proj.weight", &L->wq, qd, c->hidden},
            {"self_attn.k_proj.weight", &L->wk, kvd, c->hidden},
            {"self_attn.v_proj.weight", &L->wv, kvd, c->hidden},
            {"self_attn.o_proj.weight", &L->wo, c->hidden, qd},
            {"mlp.gate_proj.weight", &L->wg, c->intermediate, c->hidden},
            {"mlp.up_proj.weight", &L->wu, c->intermediate, c->hidden},
            {"mlp.down_proj.weight", &L->wd, c->hidden, c->intermediate},
        };
        for (size_t i = 0; i < sizeof t / sizeof t[0] && rc == DQ_OK; i++) {
            snprintf(name, sizeof name, "model.layers.%u.%s", l, t[i].suffix);
            rc = need(f, name, t[i].rows, t[i].cols, t[i].dst, err, errlen);
            m->params += (uint64_t)t[i].rows * (t[i].cols ? t[i].cols : 1);
        }
    }
    return rc;
}

int eval_model_load(const char *dir, eval_model **out, char *err, size_t errlen)
{
    *out = NULL;
    eval_model *m = calloc(1, sizeof *m);
    if (!m)
        return eval_fail(err, errlen, DQ_NOMEM, "out of memory");
    int rc = parse_config(dir, &m->cfg, err, errlen);
    void *raw = NULL;
    size_t len = 0;
    st_file f = {0};
    if (rc == DQ_OK) {
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = eval_read_file(path, &raw, &len);
        if (rc != DQ_OK)
            rc = eval_fail(err, errlen, rc, "%s: %s", path, rc == DQ_NOT_FOUND ? "not found" : dq_strerror(rc));
    }
    if (rc == DQ_OK) {
        /* u64 little-endian header length, the JSON header, then the data section */
        const uint8_t *b = raw;
        uint64_t hlen = 0;
        for (int i = 7; len >= 8 && i >= 0; i--)
            hlen = hlen << 8 | b[i];
        char jerr[256];
        if (len < 8 || hlen > len - 8 || hlen > (100u << 20))
            rc = eval_fail(err, errlen, DQ_CORRUPT, "model.safetensors: header length %llu exceeds the %zu-byte file",
                           (unsigned long long)hlen, len);
        else if ((rc = eval_json_parse((const char *)b + 8, (size_t)hlen, &f.header, jerr, sizeof jerr)) != DQ_OK)
            eval_fail(err, errlen, rc, "model.safetensors header: %s", jerr);
        else if (f.header->type != EVAL_JSON_OBJECT)
            rc = eval_fail(err, errlen, DQ_CORRUPT, "model.safetensors header: not a JSON object");
        else {
            f.data = b + 8 + hlen;
            f.data_len = len - 8 - (size_t)hlen;
            rc = load_weights(m, &f, err, errlen);
        }
    }
    eval_json_free(f.header);
    free(raw);
    if (rc == DQ_OK) {
        const uint32_t half = m->cfg.head_dim / 2;
        m->inv_freq = malloc(half * sizeof *m->inv_freq);
        if (!m->inv_freq)
            rc = eval_fail(err, errlen, DQ_NOMEM, "out of memory");
        for (uint32_t i = 0; m->inv_freq && i < half; i++)
            m->inv_freq[i] = (float)(1.0 / pow((double)m->cfg.rope_theta, (double)(2 * i) / m->cfg.head_dim));
        /* A model saved in bfloat16 and loaded in its own dtype holds the inv_freq buffer in
         * bfloat16 too (then cast back to float32): the captured caches of ../shared/data were made
         * that way — with float32 frequencies keys drift from them by up to 0.1 at position 20. */
        for (uint32_t i = 0; m->inv_freq && m->cfg.rope_bf16 && i < half; i++) {
            uint16_t b;
            dq_convert(&m->inv_freq[i], DQ_DTYPE_F32, &b, DQ_DTYPE_BF16, 1);
            dq_convert(&b, DQ_DTYPE_BF16, &m->inv_freq[i], DQ_DTYPE_F32, 1);
        }
    }
    if (rc != DQ_OK) {
        eval_model_free(m);
        return rc;
    }
    *out = m;
    return DQ_OK;
}

/* ---- KV cache ---- */

int eval_kv_cache_init(const eval_model *m, uint32_t capacity, eval_kv_cache *c)
{
    memset(c, 0, sizeof *c);
    if (!m || !capacity || capacity > m->cfg.max_positions)
        return DQ_INVALID_ARGUMENT;
    c->layers = m->cfg.layers;
    c->capacity = capacity;
    c->n = (size_t)m->cfg.kv_heads * m->cfg.head_dim;
    const size_t count = (size_t)c->layers * capacity * c->n;
    c->k = calloc(count, sizeof *c->k);
    c->v = calloc(count, sizeof *c->v);
    if (!c->k || !c->v) {
        eval_kv_cache_free(c);
        return DQ_NOMEM;
    }
    return DQ_OK;
}

void eval_kv_cache_free(eval_kv_cache *c)
{
    if (!c)
        return;
    free(c->k);
    free(c->v);
    memset(c, 0, sizeof *c);
}

float *eval_kv_cache_layer(const eval_kv_cache *c, int values, uint32_t layer)
{
    return (values ? c->v : c->k) + (size_t)layer * c->capacity * c->n;
}

/* ---- forward ---- */

/* y[t][o] = Σ_i w[o][i] · x[t][i] for ntok rows of x (in columns) and out rows of w. Eight partial
 * sums per dot product (a fixed order, so results are reproducible) and four tokens per pass over a
 * weight row. */
static void matmul(const float *w, const float *x, float *y, size_t ntok, size_t in, size_t out)
{
    const size_t in8 = in & ~(size_t)7;
    size_t t = 0;
    for (; t + 4 <= ntok; t += 4) {
        const float *x0 = x + t * in, *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in;
        for (size_t o = 0; o < out; o++) {
            const float *wr = w + o * in;
            float a0[8] = {0}, a1[8] = {0}, a2[8] = {0}, a3[8] = {0};
            for (size_t i = 0; i < in8; i += 8)
                for (int j = 0; j < 8; j++) {
                    a0[j] += wr[i + j] * x0[i + j];
                    a1[j] += wr[i + j] * x1[i + j];
                    a2[j] += wr[i + j] * x2[i + j];
                    a3[j] += wr[i + j] * x3[i + j];
                }
            float s[4] = {0};
            for (int j = 0; j < 8; j++) {
                s[0] += a0[j];
                s[1] += a1[j];
                s[2] += a2[j];
                s[3] += a3[j];
            }
            for (size_t i = in8; i < in; i++) {
                s[0] += wr[i] * x0[i];
                s[1] += wr[i] * x1[i];
                s[2] += wr[i] * x2[i];
                s[3] += wr[i] * x3[i];
            }
            y[t * out + o] = s[0];
            y[(t + 1) * out + o] = s[1];
            y[(t + 2) * out + o] = s[2];
            y[(t + 3) * out + o] = s[3];
        }
    }
    /* the remaining tokens: the same arithmetic one at a time (bit-identical per token) */
    for (; t < ntok; t++) {
        const float *x0 = x + t * in;
        for (size_t o = 0; o < out; o++) {
            const float *wr = w + o * in;
            float a0[8] = {0};
            for (size_t i = 0; i < in8; i += 8)
                for (int j = 0; j < 8; j++)
                    a0[j] += wr[i + j] * x0[i + j];
            float s = 0;
            for (int j = 0; j < 8; j++)
                s += a0[j];
            for (size_t i = in8; i < in; i++)
                s += wr[i] * x0[i];
            y[t * out + o] = s;
        }
    }
}

static void rmsnorm(const float *x, const float *w, float eps, float *y, size_t ntok, size_t dim)
{
    for (size_t t = 0; t < ntok; t++) {
        const float *xr = x + t * dim;
        double ss = 0;
        for (size_t i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        const float r = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        for (size_t i = 0; i < dim; i++)
            y[t * dim + i] = w[i] * (xr[i] * r);
    }
}

/* In place on heads vectors of head_dim at position pos: pairs (i, i + d/2). */
static void rope(float *x, size_t heads, size_t head_dim, uint32_t pos, const float *inv_freq)
{
    const size_t half = head_dim / 2;
    for (size_t i = 0; i < half; i++) {
        const float f = (float)pos * inv_freq[i];
        const float c = (float)cos((double)f), s = (float)sin((double)f);
        for (size_t h = 0; h < heads; h++) {
            float *v = x + h * head_dim;
            const float a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

int eval_model_forward(const eval_model *m, eval_kv_cache *c, const int32_t *tokens, uint32_t ntok, float *logits,
                       float *q_out)
{
    if (!m || !c || !tokens || !ntok || c->layers != m->cfg.layers)
        return DQ_INVALID_ARGUMENT;
    const eval_model_config *cfg = &m->cfg;
    if (ntok > c->capacity - c->len)
        return DQ_OUT_OF_BOUNDS;
    for (uint32_t t = 0; t < ntok; t++)
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= cfg->vocab)
            return DQ_INVALID_ARGUMENT;
    const size_t H = cfg->hidden, hd = cfg->head_dim, qd = (size_t)cfg->heads * hd, n = c->n, I = cfg->intermediate;
    const size_t group = cfg->heads / cfg->kv_heads, ctx = (size_t)c->len + ntok;
    float *x = malloc(ntok * H * sizeof *x), *xn = malloc(ntok * H * sizeof *xn);
    float *q = malloc(ntok * qd * sizeof *q), *att = malloc(ntok * qd * sizeof *att);
    float *g = malloc(ntok * I * sizeof *g), *u = malloc(ntok * I * sizeof *u);
    /* scores of every head [heads][ctx] (value skipping needs all heads' before any sum), and the
     * kept flags of the sealed positions */
    const int vskip = c->value_mass > 0 && c->value_mass < 1 && c->sealed > 0;
    float *sc = malloc((size_t)cfg->heads * ctx * sizeof *sc), *tmp = malloc(ntok * (n > H ? n : H) * sizeof *tmp);
    uint8_t *keep = vskip ? malloc(c->sealed) : NULL;
    int rc = DQ_OK;
    if (vskip && !c->vskip_codec) {
        rc = DQ_INVALID_ARGUMENT;
        goto out;
    }
    if (!x || !xn || !q || !att || !g || !u || !sc || !tmp || (vskip && !keep)) {
        rc = DQ_NOMEM;
        goto out;
    }
    for (uint32_t t = 0; t < ntok; t++)
        memcpy(x + t * H, m->embed + (size_t)tokens[t] * H, H * sizeof *x);
    const float scale = (float)(1.0 / sqrt((double)hd));
    for (uint32_t l = 0; l < cfg->layers; l++) {
        const model_layer *L = &m->layer[l];
        float *kc = eval_kv_cache_layer(c, 0, l), *vc = eval_kv_cache_layer(c, 1, l);
        rmsnorm(x, L->ln1, cfg->rms_eps, xn, ntok, H);
        matmul(L->wq, xn, q, ntok, H, qd);
        matmul(L->wk, xn, kc + (size_t)c->len * n, ntok, H, n);
        matmul(L->wv, xn, vc + (size_t)c->len * n, ntok, H, n);
        for (uint32_t t = 0; t < ntok; t++) {
            rope(q + t * qd, cfg->heads, hd, c->len + t, m->inv_freq);
            rope(kc + (c->len + t) * n, cfg->kv_heads, hd, c->len + t, m->inv_freq);
        }
        if (q_out)
            memcpy(q_out + (size_t)l * ntok * qd, q, ntok * qd * sizeof *q);
        for (uint32_t t = 0; t < ntok; t++) {
            const size_t span = (size_t)c->len + t + 1; /* causal */
            for (size_t h = 0; h < cfg->heads; h++) {
                const float *qh = q + t * qd + h * hd;
                const size_t kvh = h / group;
                float *sh = sc + h * ctx;
                for (size_t s = 0; s < span; s++) {
                    const float *kr = kc + s * n + kvh * hd;
                    float a[8] = {0}, dot = 0;
                    for (size_t i = 0; i + 8 <= hd; i += 8)
                        for (int j = 0; j < 8; j++)
                            a[j] += qh[i + j] * kr[i + j];
                    for (int j = 0; j < 8; j++)
                        dot += a[j];
                    for (size_t i = hd & ~(size_t)7; i < hd; i++)
                        dot += qh[i] * kr[i];
                    sh[s] = dot * scale;
                }
            }
            /* the sealed positions whose values count: all, or the union of the heads' minimal sets */
            const size_t ns = vskip ? (span < c->sealed ? span : c->sealed) : 0;
            if (ns) {
                rc = dq_vskip_select(c->vskip_codec, sc, ctx, cfg->heads, ns, sc + ns, ctx, span - ns, c->value_mass,
                                     keep, NULL);
                if (rc != DQ_OK)
                    goto out;
                for (size_t s = 0; s < ns; s++)
                    c->vskip_kept += keep[s];
                c->vskip_sealed += ns;
            }
            for (size_t h = 0; h < cfg->heads; h++) {
                const size_t kvh = h / group;
                float *sh = sc + h * ctx, mx = -INFINITY;
                for (size_t s = 0; s < span; s++)
                    mx = sh[s] > mx ? sh[s] : mx;
                double z = 0;
                for (size_t s = 0; s < span; s++) {
                    sh[s] = (float)exp((double)(sh[s] - mx));
                    z += sh[s];
                }
                float *o = att + t * qd + h * hd;
                memset(o, 0, hd * sizeof *o);
                for (size_t s = 0; s < span; s++) {
                    if (s < ns && !keep[s])
                        continue; /* skipped: its weight stays in z (no renormalization) */
                    const float p = (float)(sh[s] / z);
                    const float *vr = vc + s * n + kvh * hd;
                    for (size_t i = 0; i < hd; i++)
                        o[i] += p * vr[i];
                }
            }
        }
        matmul(L->wo, att, tmp, ntok, qd, H);
        for (size_t i = 0; i < ntok * H; i++)
            x[i] += tmp[i];
        rmsnorm(x, L->ln2, cfg->rms_eps, xn, ntok, H);
        matmul(L->wg, xn, g, ntok, H, I);
        matmul(L->wu, xn, u, ntok, H, I);
        for (size_t i = 0; i < ntok * I; i++)
            g[i] = g[i] / (1.0f + (float)exp(-(double)g[i])) * u[i];
        matmul(L->wd, g, tmp, ntok, I, H);
        for (size_t i = 0; i < ntok * H; i++)
            x[i] += tmp[i];
    }
    c->len += ntok;
    if (logits) {
        rmsnorm(x, m->norm, cfg->rms_eps, xn, ntok, H);
        matmul(m->lm_head, xn, logits, ntok, H, cfg->vocab);
    }
out:
    free(x);
    free(xn);
    free(q);
    free(att);
    free(g);
    free(u);
    free(sc);
    free(tmp);
    free(keep);
    return rc;
}
