/* dquantd registry (see registry.h). */
#include "registry.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "dquant/error.h"
#include "dquant/kvq.h"
#include "logging.h"

/* Unreferenced codecs kept for reuse by COMPRESS / DECOMPRESS. */
#define CODEC_CACHE 16

struct dqd_registry {
    dqd_hostmem *mem;
    uint32_t max_models, nmodels;
    uint32_t max_per_client; /* 0: no per-client limit */
    dqd_model *models;
    dqd_codec *codecs;
    uint64_t clock;
    void (*on_codec_free)(void *arg, const dqd_codec *codec);
    void *codec_free_arg;
};

int dqd_registry_create(dqd_hostmem *mem, uint32_t max_models, dqd_registry **out)
{
    dqd_registry *reg = calloc(1, sizeof *reg);
    if (!reg)
        return DQ_NOMEM;
    reg->mem = mem;
    reg->max_models = max_models;
    *out = reg;
    return DQ_OK;
}

static void codec_free(dqd_registry *reg, dqd_codec *c)
{
    for (size_t i = 0; i < c->nfree; i++)
        dq_workspace_free(c->free_ws[i]);
    free(c->free_ws);
    dq_codec_free(c->codec);
    dqd_hostmem_free(reg->mem, c->calib);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void dqd_registry_destroy(dqd_registry *reg)
{
    if (!reg)
        return;
    for (dqd_model *m = reg->models, *next; m; m = next) {
        next = m->next;
        free(m);
    }
    for (dqd_codec *c = reg->codecs, *next; c; c = next) {
        next = c->next;
        codec_free(reg, c);
    }
    free(reg);
}

void dqd_registry_set_client_limit(dqd_registry *reg, uint32_t max_per_client)
{
    reg->max_per_client = max_per_client;
}

void dqd_registry_on_codec_free(dqd_registry *reg, void (*fn)(void *arg, const dqd_codec *codec), void *arg)
{
    reg->on_codec_free = fn;
    reg->codec_free_arg = arg;
}

/* Drops unreferenced codecs, least recently used first, beyond the cache size. */
static void codec_trim(dqd_registry *reg)
{
    for (;;) {
        size_t idle = 0;
        dqd_codec **victim = NULL;
        for (dqd_codec **pp = &reg->codecs; *pp; pp = &(*pp)->next) {
            if ((*pp)->refs)
                continue;
            idle++;
            if (!victim || (*pp)->last_use < (*victim)->last_use)
                victim = pp;
        }
        if (idle <= CODEC_CACHE)
            return;
        dqd_codec *c = *victim;
        *victim = c->next;
        if (reg->on_codec_free)
            reg->on_codec_free(reg->codec_free_arg, c);
        codec_free(reg, c);
    }
}

/* The cached codec whose canonical serialization is key[0..klen) and whose calibration hashes to
 * calib_hash (any calibration when any_calib), referenced; NULL if none. */
static dqd_codec *codec_find(dqd_registry *reg, const uint8_t *key, size_t klen, uint64_t calib_hash, bool any_calib)
{
    for (dqd_codec *c = reg->codecs; c; c = c->next) {
        if (c->plen == klen && (any_calib || c->calib_hash == calib_hash) && memcmp(c->pbytes, key, klen) == 0) {
            c->refs++;
            c->last_use = ++reg->clock;
            return c;
        }
    }
    return NULL;
}

/* Calibrations hash with XXH3-64; 0 stands for none, so a (2^-64 unlikely) 0 becomes 1. */
static uint64_t calib_hash_of(const uint8_t *calib, size_t len)
{
    if (!calib || !len)
        return 0;
    uint64_t h = XXH3_64bits(calib, len);
    return h ? h : 1;
}

int dqd_registry_codec_bytes(dqd_registry *reg, const uint8_t *bytes, size_t len, dqd_codec **out)
{
    /* A profile with a calibration hash is served by the codec of a model registered with it: its
     * bytes include that hash, so any cached codec of the same bytes has that calibration. */
    if (bytes && len && (*out = codec_find(reg, bytes, len, 0, true)) != NULL)
        return DQ_OK;
    dq_profile p;
    int rc = dq_profile_deserialize(bytes, len, &p);
    if (rc < 0)
        return rc;
    return dqd_registry_codec(reg, &p, out);
}

int dqd_registry_codec(dqd_registry *reg, const dq_profile *profile, dqd_codec **out)
{
    return dqd_registry_codec_calibrated(reg, profile, NULL, 0, out);
}

int dqd_registry_codec_calibrated(dqd_registry *reg, const dq_profile *profile, const uint8_t *calib, size_t calib_len,
                                  dqd_codec **out)
{
    uint8_t key[DQ_PROFILE_SERIALIZED_MAX];
    size_t klen;
    int rc = dq_profile_serialize(profile, key, sizeof key, &klen);
    if (rc < 0)
        return rc;
    const uint64_t chash = calib_hash_of(calib, calib_len);
    const bool wants_calib = profile->codec_type == DQ_CODEC_KVQ && profile->kvq_calib_hash != 0;
    /* Without its calibration, a calibrated profile is only found (a model registered it). */
    if ((*out = codec_find(reg, key, klen, chash, wants_calib && !chash)) != NULL)
        return DQ_OK;
    if (wants_calib != (chash != 0))
        return DQ_PROFILE;
    dqd_codec *c = calloc(1, sizeof *c);
    if (!c)
        return DQ_NOMEM;
    if (chash) {
        c->calib = dqd_hostmem_alloc(reg->mem, calib_len);
        if (!c->calib) {
            free(c);
            return DQ_NOMEM;
        }
        memcpy(c->calib, calib, calib_len);
        c->calib_len = calib_len;
        c->calib_hash = chash;
        c->calib_layers = profile->kvq_layers;
        rc = dq_codec_create_calibrated(profile, calib, calib_len, &reg->mem->alloc, &c->codec);
    } else {
        rc = dq_codec_create(profile, &reg->mem->alloc, &c->codec);
    }
    if (rc < 0) {
        dqd_hostmem_free(reg->mem, c->calib);
        free(c);
        return rc;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->profile = *dq_codec_profile(c->codec);
    memcpy(c->pbytes, key, klen);
    c->plen = klen;
    c->n = dq_codec_stream_len(c->codec);
    c->window_bytes = dq_codec_window_bytes(c->codec);
    c->mean_bytes = dq_codec_mean_bytes(c->codec);
    c->record_bytes[DQ_KIND_K] = dq_codec_record_bytes(c->codec, DQ_KIND_K);
    c->record_bytes[DQ_KIND_V] = dq_codec_record_bytes(c->codec, DQ_KIND_V);
    c->refs = 1;
    c->last_use = ++reg->clock;
    c->next = reg->codecs;
    reg->codecs = c;
    codec_trim(reg);
    *out = c;
    return DQ_OK;
}

void dqd_registry_codec_ref(dqd_registry *reg, dqd_codec *codec)
{
    codec->refs++;
    codec->last_use = ++reg->clock;
}

const dq_codec *dqd_codec_view(const dqd_codec *codec, uint32_t layer)
{
    if (!codec->calib)
        return codec->codec;
    return layer < codec->calib_layers ? dq_codec_layer(codec->codec, layer) : NULL;
}

void dqd_registry_codec_release(dqd_registry *reg, dqd_codec *codec)
{
    if (!codec)
        return;
    codec->refs--;
    codec_trim(reg);
}

dq_workspace *dqd_codec_ws_take(dqd_codec *codec)
{
    dq_workspace *ws = NULL;
    pthread_mutex_lock(&codec->mu);
    if (codec->nfree)
        ws = codec->free_ws[--codec->nfree];
    pthread_mutex_unlock(&codec->mu);
    if (!ws && dq_workspace_create(codec->codec, &ws) < 0)
        return NULL;
    return ws;
}

void dqd_codec_ws_give(dqd_codec *codec, dq_workspace *ws)
{
    if (!ws)
        return;
    pthread_mutex_lock(&codec->mu);
    if (codec->nfree == codec->capfree) {
        size_t cap = codec->capfree ? codec->capfree * 2 : 4;
        dq_workspace **grown = realloc(codec->free_ws, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&codec->mu);
            dq_workspace_free(ws);
            return;
        }
        codec->free_ws = grown;
        codec->capfree = cap;
    }
    codec->free_ws[codec->nfree++] = ws;
    pthread_mutex_unlock(&codec->mu);
}

dqd_model *dqd_registry_find(const dqd_registry *reg, const char *name)
{
    if (!name)
        return NULL;
    for (dqd_model *m = reg->models; m; m = m->next)
        if (strcmp(m->name, name) == 0)
            return m;
    return NULL;
}

uint32_t dqd_registry_model_count(const dqd_registry *reg)
{
    return reg->nmodels;
}

uint32_t dqd_registry_client_models(const dqd_registry *reg, const char *owner)
{
    uint32_t n = 0;
    for (const dqd_model *m = reg->models; m; m = m->next)
        n += strcmp(m->owner, owner ? owner : "") == 0;
    return n;
}

void dqd_model_hold(dqd_model *m)
{
    m->users++;
}

void dqd_model_drop(dqd_model *m)
{
    if (m) {
        assert(m->users > 0);
        m->users--;
    }
}

int dqd_registry_unregister(dqd_registry *reg, const char *name, char *msg, size_t msglen)
{
    dqd_model **pp = &reg->models;
    while (*pp && strcmp((*pp)->name, name ? name : "") != 0)
        pp = &(*pp)->next;
    dqd_model *m = *pp;
    if (!m) {
        snprintf(msg, msglen, "no model named '%s'", name ? name : "");
        return DQ_NOT_FOUND;
    }
    if (m->seqs) {
        snprintf(msg, msglen, "model '%s' still has %u sequences or chunks; DELETE them first", m->name, m->seqs);
        return DQ_BUSY;
    }
    if (m->users) {
        snprintf(msg, msglen, "model '%s' is in use by %u requests; retry", m->name, m->users);
        return DQ_BUSY;
    }
    *pp = m->next;
    reg->nmodels--;
    DQD_INFO("unregistered model '%s' (registered by '%s')", m->name, m->owner);
    dqd_registry_codec_release(reg, m->codec);
    free(m);
    return DQ_OK;
}

static bool name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > DQD_MODEL_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return false;
    return true;
}

#define MSG(...) snprintf(msg, msglen, __VA_ARGS__)

int dqd_registry_register(dqd_registry *reg, const dqd_model_spec *spec, dqd_model **out, bool *existed, char *msg,
                          size_t msglen)
{
    *existed = false;
    if (!name_ok(spec->name)) {
        MSG("model name must be 1..%d printable bytes", DQD_MODEL_NAME_MAX);
        return DQ_INVALID_ARGUMENT;
    }
    if (spec->layers == 0 || spec->layers > 4096) {
        MSG("layers must be 1..4096 (got %u)", spec->layers);
        return DQ_SHAPE;
    }
    if (spec->kv_heads == 0 || spec->head_dim == 0 || spec->q_heads == 0 || spec->q_heads % spec->kv_heads) {
        MSG("q_heads (%u) must be a positive multiple of kv_heads (%u)", spec->q_heads, spec->kv_heads);
        return DQ_SHAPE;
    }
    if (spec->head_dim & (spec->head_dim - 1)) {
        MSG("head_dim must be a power of two (got %u)", spec->head_dim);
        return DQ_SHAPE;
    }
    if ((uint64_t)spec->kv_heads * spec->head_dim > DQ_MAX_STREAM || spec->q_heads > 65536) {
        MSG("kv_heads x head_dim must be at most %u", DQ_MAX_STREAM);
        return DQ_SHAPE;
    }

    const uint32_t chunk_tokens = spec->chunk_tokens ? spec->chunk_tokens : DQD_DEFAULT_CHUNK_TOKENS;
    const char *pname = spec->profile_name && *spec->profile_name ? spec->profile_name : "dq226";
    const uint8_t *calib = spec->calibration_len ? spec->calibration : NULL;
    const size_t calib_len = calib ? spec->calibration_len : 0;
    dqd_model *m = dqd_registry_find(reg, spec->name);
    if (m && !spec->profile_len && !calib_len && m->builtin[0] && strcmp(m->builtin, pname) == 0 &&
        m->layers == spec->layers && m->q_heads == spec->q_heads && m->kv_heads == spec->kv_heads &&
        m->head_dim == spec->head_dim && m->chunk_tokens == chunk_tokens) {
        *existed = true; /* the same built-in profile for the same shape: the same bytes */
        *out = m;
        return DQ_OK;
    }

    /* A new model: the limits first, before the profile is built (tens of ms on the loop). */
    const char *owner = spec->owner ? spec->owner : "";
    if (!m && reg->max_per_client && dqd_registry_client_models(reg, owner) >= reg->max_per_client) {
        MSG("client '%s' holds %u models, its share of the registry (max_models_per_client); UNREGISTER_MODEL one "
            "first",
            owner, reg->max_per_client);
        return DQ_RESOURCE_EXHAUSTED;
    }
    if (!m && reg->nmodels >= reg->max_models) {
        MSG("at most %u models can be registered", reg->max_models);
        return DQ_RESOURCE_EXHAUSTED;
    }

    dq_profile p;
    int rc;
    if (spec->profile_len) {
        rc = dq_profile_deserialize(spec->profile, spec->profile_len, &p);
        if (rc < 0) {
            MSG("serialized profile rejected: %s", dq_strerror(rc));
            return rc;
        }
        if (p.kv_heads != spec->kv_heads || p.head_dim != spec->head_dim) {
            MSG("profile is for %u x %u, model has kv_heads %u, head_dim %u", p.kv_heads, p.head_dim, spec->kv_heads,
                spec->head_dim);
            return DQ_SHAPE;
        }
    } else {
        rc = dq_profile_builtin(pname, spec->kv_heads, spec->head_dim, &p);
        if (rc < 0) {
            MSG("built-in profile '%s' unavailable for %u x %u: %s", pname, spec->kv_heads, spec->head_dim,
                dq_strerror(rc));
            return rc;
        }
    }

    /* The profile says whether it has a calibration (its hash); the bytes must be that one. */
    const bool wants_calib = p.codec_type == DQ_CODEC_KVQ && p.kvq_calib_hash != 0;
    if (wants_calib && !calib_len) {
        MSG("profile '%s' needs its calibration (ModelSpec.calibration: the bytes dq_kvq_calibrate wrote)", p.name);
        return DQ_PROFILE;
    }
    if (!wants_calib && calib_len) {
        MSG("profile '%s' takes no calibration (%s)", p.name,
            p.codec_type == DQ_CODEC_KVQ ? "its calibration hash is 0: send the profile dq_kvq_calibrate returned"
                                         : "not a KVQ profile");
        return DQ_PROFILE;
    }
    if (calib_len) {
        uint32_t clayers = 0;
        rc = dq_kvq_calibration_check(&p, calib, calib_len, &clayers);
        if (rc < 0) {
            MSG("calibration rejected: %s (%zu bytes for profile '%s')", dq_strerror(rc), calib_len, p.name);
            return rc;
        }
        if (clayers != spec->layers) {
            MSG("calibration has %u layers, the model %u", clayers, spec->layers);
            return DQ_SHAPE;
        }
    }

    if (chunk_tokens % p.window || chunk_tokens > DQD_MAX_CHUNK_TOKENS) {
        MSG("chunk_tokens %u must be a multiple of the profile's window %u, at most %u", chunk_tokens, p.window,
            DQD_MAX_CHUNK_TOKENS);
        return DQ_INVALID_ARGUMENT;
    }

    uint8_t pbytes[DQ_PROFILE_SERIALIZED_MAX];
    size_t plen;
    rc = dq_profile_serialize(&p, pbytes, sizeof pbytes, &plen);
    if (rc < 0) {
        MSG("cannot serialize profile: %s", dq_strerror(rc));
        return rc;
    }

    if (m) {
        if (m->layers == spec->layers && m->q_heads == spec->q_heads && m->kv_heads == spec->kv_heads &&
            m->head_dim == spec->head_dim && m->chunk_tokens == chunk_tokens && m->codec->plen == plen &&
            memcmp(m->codec->pbytes, pbytes, plen) == 0 && m->codec->calib_len == calib_len &&
            (!calib_len || memcmp(m->codec->calib, calib, calib_len) == 0)) {
            *existed = true;
            *out = m;
            return DQ_OK;
        }
        MSG("model '%s' is already registered with a different spec", spec->name);
        return DQ_EXISTS;
    }

    m = calloc(1, sizeof *m);
    if (!m) {
        MSG("out of memory");
        return DQ_NOMEM;
    }
    rc = dqd_registry_codec_calibrated(reg, &p, calib, calib_len, &m->codec);
    if (rc < 0) {
        free(m);
        MSG("cannot create codec: %s", dq_strerror(rc));
        return rc;
    }
    snprintf(m->name, sizeof m->name, "%s", spec->name);
    m->layers = spec->layers;
    m->q_heads = spec->q_heads;
    m->kv_heads = spec->kv_heads;
    m->head_dim = spec->head_dim;
    m->chunk_tokens = chunk_tokens;
    if (!spec->profile_len && !calib_len && strlen(pname) <= DQD_BUILTIN_NAME_MAX)
        snprintf(m->builtin, sizeof m->builtin, "%s", pname);
    snprintf(m->owner, sizeof m->owner, "%s", owner);
    m->next = reg->models;
    reg->models = m;
    reg->nmodels++;
    DQD_INFO("registered model '%s': %u layers, %u q heads, %u kv heads, head_dim %u, profile %s (%.3f bits/value)%s",
             m->name, m->layers, m->q_heads, m->kv_heads, m->head_dim, m->codec->profile.name,
             dq_profile_bits_per_value_mean(&m->codec->profile), calib_len ? ", calibrated per layer" : "");
    *out = m;
    return DQ_OK;
}
