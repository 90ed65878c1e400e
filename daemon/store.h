/* dquantd store: sequences by (namespace, key), per layer one dq_layer, under a host-memory budget
 * with LRU eviction of idle, unpinned sequences.
 *
 * Concurrency. Everything here runs on the loop thread except the layers themselves, which worker
 * threads read (GET, ATTEND) or write (PUT, ATTEND with append) while the request holds access to
 * the sequence: shared for readers, exclusive for a writer, granted on the loop thread in arrival
 * order (FIFO per sequence, so a connection's pipelined requests on one sequence run in order).
 * Every request that names a sequence holds a reference from lookup to reply; a referenced
 * sequence is never evicted or freed.
 *
 * Visibility. A sequence is created, invisible, by its first PUT and becomes visible when that PUT
 * commits; requests that find it meanwhile queue behind the PUT and see it only committed (or gone).
 *
 * Budget. used = the counting allocator's total (codecs, workspaces, window records, tails, the
 * store's own structures); a PUT reserves its estimated need first (dqd_store_reserve), which
 * evicts least recently used idle unpinned sequences only if that makes enough room, and else fails
 * with DQ_RESOURCE_EXHAUSTED leaving every sequence in place. */
#ifndef DQD_STORE_H
#define DQD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dquant/layer.h"
#include "hostmem.h"
#include "registry.h"

typedef enum dqd_access { DQD_ACCESS_READ = 0, DQD_ACCESS_WRITE = 1 } dqd_access;

/* A request waiting for access; granted() runs on the loop thread once access is held. */
typedef struct dqd_waiter {
    struct dqd_waiter *next;
    dqd_access mode;
    void (*granted)(struct dqd_waiter *w);
} dqd_waiter;

typedef struct dqd_store dqd_store;

typedef struct dqd_seq {
    dqd_store *store;
    char *ns;
    size_t ns_len;
    uint8_t *key;
    size_t key_len;
    uint64_t hash;
    dqd_model *model;
    dq_layer **layers;          /* [model->layers]; NULL for a layer never written */

    /* accounting as of the last commit */
    uint64_t bytes;             /* what evicting it frees, allocator headers included */
    uint64_t stored_bytes;      /* Σ dq_layer_stored_bytes */
    uint64_t token_layers;      /* Σ dq_layer_tokens */
    uint64_t overhead;          /* this struct, ns, key, layer array */

    int refs;
    int readers;
    bool writer;
    bool pinned;
    bool visible;               /* committed at least once */
    bool in_index;              /* false once deleted or evicted */
    dqd_waiter *wait_head, *wait_tail;
    struct dqd_seq *hnext, *lru_prev, *lru_next;
} dqd_seq;

typedef struct dqd_store_stats {
    uint64_t sequences, pinned;
    uint64_t token_layers;      /* tokens stored, summed over layers */
    uint64_t stored_bytes;      /* window records + BF16 tails in use */
    uint64_t bf16_bytes;        /* the same tokens as BF16 K and V */
    uint64_t seq_bytes;         /* Σ sequence bytes (what eviction could free) */
    uint64_t used, budget, reserved;
    uint64_t evictions, evicted_bytes;
} dqd_store_stats;

int dqd_store_create(dqd_hostmem *mem, uint64_t budget, dqd_store **out);
/* Frees every sequence; none may be referenced. */
void dqd_store_destroy(dqd_store *s);

/* The sequence for (ns, key), visible or being created, with a reference; NULL if none. */
dqd_seq *dqd_store_lookup(dqd_store *s, const char *ns, size_t ns_len, const uint8_t *key, size_t key_len);
/* Creates an invisible sequence of model with a reference. It never evicts: its few bytes are
 * counted, and the creating PUT reserves the rest. DQ_EXISTS if (ns, key) is taken, DQ_NOMEM. */
int dqd_store_insert(dqd_store *s, const char *ns, size_t ns_len, const uint8_t *key, size_t key_len,
                     dqd_model *model, dqd_seq **out);
void dqd_seq_ref(dqd_seq *seq);
/* Drops a reference; a sequence out of the index is freed with its last reference. */
void dqd_seq_unref(dqd_seq *seq);
/* Visible and not deleted. */
bool dqd_seq_alive(const dqd_seq *seq);

/* Requests access. Returns true when granted at once (granted() is not called); else queues w and
 * calls w->granted later. The caller must hold a reference until it releases. */
bool dqd_seq_acquire(dqd_seq *seq, dqd_waiter *w);
void dqd_seq_release(dqd_seq *seq, dqd_access mode);

/* Reserves need bytes of budget (see above). requester is never evicted. */
int dqd_store_reserve(dqd_store *s, uint64_t need, const dqd_seq *requester);
void dqd_store_unreserve(dqd_store *s, uint64_t need);
/* Evicts idle unpinned sequences (never keep) while used exceeds the budget. */
void dqd_store_enforce(dqd_store *s, const dqd_seq *keep);

/* After a successful write: recomputes the sequence's accounting, makes it visible, marks it
 * most recently used. */
void dqd_store_commit(dqd_store *s, dqd_seq *seq);
/* Marks a sequence most recently used (reads). */
void dqd_store_touch(dqd_store *s, dqd_seq *seq);
/* Takes a sequence out of the index (DELETE, or a failed creating PUT); waiters are still granted
 * and find it !alive; freed with its last reference. */
void dqd_store_remove(dqd_store *s, dqd_seq *seq);
void dqd_store_set_pinned(dqd_store *s, dqd_seq *seq, bool pinned);

void dqd_store_get_stats(const dqd_store *s, dqd_store_stats *out);
uint64_t dqd_store_budget(const dqd_store *s);

/* Windows sealed after t tokens of a layer with window W and residual R (R >= W). */
static inline uint64_t dqd_sealed_windows(uint64_t t, uint64_t W, uint64_t R)
{
    return t < R ? 0 : (t - R) / W + 1;
}
/* Upper estimate of the bytes appending ntok tokens to layer (NULL: a new layer) allocates. */
uint64_t dqd_store_append_need(const dqd_codec *codec, const dq_layer *layer, uint64_t ntok);

#endif
