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

/* Takes seq out of the hash table and LRU list and out of the totals. */
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
    /* Every reservation (PUT, ATTEND, moves between tiers) has been released by now. */
    assert(s->reserved == 0 && s->gpu_reserved == 0);
    /* Sequences let go of their prefix chunks first, whatever the order below frees them in. */
    for (dqd_seq *seq = s->lru_head; seq; seq = seq->lru_next)
        drop_prefix(seq);
    while (s->lru_head) {
        dqd_seq *seq = s->lru_head;
        if (seq->refs)
            DQD_WARN("sequence still referenced (%d) at shutdown", seq->refs);
        unindex(s, seq);
        seq_free(s, seq);
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

bool dqd_seq_acquire(dqd_seq *seq, dqd_waiter *w)
{
    w->next = NULL;
    if (!seq->wait_head && compatible(seq, w->mode)) {
        take(seq, w->mode);
        return true;
    }
    if (seq->wait_tail)
        seq->wait_tail->next = w;
    else
        seq->wait_head = w;
    seq->wait_tail = w;
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

/* Sequences holding GPU layers belong to the GPU tier's eviction (see store.h). */
static bool evictable(const dqd_seq *seq, const dqd_seq *keep)
{
    return seq != keep && seq->refs == 0 && !seq->pinned && seq->visible && seq->in_index && !seq->moving &&
           seq->gpu_bytes == 0;
}

static uint64_t available(const dqd_store *s)
{
    uint64_t used = dqd_hostmem_used(s->mem) + s->reserved;
    return used < s->budget ? s->budget - used : 0;
}

static void evict(dqd_store *s, dqd_seq *seq)
{
    DQD_DEBUG("evicting sequence ns='%s' (%llu bytes, %llu token-layers)", seq->ns, (unsigned long long)seq->bytes,
              (unsigned long long)seq->token_layers);
    s->evictions++;
    s->evicted_bytes += seq->bytes;
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
            could += seq->bytes;
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
    for (dqd_seq *seq = s->lru_tail; seq && dqd_hostmem_used(s->mem) + s->reserved > s->budget;) {
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
    recount(s, seq);
    seq->visible = true;
    dqd_store_touch(s, seq);
}

void dqd_store_touch(dqd_store *s, dqd_seq *seq)
{
    if (!seq->in_index)
        return;
    if (s->lru_head != seq) {
        lru_unlink(s, seq);
        lru_push_front(s, seq);
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
