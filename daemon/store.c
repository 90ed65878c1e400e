/* dquantd store (see store.h). */
#include "store.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "dquant/error.h"
#include "logging.h"

/* Allocator header and rounding per allocation (hostmem.c), for estimates. */
#define ALLOC_SLACK 128u
/* A layer's fixed allocations beside its windows (the struct, the window pointer array). */
#define LAYER_FIXED 4096u

struct dqd_store {
    dqd_hostmem *mem;
    uint64_t budget, reserved;
    dqd_seq **buckets;
    size_t nbuckets, count;
    dqd_seq *lru_head, *lru_tail; /* head: most recently used */
    dqd_waiter *ready_head, *ready_tail;
    bool granting;
    uint64_t pinned, token_layers, stored_bytes, bf16_bytes, seq_bytes;
    uint64_t evictions, evicted_bytes;

    /* GPU tier */
    bool gpu_on;
    uint64_t gpu_budget, gpu_used, gpu_reserved; /* used: Σ gpu_bytes of sequences not yet freed */
    dqd_seq *glru_head, *glru_tail;
    uint64_t chunks; /* entries of kind CHUNK in the index */
    uint64_t gpu_seqs, gpu_demotions, gpu_promotions, gpu_drops, gpu_spills;
    void (*gpu_free)(void *arg, dqd_seq *seq);
    void *gpu_ctx;

    /* disk tier */
    bool disk_on;
    bool closing;      /* being destroyed: records stay on disk */
    uint64_t spilling; /* host bytes the spills in progress free (counted as free already) */
    uint64_t disk_capacity, disk_used, disk_reserved;
    dqd_seq *dlru_head, *dlru_tail;
    uint64_t disk_records, disk_stubs, disk_spills, disk_spill_bytes, disk_clean_evictions, disk_spill_failures;
    uint64_t disk_full_drops, disk_loads, disk_load_bytes, disk_corrupt, disk_load_failures, disk_evictions;
    uint64_t disk_recovered;
    dqd_store_disk_ops dops;
    void *darg;
};

static uint64_t seq_hash(const char *ns, size_t ns_len, const uint8_t *key, size_t key_len, uint8_t kind)
{
    uint64_t h = XXH64(ns, ns_len, 0x64716e73ull + kind);
    return XXH64(key, key_len, h);
}

int dqd_store_create(dqd_hostmem *mem, uint64_t budget, dqd_store **out)
{
    dqd_store *s = calloc(1, sizeof *s);
    if (!s)
        return DQ_NOMEM;
    s->nbuckets = 1024;
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    if (!s->buckets) {
        free(s);
        return DQ_NOMEM;
    }
    s->mem = mem;
    s->budget = budget;
    *out = s;
    return DQ_OK;
}

void dqd_seq_unref(dqd_seq *seq);

static void drop_prefix(dqd_seq *seq)
{
    for (uint32_t i = 0; i < seq->nprefix; i++) {
        seq->prefix[i]->prefix_users--;
        dqd_seq_unref(seq->prefix[i]);
    }
    free(seq->prefix);
    seq->prefix = NULL;
    seq->nprefix = 0;
}

static void seq_free(dqd_store *s, dqd_seq *seq)
{
    assert(seq->model->seqs > 0);
    seq->model->seqs--; /* the model may be unregistered once none is left */
    drop_prefix(seq);
    if (seq->layers) {
        for (uint32_t i = 0; i < seq->model->layers; i++)
            dq_layer_free(seq->layers[i]);
    }
    if (seq->glayers) {
        s->gpu_free(s->gpu_ctx, seq);
        dqd_hostmem_free(s->mem, seq->glayers);
    }
    s->gpu_used -= seq->gpu_bytes;
    dqd_hostmem_free(s->mem, seq->layers);
    dqd_hostmem_free(s->mem, seq->ns);
    dqd_hostmem_free(s->mem, seq->key);
    dqd_hostmem_free(s->mem, seq);
}

static void lru_unlink(dqd_store *s, dqd_seq *seq)
{
    if (!seq->in_lru)
        return;
    seq->in_lru = false;
    if (seq->lru_prev)
        seq->lru_prev->lru_next = seq->lru_next;
    else
        s->lru_head = seq->lru_next;
    if (seq->lru_next)
        seq->lru_next->lru_prev = seq->lru_prev;
    else
        s->lru_tail = seq->lru_prev;
    seq->lru_prev = seq->lru_next = NULL;
}

static void lru_push_front(dqd_store *s, dqd_seq *seq)
{
    assert(!seq->in_lru);
    seq->in_lru = true;
    seq->lru_prev = NULL;
    seq->lru_next = s->lru_head;
    if (s->lru_head)
        s->lru_head->lru_prev = seq;
    s->lru_head = seq;
    if (!s->lru_tail)
        s->lru_tail = seq;
}

static void glru_unlink(dqd_store *s, dqd_seq *seq)
{
    if (!seq->in_glru)
        return;
    if (seq->glru_prev)
        seq->glru_prev->glru_next = seq->glru_next;
    else
        s->glru_head = seq->glru_next;
    if (seq->glru_next)
        seq->glru_next->glru_prev = seq->glru_prev;
    else
        s->glru_tail = seq->glru_prev;
    seq->glru_prev = seq->glru_next = NULL;
    seq->in_glru = false;
    s->gpu_seqs--;
}

static void glru_push_front(dqd_store *s, dqd_seq *seq)
{
    seq->glru_prev = NULL;
    seq->glru_next = s->glru_head;
    if (s->glru_head)
        s->glru_head->glru_prev = seq;
    s->glru_head = seq;
    if (!s->glru_tail)
        s->glru_tail = seq;
    seq->in_glru = true;
    s->gpu_seqs++;
}

static void dlru_unlink(dqd_store *s, dqd_seq *seq)
{
    if (!seq->in_dlru)
        return;
    if (seq->dlru_prev)
        seq->dlru_prev->dlru_next = seq->dlru_next;
    else
        s->dlru_head = seq->dlru_next;
    if (seq->dlru_next)
        seq->dlru_next->dlru_prev = seq->dlru_prev;
    else
        s->dlru_tail = seq->dlru_prev;
    seq->dlru_prev = seq->dlru_next = NULL;
    seq->in_dlru = false;
}

static void dlru_push_front(dqd_store *s, dqd_seq *seq)
{
    seq->dlru_prev = NULL;
    seq->dlru_next = s->dlru_head;
    if (s->dlru_head)
        s->dlru_head->dlru_prev = seq;
    s->dlru_head = seq;
    if (!s->dlru_tail)
        s->dlru_tail = seq;
    seq->in_dlru = true;
}

static void account_sub(dqd_store *s, const dqd_seq *seq)
{
    s->token_layers -= seq->token_layers;
    s->stored_bytes -= seq->stored_bytes;
    s->bf16_bytes -= seq->token_layers * (uint64_t)seq->model->codec->n * 4u;
    s->seq_bytes -= seq->bytes;
}

static void account_add(dqd_store *s, const dqd_seq *seq)
{
    s->token_layers += seq->token_layers;
    s->stored_bytes += seq->stored_bytes;
    s->bf16_bytes += seq->token_layers * (uint64_t)seq->model->codec->n * 4u;
    s->seq_bytes += seq->bytes;
}

/* Lets go of seq's record: its file is removed, unless the store is closing (records outlive it). */
static void forget_record(dqd_store *s, dqd_seq *seq)
{
    if (!seq->drec)
        return;
    dlru_unlink(s, seq);
    s->disk_used -= seq->disk_bytes;
    s->disk_records--;
    s->dops.forget(s->darg, seq, !s->closing);
    assert(!seq->drec);
    seq->disk_bytes = 0;
    seq->overhead -= seq->drec_cost;
    seq->bytes -= seq->drec_cost;
    s->seq_bytes -= seq->drec_cost;
    seq->drec_cost = 0;
}

/* Takes seq out of the hash table and LRU lists and out of the totals. */
static void unindex(dqd_store *s, dqd_seq *seq)
{
    if (!seq->in_index)
        return;
    dqd_seq **pp = &s->buckets[seq->hash & (s->nbuckets - 1)];
    while (*pp != seq)
        pp = &(*pp)->hnext;
    *pp = seq->hnext;
    seq->hnext = NULL;
    lru_unlink(s, seq);
    glru_unlink(s, seq);
    forget_record(s, seq);
    s->disk_stubs -= seq->on_disk;
    account_sub(s, seq);
    if (seq->pinned)
        s->pinned--;
    s->count--;
    s->chunks -= seq->kind == DQD_KIND_CHUNK;
    seq->in_index = false;
}

void dqd_store_destroy(dqd_store *s)
{
    if (!s)
        return;
    /* Every reservation (PUT, ATTEND, moves between tiers, spills) has been released by now. */
    assert(s->reserved == 0 && s->gpu_reserved == 0 && s->spilling == 0 && s->disk_reserved == 0);
    s->closing = true;
    /* Sequences let go of their prefix chunks first, whatever the order below frees them in. */
    for (size_t b = 0; b < s->nbuckets; b++)
        for (dqd_seq *seq = s->buckets[b]; seq; seq = seq->hnext)
            drop_prefix(seq);
    for (size_t b = 0; b < s->nbuckets; b++) {
        while (s->buckets[b]) {
            dqd_seq *seq = s->buckets[b];
            if (seq->refs)
                DQD_WARN("sequence still referenced (%d) at shutdown", seq->refs);
            unindex(s, seq);
            seq_free(s, seq);
        }
    }
    free(s->buckets);
    free(s);
}

static bool seq_matches(const dqd_seq *seq, uint64_t h, const char *ns, size_t ns_len, const uint8_t *key,
                        size_t key_len, uint8_t kind)
{
    return seq->hash == h && seq->kind == kind && seq->ns_len == ns_len && seq->key_len == key_len &&
           memcmp(seq->ns, ns, ns_len) == 0 && memcmp(seq->key, key, key_len) == 0;
}

dqd_seq *dqd_store_lookup(dqd_store *s, const char *ns, size_t ns_len, const uint8_t *key, size_t key_len)
{
    return dqd_store_lookup_kind(s, ns, ns_len, key, key_len, DQD_KIND_SEQUENCE);
}

dqd_seq *dqd_store_lookup_kind(dqd_store *s, const char *ns, size_t ns_len, const uint8_t *key, size_t key_len,
                               uint8_t kind)
{
    if (!ns)
        ns = "";
    uint64_t h = seq_hash(ns, ns_len, key, key_len, kind);
    for (dqd_seq *seq = s->buckets[h & (s->nbuckets - 1)]; seq; seq = seq->hnext) {
        if (seq_matches(seq, h, ns, ns_len, key, key_len, kind)) {
            seq->refs++;
            return seq;
        }
    }
    return NULL;
}

static void grow_buckets(dqd_store *s)
{
    size_t n = s->nbuckets * 2;
    dqd_seq **b = calloc(n, sizeof *b);
    if (!b)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (dqd_seq *seq = s->buckets[i], *next; seq; seq = next) {
            next = seq->hnext;
            seq->hnext = b[seq->hash & (n - 1)];
            b[seq->hash & (n - 1)] = seq;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
}

int dqd_store_insert(dqd_store *s, const char *ns, size_t ns_len, const uint8_t *key, size_t key_len, dqd_model *model,
                     dqd_seq **out)
{
    return dqd_store_insert_kind(s, ns, ns_len, key, key_len, DQD_KIND_SEQUENCE, model, out);
}

int dqd_store_insert_kind(dqd_store *s, const char *ns, size_t ns_len, const uint8_t *key, size_t key_len, uint8_t kind,
                          dqd_model *model, dqd_seq **out)
{
    if (!ns)
        ns = "";
    dqd_seq *old = dqd_store_lookup_kind(s, ns, ns_len, key, key_len, kind);
    if (old) {
        dqd_seq_unref(old);
        return DQ_EXISTS;
    }
    uint64_t overhead = dqd_hostmem_cost(sizeof(dqd_seq)) + dqd_hostmem_cost(ns_len + 1) + dqd_hostmem_cost(key_len) +
                        dqd_hostmem_cost((size_t)model->layers * sizeof(dq_layer *));
    /* No eviction for these few bytes: the PUT creating the sequence reserves what it needs next,
     * and if that fails the sequence goes again, leaving every other sequence in place. */
    dqd_seq *seq = dqd_hostmem_calloc(s->mem, sizeof *seq);
    if (seq) {
        seq->ns = dqd_hostmem_alloc(s->mem, ns_len + 1);
        seq->key = dqd_hostmem_alloc(s->mem, key_len);
        seq->layers = dqd_hostmem_calloc(s->mem, (size_t)model->layers * sizeof(dq_layer *));
    }
    if (!seq || !seq->ns || !seq->key || !seq->layers) {
        if (seq) {
            dqd_hostmem_free(s->mem, seq->ns);
            dqd_hostmem_free(s->mem, seq->key);
            dqd_hostmem_free(s->mem, seq->layers);
            dqd_hostmem_free(s->mem, seq);
        }
        return DQ_NOMEM;
    }
    memcpy(seq->ns, ns, ns_len);
    seq->ns[ns_len] = 0;
    seq->ns_len = ns_len;
    memcpy(seq->key, key, key_len);
    seq->key_len = key_len;
    seq->kind = kind;
    seq->hash = seq_hash(ns, ns_len, key, key_len, kind);
    seq->store = s;
    seq->model = model;
    model->seqs++;
    seq->overhead = overhead;
    seq->bytes = overhead;
    seq->refs = 1;
    seq->in_index = true;

    if (s->count >= s->nbuckets)
        grow_buckets(s);
    dqd_seq **bucket = &s->buckets[seq->hash & (s->nbuckets - 1)];
    seq->hnext = *bucket;
    *bucket = seq;
    lru_push_front(s, seq);
    s->count++;
    s->chunks += kind == DQD_KIND_CHUNK;
    account_add(s, seq);
    *out = seq;
    return DQ_OK;
}

void dqd_seq_ref(dqd_seq *seq)
{
    seq->refs++;
}

void dqd_seq_unref(dqd_seq *seq)
{
    if (!seq)
        return;
    if (--seq->refs == 0 && !seq->in_index)
        seq_free(seq->store, seq);
}

bool dqd_seq_alive(const dqd_seq *seq)
{
    return seq->in_index && seq->visible;
}

static bool compatible(const dqd_seq *seq, dqd_access mode)
{
    return mode == DQD_ACCESS_READ ? !seq->writer : !seq->writer && seq->readers == 0;
}

static void take(dqd_seq *seq, dqd_access mode)
{
    if (mode == DQD_ACCESS_READ)
        seq->readers++;
    else
        seq->writer = true;
}

/* Whether w must wait for seq's layers to be read back from disk. */
static bool needs_load(const dqd_seq *seq, const dqd_waiter *w)
{
    return seq->on_disk && seq->in_index && !w->no_load;
}

static bool idle(const dqd_seq *seq)
{
    return !seq->writer && seq->readers == 0;
}

static void start_load(dqd_store *s, dqd_seq *seq);

bool dqd_seq_acquire(dqd_seq *seq, dqd_waiter *w)
{
    w->next = NULL;
    if (!seq->wait_head && compatible(seq, w->mode) && !needs_load(seq, w)) {
        take(seq, w->mode);
        return true;
    }
    if (seq->wait_tail)
        seq->wait_tail->next = w;
    else
        seq->wait_head = w;
    seq->wait_tail = w;
    /* First in line for a stub: read it back; the load's end grants w. Nothing touches w after. */
    if (seq->wait_head == w && needs_load(seq, w) && idle(seq))
        start_load(seq->store, seq);
    return false;
}

/* Runs granted callbacks one after another, never nested: a callback that releases access (and so
 * grants more) only queues them here, so a long queue of quick requests cannot grow the stack. */
static void run_ready(dqd_store *s)
{
    if (s->granting)
        return;
    s->granting = true;
    while (s->ready_head) {
        dqd_waiter *w = s->ready_head;
        s->ready_head = w->next;
        if (!s->ready_head)
            s->ready_tail = NULL;
        w->next = NULL;
        w->granted(w);
    }
    s->granting = false;
}

void dqd_seq_release(dqd_seq *seq, dqd_access mode)
{
    dqd_store *s = seq->store;
    if (mode == DQD_ACCESS_READ)
        seq->readers--;
    else
        seq->writer = false;
    while (seq->wait_head && compatible(seq, seq->wait_head->mode)) {
        if (needs_load(seq, seq->wait_head)) {
            if (idle(seq))
                start_load(s, seq);
            break;
        }
        dqd_waiter *w = seq->wait_head;
        seq->wait_head = w->next;
        if (!seq->wait_head)
            seq->wait_tail = NULL;
        take(seq, w->mode);
        w->next = NULL;
        if (s->ready_tail)
            s->ready_tail->next = w;
        else
            s->ready_head = w;
        s->ready_tail = w;
    }
    run_ready(s);
}

static void recount(dqd_store *s, dqd_seq *seq);

/* Sequences holding GPU layers belong to the GPU tier's eviction (see store.h). */
static bool evictable(const dqd_seq *seq, const dqd_seq *keep)
{
    return seq != keep && seq->refs == 0 && !seq->pinned && seq->visible && seq->in_index && !seq->moving &&
           seq->gpu_bytes == 0 && seq->in_lru;
}

/* Host bytes in use or promised: what the spills in progress will free counts as free already. */
static uint64_t committed(const dqd_store *s)
{
    uint64_t used = dqd_hostmem_used(s->mem);
    used = used > s->spilling ? used - s->spilling : 0;
    return used + s->reserved;
}

static uint64_t available(const dqd_store *s)
{
    uint64_t used = committed(s);
    return used < s->budget ? s->budget - used : 0;
}

/* Frees a resident sequence's layers: it stays in the index, on disk only. */
static void make_stub(dqd_store *s, dqd_seq *seq)
{
    for (uint32_t i = 0; i < seq->model->layers; i++) {
        dq_layer_free(seq->layers[i]);
        seq->layers[i] = NULL;
    }
    lru_unlink(s, seq);
    seq->on_disk = true;
    s->disk_stubs++;
    recount(s, seq);
}

static bool start_spill(dqd_store *s, dqd_seq *seq);

static void evict(dqd_store *s, dqd_seq *seq)
{
    DQD_DEBUG("evicting sequence ns='%s' (%llu bytes, %llu token-layers)", seq->ns, (unsigned long long)seq->bytes,
              (unsigned long long)seq->token_layers);
    s->evictions++;
    s->evicted_bytes += seq->bytes;
    if (s->disk_on && seq->gpu_bytes == 0) {
        if (seq->drec) {
            s->disk_clean_evictions++;
            make_stub(s, seq);
            return;
        }
        if (start_spill(s, seq))
            return;
    }
    unindex(s, seq);
    seq_free(s, seq);
}

int dqd_store_reserve(dqd_store *s, uint64_t need, const dqd_seq *requester)
{
    uint64_t avail = available(s);
    if (need <= avail) {
        s->reserved += need;
        return DQ_OK;
    }
    /* Plan first: evict only if the candidates can make enough room. */
    uint64_t could = 0;
    for (dqd_seq *seq = s->lru_tail; seq && avail + could < need; seq = seq->lru_prev)
        if (evictable(seq, requester))
            could += s->disk_on ? seq->bytes - seq->overhead : seq->bytes; /* a spill leaves a stub */
    if (avail + could < need)
        return DQ_RESOURCE_EXHAUSTED;
    for (dqd_seq *seq = s->lru_tail; seq && available(s) < need;) {
        dqd_seq *prev = seq->lru_prev;
        if (evictable(seq, requester))
            evict(s, seq);
        seq = prev;
    }
    if (available(s) < need) {
        /* The estimates of what the victims held were high; nothing more can be freed. */
        DQD_WARN("eviction freed less than planned; %llu bytes short", (unsigned long long)(need - available(s)));
        return DQ_RESOURCE_EXHAUSTED;
    }
    s->reserved += need;
    return DQ_OK;
}

void dqd_store_unreserve(dqd_store *s, uint64_t need)
{
    assert(need <= s->reserved && "host memory released that was never reserved");
    s->reserved -= need;
}

void dqd_store_enforce(dqd_store *s, const dqd_seq *keep)
{
    for (dqd_seq *seq = s->lru_tail; seq && committed(s) > s->budget;) {
        dqd_seq *prev = seq->lru_prev;
        if (evictable(seq, keep))
            evict(s, seq);
        seq = prev;
    }
}

/* Recomputes a sequence's accounting from its layers in both tiers. */
static void recount(dqd_store *s, dqd_seq *seq)
{
    account_sub(s, seq);
    const dqd_codec *codec = seq->model->codec;
    uint64_t bytes = seq->overhead, stored = 0, tl = 0, gpu = 0;
    uint32_t host = 0;
    for (uint32_t i = 0; i < seq->model->layers; i++) {
        const dq_layer *l = seq->layers[i];
        const dqd_glayer *g = dqd_seq_glayer(seq, i);
        if (l) {
            bytes += dq_layer_allocated_bytes(l) + (dq_layer_window_count(l) + 4) * (uint64_t)ALLOC_SLACK;
            stored += dq_layer_stored_bytes(l);
            tl += dq_layer_tokens(l);
            host++;
        } else if (g) {
            bytes += dqd_glayer_host_bytes(g);
            stored += dqd_glayer_stored_bytes(g, codec->window_bytes, codec->n);
            tl += dqd_glayer_tokens(g);
            gpu += g->dev_bytes;
        }
    }
    seq->bytes = bytes;
    seq->stored_bytes = stored;
    seq->token_layers = tl;
    seq->host_layers = host;
    s->gpu_used = s->gpu_used - seq->gpu_bytes + gpu;
    seq->gpu_bytes = gpu;
    account_add(s, seq);
    if (seq->in_index && gpu && !seq->in_glru)
        glru_push_front(s, seq);
    else if (!gpu)
        glru_unlink(s, seq);
}

void dqd_store_commit(dqd_store *s, dqd_seq *seq)
{
    if (!seq->in_index)
        return;
    forget_record(s, seq); /* written to: the record on disk is stale */
    recount(s, seq);
    seq->visible = true;
    dqd_store_touch(s, seq);
}

void dqd_store_touch(dqd_store *s, dqd_seq *seq)
{
    if (!seq->in_index)
        return;
    if (seq->in_lru && s->lru_head != seq) {
        lru_unlink(s, seq);
        lru_push_front(s, seq);
    }
    if (seq->in_dlru && s->dlru_head != seq) {
        dlru_unlink(s, seq);
        dlru_push_front(s, seq);
    }
    if (seq->in_glru && s->glru_head != seq) {
        glru_unlink(s, seq);
        glru_push_front(s, seq);
    }
}

void dqd_store_remove(dqd_store *s, dqd_seq *seq)
{
    unindex(s, seq);
    if (seq->refs == 0)
        seq_free(s, seq);
}

void dqd_store_set_pinned(dqd_store *s, dqd_seq *seq, bool pinned)
{
    if (seq->pinned == pinned)
        return;
    seq->pinned = pinned;
    if (seq->in_index)
        s->pinned += pinned ? 1 : (uint64_t)-1;
}

int dqd_store_set_prefix(dqd_store *s, dqd_seq *seq, dqd_seq *const *chunks, uint32_t n)
{
    (void)s;
    assert(!seq->prefix);
    seq->prefix = malloc((n ? n : 1) * sizeof *seq->prefix);
    if (!seq->prefix)
        return DQ_NOMEM;
    for (uint32_t i = 0; i < n; i++) {
        dqd_seq_ref(chunks[i]);
        chunks[i]->prefix_users++;
        seq->prefix[i] = chunks[i];
    }
    seq->nprefix = n;
    return DQ_OK;
}

void dqd_store_get_stats(const dqd_store *s, dqd_store_stats *out)
{
    out->sequences = s->count;
    out->chunks = s->chunks;
    out->pinned = s->pinned;
    out->token_layers = s->token_layers;
    out->stored_bytes = s->stored_bytes;
    out->bf16_bytes = s->bf16_bytes;
    out->seq_bytes = s->seq_bytes;
    out->used = dqd_hostmem_used(s->mem);
    out->budget = s->budget;
    out->reserved = s->reserved;
    out->evictions = s->evictions;
    out->evicted_bytes = s->evicted_bytes;
    out->gpu_used = s->gpu_used;
    out->gpu_budget = s->gpu_budget;
    out->gpu_reserved = s->gpu_reserved;
    out->gpu_sequences = s->gpu_seqs;
    out->gpu_demotions = s->gpu_demotions;
    out->gpu_promotions = s->gpu_promotions;
    out->gpu_drops = s->gpu_drops;
    out->gpu_spills = s->gpu_spills;
    out->disk_records = s->disk_records;
    out->disk_bytes = s->disk_used;
    out->disk_capacity = s->disk_capacity;
    out->disk_reserved = s->disk_reserved;
    out->disk_stubs = s->disk_stubs;
    out->disk_spills = s->disk_spills;
    out->disk_spill_bytes = s->disk_spill_bytes;
    out->disk_clean_evictions = s->disk_clean_evictions;
    out->disk_spill_failures = s->disk_spill_failures;
    out->disk_full_drops = s->disk_full_drops;
    out->disk_loads = s->disk_loads;
    out->disk_load_bytes = s->disk_load_bytes;
    out->disk_corrupt = s->disk_corrupt;
    out->disk_load_failures = s->disk_load_failures;
    out->disk_evictions = s->disk_evictions;
    out->disk_recovered = s->disk_recovered;
}

uint64_t dqd_store_budget(const dqd_store *s)
{
    return s->budget;
}

/* Appending ntok tokens to a host layer of t0 tokens (exists: else a new layer). */
static uint64_t append_need(const dqd_codec *codec, uint64_t t0, bool exists, uint64_t ntok)
{
    const dq_profile *p = &codec->profile;
    uint64_t w0 = dqd_sealed_windows(t0, p->window, p->residual);
    uint64_t w1 = dqd_sealed_windows(t0 + ntok, p->window, p->residual);
    uint64_t need = (w1 - w0) * (codec->window_bytes + ALLOC_SLACK);
    if (w1 > w0)
        need += 2 * w1 * sizeof(void *) + 2 * ALLOC_SLACK; /* the window pointer array may regrow */
    if (!exists)
        need += (uint64_t)p->residual * codec->n * 2u * 2u + LAYER_FIXED + 4 * ALLOC_SLACK;
    return need;
}

uint64_t dqd_store_append_need(const dqd_codec *codec, const dq_layer *layer, uint64_t ntok)
{
    return append_need(codec, layer ? dq_layer_tokens(layer) : 0, layer != NULL, ntok);
}

uint64_t dqd_store_spill_need(const dqd_codec *codec, const dqd_glayer *g, uint64_t ntok)
{
    return dqd_store_restore_need(codec, g->nwin) + append_need(codec, dqd_glayer_tokens(g), true, ntok);
}

uint64_t dqd_store_restore_need(const dqd_codec *codec, uint64_t nwin)
{
    const dq_profile *p = &codec->profile;
    return nwin * (codec->window_bytes + ALLOC_SLACK) + nwin * sizeof(void *) +
           (uint64_t)p->residual * codec->n * 2u * 2u + LAYER_FIXED + 4 * ALLOC_SLACK;
}

/* ---- layers in either tier ---- */

uint64_t dqd_seq_layer_tokens(const dqd_seq *seq, uint32_t i)
{
    const dqd_glayer *g = dqd_seq_glayer(seq, i);
    if (g)
        return dqd_glayer_tokens(g);
    return seq->layers[i] ? dq_layer_tokens(seq->layers[i]) : 0;
}

uint64_t dqd_seq_layer_windows(const dqd_seq *seq, uint32_t i)
{
    const dqd_glayer *g = dqd_seq_glayer(seq, i);
    if (g)
        return g->nwin;
    return seq->layers[i] ? dq_layer_window_count(seq->layers[i]) : 0;
}

uint64_t dqd_seq_layer_tail(const dqd_seq *seq, uint32_t i)
{
    const dqd_glayer *g = dqd_seq_glayer(seq, i);
    if (g)
        return g->tail;
    return seq->layers[i] ? dq_layer_tail_tokens(seq->layers[i]) : 0;
}

/* ---- GPU tier ---- */

void dqd_store_gpu_enable(dqd_store *s, uint64_t budget, void (*free_layers)(void *arg, dqd_seq *seq), void *arg)
{
    s->gpu_on = true;
    s->gpu_budget = budget;
    s->gpu_free = free_layers;
    s->gpu_ctx = arg;
}

bool dqd_store_gpu_enabled(const dqd_store *s)
{
    return s->gpu_on;
}

int dqd_store_gpu_slots(dqd_store *s, dqd_seq *seq)
{
    if (seq->glayers)
        return DQ_OK;
    size_t bytes = (size_t)seq->model->layers * sizeof(dqd_glayer *);
    seq->glayers = dqd_hostmem_calloc(s->mem, bytes);
    if (!seq->glayers)
        return DQ_NOMEM;
    seq->overhead += dqd_hostmem_cost(bytes);
    return DQ_OK;
}

static uint64_t gpu_available(const dqd_store *s)
{
    uint64_t used = s->gpu_used + s->gpu_reserved;
    return used < s->gpu_budget ? s->gpu_budget - used : 0;
}

static bool gpu_evictable(const dqd_seq *seq)
{
    return seq->refs == 0 && !seq->pinned && seq->visible && seq->in_index && !seq->moving && seq->gpu_bytes;
}

static bool moves_push(dqd_gpu_moves *mv, dqd_seq *seq)
{
    if (mv->n == mv->cap) {
        size_t cap = mv->cap ? mv->cap * 2 : 4;
        dqd_seq **seqs = realloc(mv->seqs, cap * sizeof *seqs);
        if (!seqs)
            return false;
        mv->seqs = seqs;
        int *rc = realloc(mv->rc, cap * sizeof *rc);
        if (!rc)
            return false;
        mv->rc = rc;
        mv->cap = cap;
    }
    mv->seqs[mv->n] = seq;
    mv->rc[mv->n] = 1;
    mv->n++;
    return true;
}

/* A GPU victim goes to the host tier when its layers fit there (taken exclusively for the mover),
 * else it is dropped now. */
static void gpu_evict(dqd_store *s, dqd_seq *seq, dqd_gpu_moves *mv)
{
    uint64_t host_need = 0;
    for (uint32_t i = 0; i < seq->model->layers; i++) {
        const dqd_glayer *g = dqd_seq_glayer(seq, i);
        if (g)
            host_need += dqd_store_restore_need(seq->model->codec, g->nwin);
    }
    if (dqd_store_reserve(s, host_need, seq) == DQ_OK) {
        if (moves_push(mv, seq)) {
            seq->refs++;
            seq->writer = true;
            seq->moving = true;
            seq->move_reserved = host_need;
            return;
        }
        dqd_store_unreserve(s, host_need);
    }
    DQD_DEBUG("GPU eviction drops sequence ns='%s' (%llu device bytes): no host room", seq->ns,
              (unsigned long long)seq->gpu_bytes);
    s->gpu_drops++;
    evict(s, seq);
}

int dqd_store_gpu_reserve(dqd_store *s, uint64_t need, dqd_gpu_moves *mv)
{
    uint64_t avail = gpu_available(s);
    if (need <= avail) {
        s->gpu_reserved += need;
        return DQ_OK;
    }
    uint64_t could = 0;
    for (dqd_seq *seq = s->glru_tail; seq && avail + could < need; seq = seq->glru_prev)
        if (gpu_evictable(seq))
            could += seq->gpu_bytes;
    if (avail + could < need)
        return DQ_RESOURCE_EXHAUSTED;
    /* A victim moving to the host still holds its device memory until the caller's mover has run,
     * and the caller allocates only after that: count its bytes as freed for this reservation. */
    uint64_t freed = 0;
    for (dqd_seq *seq = s->glru_tail; seq && avail + freed < need;) {
        dqd_seq *prev = seq->glru_prev;
        if (gpu_evictable(seq)) {
            uint64_t gb = seq->gpu_bytes;
            gpu_evict(s, seq, mv);
            freed += gb;
        }
        seq = prev;
    }
    s->gpu_reserved += need;
    return DQ_OK;
}

void dqd_store_gpu_unreserve(dqd_store *s, uint64_t need)
{
    assert(need <= s->gpu_reserved && "GPU memory released that was never reserved");
    s->gpu_reserved -= need;
}

void dqd_store_gpu_moves_finish(dqd_store *s, dqd_gpu_moves *mv)
{
    for (size_t i = 0; i < mv->n; i++) {
        dqd_seq *seq = mv->seqs[i];
        dqd_store_unreserve(s, seq->move_reserved);
        seq->move_reserved = 0;
        seq->moving = false;
        if (mv->rc[i] == 0) {
            s->gpu_demotions++;
            if (seq->in_index)
                recount(s, seq);
        } else if (mv->rc[i] < 0 && seq->in_index) {
            DQD_WARN("moving sequence ns='%s' to host memory failed (%s); dropping it", seq->ns,
                     dq_strerror(mv->rc[i]));
            s->gpu_drops++;
            s->evictions++;
            s->evicted_bytes += seq->bytes;
            unindex(s, seq);
        }
        dqd_seq_release(seq, DQD_ACCESS_WRITE);
        dqd_seq_unref(seq);
    }
    free(mv->seqs);
    free(mv->rc);
    memset(mv, 0, sizeof *mv);
}

void dqd_store_gpu_promoted(dqd_store *s, uint64_t layers)
{
    s->gpu_promotions += layers;
}

void dqd_store_gpu_spilled(dqd_store *s, uint64_t layers)
{
    s->gpu_spills += layers;
}

/* ---- disk tier ---- */

void dqd_store_disk_enable(dqd_store *s, uint64_t capacity, const dqd_store_disk_ops *ops, void *arg)
{
    s->disk_on = true;
    s->disk_capacity = capacity;
    s->dops = *ops;
    s->darg = arg;
}

bool dqd_store_disk_enabled(const dqd_store *s)
{
    return s->disk_on;
}

static void attach_record(dqd_store *s, dqd_seq *seq, dqd_drec *drec, uint64_t drec_cost, uint64_t bytes)
{
    assert(!seq->drec && bytes <= s->disk_reserved);
    seq->drec = drec;
    seq->drec_cost = drec_cost;
    seq->disk_bytes = bytes;
    seq->overhead += drec_cost;
    seq->bytes += drec_cost;
    s->seq_bytes += drec_cost;
    s->disk_reserved -= bytes;
    s->disk_used += bytes;
    s->disk_records++;
    dlru_push_front(s, seq);
}

/* A record that may go to make room: not being written or read; a stub only when nothing refers to
 * it (a request, a lease, a sequence built on the chunk). */
static bool disk_victim(const dqd_seq *seq)
{
    if (seq->loading || seq->spilling)
        return false;
    return !seq->on_disk || seq->refs == 0;
}

static void disk_evict(dqd_store *s, dqd_seq *seq)
{
    DQD_DEBUG("disk eviction of ns='%s' (%llu bytes on disk)", seq->ns, (unsigned long long)seq->disk_bytes);
    s->disk_evictions++;
    if (seq->on_disk) {
        unindex(s, seq);
        seq_free(s, seq);
    } else {
        forget_record(s, seq);
    }
}

int dqd_store_disk_reserve(dqd_store *s, uint64_t bytes)
{
    if (bytes > s->disk_capacity)
        return DQ_RESOURCE_EXHAUSTED;
    const uint64_t limit = s->disk_capacity - bytes;
    if (s->disk_used + s->disk_reserved > limit) {
        uint64_t could = 0;
        for (dqd_seq *seq = s->dlru_tail; seq && s->disk_used + s->disk_reserved > limit + could; seq = seq->dlru_prev)
            if (disk_victim(seq))
                could += seq->disk_bytes;
        if (s->disk_used + s->disk_reserved > limit + could)
            return DQ_RESOURCE_EXHAUSTED;
        for (dqd_seq *seq = s->dlru_tail; seq && s->disk_used + s->disk_reserved > limit;) {
            dqd_seq *prev = seq->dlru_prev; /* in the index, so not freed by the eviction below */
            if (disk_victim(seq))
                disk_evict(s, seq);
            seq = prev;
        }
    }
    s->disk_reserved += bytes;
    return DQ_OK;
}

void dqd_store_disk_unreserve(dqd_store *s, uint64_t bytes)
{
    assert(bytes <= s->disk_reserved && "disk capacity released that was never reserved");
    s->disk_reserved -= bytes;
}

static bool start_spill(dqd_store *s, dqd_seq *seq)
{
    seq->spilling = true;
    seq->writer = true;
    seq->refs++;
    seq->spill_frees = seq->bytes - seq->overhead;
    s->spilling += seq->spill_frees;
    lru_unlink(s, seq);
    int rc = s->dops.spill(s->darg, seq);
    if (rc == DQ_OK)
        return true; /* it may have finished already: seq is not touched any more here */
    s->spilling -= seq->spill_frees;
    seq->spill_frees = 0;
    seq->spilling = false;
    seq->writer = false;
    seq->refs--;
    if (rc == DQ_RESOURCE_EXHAUSTED)
        s->disk_full_drops++;
    else
        s->disk_spill_failures++;
    DQD_DEBUG("spilling ns='%s' failed to start (%s); dropping it", seq->ns, dq_strerror(rc));
    return false;
}

void dqd_store_spill_done(dqd_store *s, dqd_seq *seq, int rc, dqd_drec *drec, uint64_t drec_cost, uint64_t bytes)
{
    assert(seq->spilling);
    s->spilling -= seq->spill_frees;
    seq->spill_frees = 0;
    seq->spilling = false;
    if (rc == DQ_OK) {
        attach_record(s, seq, drec, drec_cost, bytes);
        s->disk_spills++;
        s->disk_spill_bytes += bytes;
        if (seq->in_index)
            make_stub(s, seq);
        else
            forget_record(s, seq);
    } else {
        dqd_store_disk_unreserve(s, bytes);
        s->disk_spill_failures++;
        DQD_WARN("writing ns='%s' to disk failed (%s); evicted without a record", seq->ns, dq_strerror(rc));
        unindex(s, seq);
    }
    dqd_seq_release(seq, DQD_ACCESS_WRITE);
    dqd_seq_unref(seq);
}

static void start_load(dqd_store *s, dqd_seq *seq)
{
    seq->loading = true;
    seq->writer = true;
    seq->refs++;
    int rc = s->dops.load(s->darg, seq);
    if (rc < 0)
        dqd_store_load_done(s, seq, rc, NULL);
}

void dqd_store_load_done(dqd_store *s, dqd_seq *seq, int rc, dq_layer **layers)
{
    assert(seq->loading && seq->on_disk);
    seq->loading = false;
    if (rc == DQ_OK && seq->in_index) {
        for (uint32_t i = 0; i < seq->model->layers; i++)
            seq->layers[i] = layers[i];
        seq->on_disk = false;
        s->disk_stubs--;
        lru_push_front(s, seq);
        recount(s, seq);
        dqd_store_touch(s, seq);
        s->disk_loads++;
        s->disk_load_bytes += seq->disk_bytes;
    } else {
        for (uint32_t i = 0; layers && i < seq->model->layers; i++)
            dq_layer_free(layers[i]);
        if (rc == DQ_CORRUPT)
            s->disk_corrupt++;
        else
            s->disk_load_failures++;
        DQD_WARN("reading ns='%s' back from disk failed (%s); dropping it", seq->ns,
                 rc < 0 ? dq_strerror(rc) : "deleted meanwhile");
        unindex(s, seq);
    }
    dqd_seq_release(seq, DQD_ACCESS_WRITE);
    dqd_seq_unref(seq);
}

void dqd_seq_prefetch(dqd_seq *seq)
{
    if (seq->on_disk && seq->in_index && idle(seq) && !seq->wait_head)
        start_load(seq->store, seq);
}

void dqd_store_disk_attach(dqd_store *s, dqd_seq *seq, dqd_drec *drec, uint64_t drec_cost, uint64_t bytes, bool stub)
{
    attach_record(s, seq, drec, drec_cost, bytes);
    if (stub) {
        assert(!seq->visible && seq->token_layers == 0);
        lru_unlink(s, seq);
        seq->on_disk = true;
        s->disk_stubs++;
        seq->visible = true;
        recount(s, seq);
    }
}

void dqd_store_disk_counted(dqd_store *s, uint64_t corrupt, uint64_t recovered)
{
    s->disk_corrupt += corrupt;
    s->disk_recovered += recovered;
}

void dqd_store_foreach_resident(dqd_store *s, void (*fn)(void *arg, dqd_seq *seq), void *arg)
{
    for (dqd_seq *seq = s->lru_tail; seq;) {
        dqd_seq *prev = seq->lru_prev;
        if (seq->visible && seq->in_index)
            fn(arg, seq);
        seq = prev;
    }
}
