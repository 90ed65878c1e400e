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
 * with DQ_RESOURCE_EXHAUSTED leaving every sequence in place.
 *
 * GPU tier (cuda backend only; see gpulayer.h). Each layer of a sequence lives either on the host
 * (layers[i], a dq_layer) or on the GPU (glayers[i]). The GPU tier has its own budget and its own
 * LRU list of the sequences holding GPU layers, with the same pin and in-use rules. Making room on
 * the GPU (dqd_store_gpu_reserve) picks victims from the GPU LRU tail: a victim whose layers fit in
 * the host budget is handed to the caller to move to the host (its host room reserved, the sequence
 * held exclusively until dqd_store_gpu_moves_finish); one that does not fit is dropped at once (counted
 * as an eviction). Host eviction never picks a sequence holding GPU layers: its host footprint is
 * only the shadow, and the GPU tier decides its fate. The store itself never calls CUDA: freeing a
 * sequence's GPU layers goes through the hook of dqd_store_gpu_enable.
 *
 * Disk tier (--disk-dir; disktier.h does the files through the hooks of dqd_store_disk_enable).
 * Host eviction then spills instead of dropping: the victim is held exclusively while its record
 * is written (its host bytes count as free from the start), then its layers are freed and it stays
 * in the index as a stub (on_disk) with its record (drec), out of the host LRU list. A request that
 * needs the layers of a stub reads them back first: its access is granted only after a load (held
 * exclusively, host room reserved) put them back in host memory; waiters that need no layers
 * (DELETE, UNPIN, the dedupe of a chunk PUT: dqd_waiter.no_load) do not load. A loaded sequence keeps
 * its record as a clean copy (evicting it again costs no write) until its next write commits: the
 * record is removed then, before that write is acknowledged, as it is by DELETE. A spill or load
 * that fails (I/O error, ENOSPC, a checksum, no host room) drops the sequence: a miss, counted.
 * Records have their own LRU list (stubs and clean copies) and a capacity: making room for a record
 * evicts the least recently used records (stubs nothing references, clean copies of anything not
 * being spilled or loaded). */
#ifndef DQD_STORE_H
#define DQD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dquant/layer.h"
#include "gpulayer.h"
#include "hostmem.h"
#include "registry.h"

/* Kinds of store entries (SeqRef.kind): a chunk of the shared KV tier is a sequence of exactly
 * its model's chunk_tokens tokens in every layer, written once by PUT_CHUNKS. */
#define DQD_KIND_SEQUENCE 0
#define DQD_KIND_CHUNK 1

typedef enum dqd_access { DQD_ACCESS_READ = 0, DQD_ACCESS_WRITE = 1 } dqd_access;

/* A request waiting for access; granted() runs on the loop thread once access is held. */
typedef struct dqd_waiter {
    struct dqd_waiter *next;
    dqd_access mode;
    void (*granted)(struct dqd_waiter *w);
    bool no_load; /* needs no layers: a sequence on disk is not read back for it */
} dqd_waiter;

typedef struct dqd_store dqd_store;
typedef struct dqd_drec dqd_drec; /* a record of the disk tier (disktier.c) */

typedef struct dqd_seq {
    dqd_store *store;
    char *ns;
    size_t ns_len;
    uint8_t *key;
    size_t key_len;
    uint64_t hash;
    uint8_t kind; /* DQD_KIND_* */
    dqd_model *model;
    dq_layer **layers;    /* [model->layers]; NULL for a layer never written or on the GPU */
    dqd_glayer **glayers; /* [model->layers] once a layer went to the GPU; else NULL */

    /* accounting as of the last commit */
    uint64_t bytes;          /* what evicting it frees, allocator headers included */
    uint64_t stored_bytes;   /* Σ dq_layer_stored_bytes */
    uint64_t token_layers;   /* Σ dq_layer_tokens */
    uint64_t overhead;       /* this struct, ns, key, layer arrays */
    uint64_t gpu_bytes;      /* device bytes of its GPU layers */
    struct dqd_seq **prefix; /* chunks the sequence is built on (referenced), or NULL */
    uint32_t nprefix;
    uint32_t prefix_users;  /* a chunk: sequences built on it */
    uint32_t host_layers;   /* layers on the host; unlike the slots, safe to read on the loop
                               thread while a request's workers change them */
    uint64_t move_reserved; /* host budget held for its move to the host tier */

    /* disk tier */
    dqd_drec *drec;       /* its record on disk (what it holds, all of it when on_disk), or NULL */
    uint64_t disk_bytes;  /* the record's bytes on disk */
    uint64_t drec_cost;   /* host bytes of drec (in overhead) */
    uint64_t spill_frees; /* host bytes the spill in progress frees */

    int refs;
    int readers;
    bool writer;
    bool pinned;
    bool visible;  /* committed at least once */
    bool in_index; /* false once deleted or evicted */
    bool moving;   /* held by a move of its GPU layers to the host */
    bool in_glru;  /* on the GPU LRU list (holds GPU layers, in the index) */
    bool in_lru;   /* on the host LRU list (in the index, layers in memory, not spilling) */
    bool in_dlru;  /* on the disk LRU list (has a record) */
    bool on_disk;  /* a stub: its layers are on disk only (layers[] all NULL) */
    bool spilling; /* held by the write of its record */
    bool loading;  /* held by the read of its record */
    dqd_waiter *wait_head, *wait_tail;
    struct dqd_seq *hnext, *lru_prev, *lru_next;
    struct dqd_seq *glru_prev, *glru_next;
    struct dqd_seq *dlru_prev, *dlru_next;
} dqd_seq;

typedef struct dqd_store_stats {
    uint64_t sequences, pinned;
    uint64_t chunks;       /* entries of kind CHUNK (also in sequences) */
    uint64_t token_layers; /* tokens stored, summed over layers */
    uint64_t stored_bytes; /* window records + BF16 tails in use */
    uint64_t bf16_bytes;   /* the same tokens as BF16 K and V */
    uint64_t seq_bytes;    /* Σ sequence bytes (what eviction could free) */
    uint64_t used, budget, reserved;
    uint64_t evictions, evicted_bytes;
    /* GPU tier (zero on the cpu backend) */
    uint64_t gpu_used, gpu_budget, gpu_reserved;
    uint64_t gpu_sequences;  /* sequences holding GPU layers */
    uint64_t gpu_demotions;  /* sequences moved from the GPU to the host tier */
    uint64_t gpu_promotions; /* layers moved from the host to the GPU tier */
    uint64_t gpu_drops;      /* GPU sequences evicted outright (host budget full); in evictions */
    uint64_t gpu_spills;     /* layers moved to the host by a write the GPU had no room for */
    /* disk tier (zero without one) */
    uint64_t disk_records, disk_bytes, disk_capacity, disk_reserved;
    uint64_t disk_stubs;           /* entries whose layers are on disk only */
    uint64_t disk_spills;          /* records written by host eviction (and at shutdown) */
    uint64_t disk_spill_bytes;     /* their bytes */
    uint64_t disk_clean_evictions; /* host evictions that kept a clean record (no write) */
    uint64_t disk_spill_failures;  /* writes that failed (ENOSPC, EFBIG, EIO, ...): dropped */
    uint64_t disk_full_drops;      /* evictions dropped for want of disk capacity */
    uint64_t disk_loads;           /* records read back into host memory */
    uint64_t disk_load_bytes;
    uint64_t disk_corrupt;       /* records failing a checksum (read back or at start): dropped */
    uint64_t disk_load_failures; /* reads that failed otherwise (I/O error, no host room): dropped */
    uint64_t disk_evictions;     /* records removed to stay within the capacity */
    uint64_t disk_recovered;     /* records indexed at start */
} dqd_store_stats;

int dqd_store_create(dqd_hostmem *mem, uint64_t budget, dqd_store **out);
/* Frees every sequence; none may be referenced. */
void dqd_store_destroy(dqd_store *s);

/* The sequence for (ns, key), visible or being created, with a reference; NULL if none. */
dqd_seq *dqd_store_lookup(dqd_store *s, const char *ns, size_t ns_len, const uint8_t *key, size_t key_len);
/* The same for an entry of a kind (DQD_KIND_SEQUENCE or DQD_KIND_CHUNK): the kind is part of the
 * key, so a sequence key never aliases a chunk key. dqd_store_lookup/insert mean SEQUENCE. */
dqd_seq *dqd_store_lookup_kind(dqd_store *s, const char *ns, size_t ns_len, const uint8_t *key, size_t key_len,
                               uint8_t kind);
int dqd_store_insert_kind(dqd_store *s, const char *ns, size_t ns_len, const uint8_t *key, size_t key_len, uint8_t kind,
                          dqd_model *model, dqd_seq **out);
/* Creates an invisible sequence of model with a reference. It never evicts: its few bytes are
 * counted, and the creating PUT reserves the rest. DQ_EXISTS if (ns, key) is taken, DQ_NOMEM. */
int dqd_store_insert(dqd_store *s, const char *ns, size_t ns_len, const uint8_t *key, size_t key_len, dqd_model *model,
                     dqd_seq **out);
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
/* Builds seq on the chunks (n of them, prompt order): takes a reference on each (they are never
 * evicted or freed while seq exists) and counts seq as their user. DQ_NOMEM. */
int dqd_store_set_prefix(dqd_store *s, dqd_seq *seq, dqd_seq *const *chunks, uint32_t n);

void dqd_store_get_stats(const dqd_store *s, dqd_store_stats *out);
uint64_t dqd_store_budget(const dqd_store *s);

/* ---- GPU tier ---- */

/* Turns the GPU tier on with a budget (bytes of device memory for layers). free_layers(arg, seq)
 * frees every GPU layer of a sequence being freed (loop thread; nothing uses them any more). */
void dqd_store_gpu_enable(dqd_store *s, uint64_t budget, void (*free_layers)(void *arg, dqd_seq *seq), void *arg);
bool dqd_store_gpu_enabled(const dqd_store *s);

/* Gives seq its glayers array (no-op if it has one). DQ_NOMEM. */
int dqd_store_gpu_slots(dqd_store *s, dqd_seq *seq);

/* Sequences a GPU reservation moves to the host (tier.h runs the moves). rc[i] starts at 1
 * (not moved); the mover sets 0 (moved) or an error (the sequence is then dropped). */
typedef struct dqd_gpu_moves {
    dqd_seq **seqs;
    int *rc;
    size_t n, cap;
} dqd_gpu_moves;

/* Reserves need bytes of GPU budget, making room as described at the top when needed; the victims
 * to move are appended to mv (which the caller zero-initializes and finishes with
 * dqd_store_gpu_moves_finish, even when nothing was reserved). DQ_RESOURCE_EXHAUSTED when the
 * evictable GPU sequences cannot make enough room (nothing is touched then), DQ_NOMEM. */
int dqd_store_gpu_reserve(dqd_store *s, uint64_t need, dqd_gpu_moves *mv);
void dqd_store_gpu_unreserve(dqd_store *s, uint64_t need);
/* After the mover ran, or instead of it: accounts every moved sequence (rc 0), drops those whose
 * move failed (rc < 0), releases them all and frees mv's arrays. Safe on an empty mv. */
void dqd_store_gpu_moves_finish(dqd_store *s, dqd_gpu_moves *mv);
/* Counts layers brought from the host to the GPU, and layers a write moved to the host because
 * nothing on the GPU could make room for it (every other sequence pinned or in use). */
void dqd_store_gpu_promoted(dqd_store *s, uint64_t layers);
void dqd_store_gpu_spilled(dqd_store *s, uint64_t layers);

/* ---- disk tier ---- */

/* The disk tier's side (disktier.c), called on the loop thread. spill and load start the work on
 * seq, which the store holds exclusively for it, and return 0 (dqd_store_spill_done /
 * dqd_store_load_done follow, possibly before they return) or an error (nothing started). forget
 * frees seq->drec; remove: its file is removed first (synchronously: before whatever made the
 * record stale is acknowledged); else (shutdown) the file stays. */
typedef struct dqd_store_disk_ops {
    int (*spill)(void *arg, dqd_seq *seq);
    int (*load)(void *arg, dqd_seq *seq);
    void (*forget)(void *arg, dqd_seq *seq, bool remove);
} dqd_store_disk_ops;

void dqd_store_disk_enable(dqd_store *s, uint64_t capacity, const dqd_store_disk_ops *ops, void *arg);
bool dqd_store_disk_enabled(const dqd_store *s);
/* Room for a record of bytes: evicts least recently used records when needed (see above). Holds
 * the bytes until dqd_store_spill_done / dqd_store_disk_attach take them or dqd_store_disk_unreserve
 * gives them back. DQ_RESOURCE_EXHAUSTED when not even evicting can make room. */
int dqd_store_disk_reserve(dqd_store *s, uint64_t bytes);
void dqd_store_disk_unreserve(dqd_store *s, uint64_t bytes);
/* The spill of seq finished: rc 0 with its record (drec of drec_cost host bytes, bytes on disk,
 * reserved with dqd_store_disk_reserve) — seq becomes a stub — or the error: seq is dropped. */
void dqd_store_spill_done(dqd_store *s, dqd_seq *seq, int rc, dqd_drec *drec, uint64_t drec_cost, uint64_t bytes);
/* The load of seq finished: rc 0 with layers[model->layers] (taken over; NULL entries for layers
 * never written), or the error (DQ_CORRUPT for a checksum): seq is dropped. */
void dqd_store_load_done(dqd_store *s, dqd_seq *seq, int rc, dq_layer **layers);
/* Gives seq its record (disk bytes reserved): a resident sequence written at shutdown, or, with
 * stub, a sequence fresh from dqd_store_insert_kind found on disk at start, which becomes a
 * committed stub. */
void dqd_store_disk_attach(dqd_store *s, dqd_seq *seq, dqd_drec *drec, uint64_t drec_cost, uint64_t bytes, bool stub);
/* Counts records found bad at start (checksum) and recovered. */
void dqd_store_disk_counted(dqd_store *s, uint64_t corrupt, uint64_t recovered);
/* Starts reading seq back now if it is a stub nobody holds (a request about to need it). */
void dqd_seq_prefetch(dqd_seq *seq);
/* Calls fn for every committed sequence whose layers are in memory, least recently used first
 * (fn must not change the store's lists other than through dqd_store_disk_attach). */
void dqd_store_foreach_resident(dqd_store *s, void (*fn)(void *arg, dqd_seq *seq), void *arg);

/* Layer i of seq, whichever tier holds it (0 for a layer never written). */
uint64_t dqd_seq_layer_tokens(const dqd_seq *seq, uint32_t i);
uint64_t dqd_seq_layer_windows(const dqd_seq *seq, uint32_t i);
uint64_t dqd_seq_layer_tail(const dqd_seq *seq, uint32_t i);
static inline dqd_glayer *dqd_seq_glayer(const dqd_seq *seq, uint32_t i)
{
    return seq->glayers ? seq->glayers[i] : NULL;
}
/* Host bytes dq_layer_restore allocates for a layer of nwin windows (a move to the host), and
 * for moving GPU layer g to the host, then appending ntok tokens there. */
uint64_t dqd_store_restore_need(const dqd_codec *codec, uint64_t nwin);
uint64_t dqd_store_spill_need(const dqd_codec *codec, const dqd_glayer *g, uint64_t ntok);

/* Windows sealed after t tokens of a layer with window W and residual R (R >= W). */
static inline uint64_t dqd_sealed_windows(uint64_t t, uint64_t W, uint64_t R)
{
    return t < R ? 0 : (t - R) / W + 1;
}
/* Upper estimate of the bytes appending ntok tokens to layer (NULL: a new layer) allocates. */
uint64_t dqd_store_append_need(const dqd_codec *codec, const dq_layer *layer, uint64_t ntok);

#endif
