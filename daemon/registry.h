/* dquantd registry: the registered models and a cache of codecs keyed by profile and calibration.
 *
 * A dqd_codec wraps a dq_codec (allocating through the store's counting allocator) with a pool of
 * workspaces for the worker threads. A KVQuant++ model registered with a calibration (dquant/kvq.h)
 * has a codec made by dq_codec_create_calibrated: it keeps the calibration's bytes (the cache key
 * is the serialized profile and the calibration's hash) and serves each model layer L through the
 * view dqd_codec_view(codec, L): every layer of a sequence is created, restored, checked, encoded,
 * decoded and attended with the view of its own index, never with the codec itself. Models hold a reference to their codec until they are
 * unregistered; COMPRESS/DECOMPRESS take short references to codecs of built-in or client-supplied
 * profiles, and unreferenced ones are dropped beyond a small cache.
 *
 * Models are registered by a client (its HELLO client_name, "" for none) and count against that
 * client's share of the registry (dqd_registry_set_client_limit), so that one client cannot fill it
 * for everyone. A model is unregistered only while nothing uses it: no sequence or chunk of it
 * exists (deleted ones still referenced by requests included) and no request holds it
 * (dqd_model_hold). Re-registering an identical model is answered by the model as it is, whoever
 * registered it, and counts for nobody.
 *
 * Thread-safety: everything except dqd_codec_ws_take/give runs on the loop thread. */
#ifndef DQD_REGISTRY_H
#define DQD_REGISTRY_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dquant/codec.h"
#include "dquant/profile.h"
#include "hostmem.h"

#define DQD_MODEL_NAME_MAX 128
#define DQD_DEFAULT_CHUNK_TOKENS 256
#define DQD_MAX_CHUNK_TOKENS 65536

typedef struct dqd_codec {
    dq_codec *codec;
    dq_profile profile;
    uint8_t pbytes[DQ_PROFILE_SERIALIZED_MAX]; /* serialized profile: the cache key */
    size_t plen;
    uint8_t *calib; /* the KVQ calibration (hostmem), NULL: none */
    size_t calib_len;
    uint64_t calib_hash; /* XXH3-64 of calib, 0: none; with pbytes, the cache key */
    uint32_t calib_layers;
    uint32_t n; /* kv_heads × head_dim */
    size_t window_bytes, mean_bytes, record_bytes[2];
    int refs; /* loop thread */
    uint64_t last_use;
    pthread_mutex_t mu; /* guards the workspace pool */
    dq_workspace **free_ws;
    size_t nfree, capfree;
    struct dqd_codec *next;
} dqd_codec;

#define DQD_BUILTIN_NAME_MAX 31

typedef struct dqd_model {
    char name[DQD_MODEL_NAME_MAX + 1];
    uint32_t layers, q_heads, kv_heads, head_dim;
    uint32_t chunk_tokens; /* tokens per chunk of the shared KV tier (a multiple of W) */
    /* The built-in profile it was registered by ("" for a serialized profile): registering the
     * same spec again is then answered without building the profile (tens of ms). */
    char builtin[DQD_BUILTIN_NAME_MAX + 1];
    char owner[DQD_MODEL_NAME_MAX + 1]; /* the client_name that registered it */
    dqd_codec *codec;
    uint32_t seqs;  /* sequences and chunks of the model, until freed (store.c) */
    uint32_t users; /* requests holding the model before their sequence exists (dqd_model_hold) */
    struct dqd_model *next;
} dqd_model;

/* A model as requested (REGISTER_MODEL). profile/profile_len win over profile_name when set. */
typedef struct dqd_model_spec {
    const char *name;
    uint32_t layers, q_heads, kv_heads, head_dim;
    uint32_t chunk_tokens; /* 0: DQD_DEFAULT_CHUNK_TOKENS */
    const char *profile_name;
    const uint8_t *profile;
    size_t profile_len;
    const uint8_t *calibration; /* the KVQ calibration of a profile that has one (borrowed), or NULL */
    size_t calibration_len;
    const char *owner; /* the registering client's name; NULL: "" */
} dqd_model_spec;

typedef struct dqd_registry dqd_registry;

int dqd_registry_create(dqd_hostmem *mem, uint32_t max_models, dqd_registry **out);
/* Frees models and codecs; no codec may be in use by work in flight. */
void dqd_registry_destroy(dqd_registry *reg);

/* Models one client (owner) may hold at most; 0 (the default): only max_models limits. */
void dqd_registry_set_client_limit(dqd_registry *reg, uint32_t max_per_client);
/* Called with each codec the registry frees (not by dqd_registry_destroy), before it goes: the cuda
 * backend drops its device copy, which it keys by the dqd_codec. fn may be NULL. */
void dqd_registry_on_codec_free(dqd_registry *reg, void (*fn)(void *arg, const dqd_codec *codec), void *arg);

/* Registers a model, or finds an identical one (*existed = true: the same spec, calibration bytes
 * included). A profile whose kvq_calib_hash is set needs its calibration (DQ_PROFILE without it);
 * any other profile takes none (DQ_PROFILE); the calibration is checked by
 * dq_kvq_calibration_check (DQ_CORRUPT, DQ_TRUNCATED, DQ_PROFILE) and its layer count must equal
 * the model's (DQ_SHAPE). Errors: DQ_INVALID_ARGUMENT / DQ_SHAPE / DQ_PROFILE for a bad spec, DQ_EXISTS for a different model of the same name,
 * DQ_RESOURCE_EXHAUSTED past max_models or past the owner's share; msg explains. */
int dqd_registry_register(dqd_registry *reg, const dqd_model_spec *spec, dqd_model **out, bool *existed, char *msg,
                          size_t msglen);
/* Removes a model nothing uses and releases its codec. DQ_NOT_FOUND for an unknown name, DQ_BUSY
 * while sequences or chunks of it exist or a request holds it (the model stays); msg explains. */
int dqd_registry_unregister(dqd_registry *reg, const char *name, char *msg, size_t msglen);
dqd_model *dqd_registry_find(const dqd_registry *reg, const char *name);
uint32_t dqd_registry_model_count(const dqd_registry *reg);
/* Models registered by owner ("" or NULL: by clients without a name). */
uint32_t dqd_registry_client_models(const dqd_registry *reg, const char *owner);

/* A request that keeps a model it looked up across a wait, before a sequence of it exists (which
 * would keep it registered), holds it so that UNREGISTER_MODEL answers DQ_BUSY meanwhile. Loop
 * thread; drop(NULL) is allowed. */
void dqd_model_hold(dqd_model *m);
void dqd_model_drop(dqd_model *m);

/* A referenced codec for a (validated) profile; release it with dqd_registry_codec_release. A
 * profile with a KVQ calibration hash (kvq_calib_hash) finds the codec of a registered model with
 * it, else DQ_PROFILE: only REGISTER_MODEL brings calibrations in. */
int dqd_registry_codec(dqd_registry *reg, const dq_profile *profile, dqd_codec **out);
/* The same with the profile's calibration (calib_len bytes, checked by the caller; NULL: none). */
int dqd_registry_codec_calibrated(dqd_registry *reg, const dq_profile *profile, const uint8_t *calib, size_t calib_len,
                                  dqd_codec **out);
/* The same for a serialized profile a client sent: bytes equal to a cached codec's canonical
 * serialization find it without deserializing and validating them again (a DECOMPRESS flood under
 * one profile spent most of the loop thread there); other bytes are deserialized (validated) first.
 * Errors: as dq_profile_deserialize, and as dqd_registry_codec. */
int dqd_registry_codec_bytes(dqd_registry *reg, const uint8_t *bytes, size_t len, dqd_codec **out);
/* One more reference to a codec held already (a model's). */
void dqd_registry_codec_ref(dqd_registry *reg, dqd_codec *codec);
void dqd_registry_codec_release(dqd_registry *reg, dqd_codec *codec);

/* The codec of model layer `layer`: the calibration's view of that layer (dq_codec_layer), or the
 * codec itself when it has no per-layer calibration. NULL for a layer outside the calibration
 * (callers check layer indices against the model or calib_layers first). Any thread. */
const dq_codec *dqd_codec_view(const dqd_codec *codec, uint32_t layer);

/* A workspace for the calling thread (any thread); NULL when out of memory. Give it back after use. */
dq_workspace *dqd_codec_ws_take(dqd_codec *codec);
void dqd_codec_ws_give(dqd_codec *codec, dq_workspace *ws);

#endif
