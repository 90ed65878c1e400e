/* dquantd disk records: the on-disk format of one store entry (a sequence or a chunk) of the disk
 * tier. Pure: no I/O, no store; disktier.c does the files. Every byte of a record file is covered
 * by a checksum, so a flipped bit anywhere is a failed check, never wrong data.
 *
 * A record file is meta | body, little endian:
 *
 *   meta  magic "DQDR" u32 | version u16 | kind u8 | 0 u8 | meta_len u32 | nlayers u32 |
 *         body_len u64 | stamp u64 |
 *         ns_len u16 | key_len u16 | nprefix u32 | name_len u16 | builtin_len u16 | profile_len u32 |
 *         q_heads u32 | kv_heads u32 | head_dim u32 | chunk_tokens u32 | window_bytes u32 | n u32 |
 *         ns | key | model name | built-in profile name | serialized profile |
 *         nprefix x (len u16 | chunk key) |
 *         nlayers x (present u32 | tail u32 | windows u64 | xxh3 u64) |
 *         xxh3 u64 of all of the above
 *   body  per present layer, in layer order: `windows` window records back to back, then the BF16
 *         tail of K (tail x n values), then that of V — GET_RAW's layout; each layer's bytes are
 *         checked against its xxh3 (XXH3_64bits, seed 0) when read.
 *
 * The model's spec (name, shape, chunk size, profile bytes) travels in every record, so a restarted
 * daemon registers the models of the records it finds. stamp orders records by last write (the
 * disk LRU after a restart). The file's size must be meta_len + body_len exactly. */
#ifndef DQD_DISKREC_H
#define DQD_DISKREC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "registry.h"

#define DQD_REC_MAGIC 0x52445144u /* "DQDR" */
#define DQD_REC_VERSION 1u
#define DQD_REC_FIXED 72u            /* bytes of meta before the variable part */
#define DQD_REC_META_MAX (64u << 20) /* larger meta_len fields are corrupt */

typedef struct dqd_rec_layer {
    bool present;    /* the layer was written (a never-written layer has no bytes) */
    uint32_t tail;   /* BF16 tail tokens */
    uint64_t nwin;   /* window records */
    uint64_t hash;   /* XXH3_64bits of its bytes */
    uint64_t offset; /* from the start of the file (dqd_rec_layout) */
    uint64_t bytes;
} dqd_rec_layer;

/* What registers the model again after a restart. */
typedef struct dqd_rec_model {
    char name[DQD_MODEL_NAME_MAX + 1];
    char builtin[DQD_BUILTIN_NAME_MAX + 1]; /* "" when registered with a serialized profile */
    uint32_t layers, q_heads, kv_heads, head_dim, chunk_tokens;
    uint8_t profile[DQ_PROFILE_SERIALIZED_MAX];
    size_t profile_len;
} dqd_rec_model;

typedef struct dqd_rec_meta {
    uint8_t kind; /* DQD_KIND_SEQUENCE or DQD_KIND_CHUNK */
    uint64_t stamp;
    const uint8_t *ns, *key; /* borrowed: the caller's (write) or the parsed buffer's (read) */
    size_t ns_len, key_len;
    dqd_rec_model model;
    uint32_t window_bytes, n;
    uint32_t nprefix;      /* chunks a sequence is built on (same namespace) */
    const uint8_t *prefix; /* nprefix x (len u16 | key), as in the file (dqd_rec_prefix_next) */
    size_t prefix_bytes;
    uint32_t nlayers;      /* = model.layers */
    dqd_rec_layer *layers; /* [nlayers], the caller's */
    uint64_t meta_len, body_len;
} dqd_rec_meta;

/* Bytes of a key list entry and the list's walk: *off starts at 0; returns false past the end. */
static inline size_t dqd_rec_prefix_entry(size_t key_len)
{
    return 2 + key_len;
}
bool dqd_rec_prefix_next(const dqd_rec_meta *m, size_t *off, const uint8_t **key, size_t *key_len);

/* Sets meta_len, every present layer's offset and bytes from its nwin and tail, and body_len. */
void dqd_rec_layout(dqd_rec_meta *m);

/* Writes the meta (m laid out, layer hashes set) into buf (meta_len bytes). DQ_INVALID_ARGUMENT
 * when a length does not fit its field or cap is short. */
int dqd_rec_meta_write(const dqd_rec_meta *m, uint8_t *buf, size_t cap);

/* Bytes of meta to read for a record that starts with head (at least DQD_REC_FIXED bytes) and
 * its layer count (1..4096), or DQ_CORRUPT / DQ_VERSION. */
int dqd_rec_meta_len(const uint8_t *head, size_t len, uint64_t *meta_len, uint32_t *nlayers);

/* Parses and verifies a meta of len bytes into m, whose layers array the caller provides with room
 * for max_layers. m's pointers point into buf. DQ_CORRUPT when the checksum or any field is wrong,
 * DQ_VERSION for another format version, DQ_SHAPE when there are more than max_layers layers. */
int dqd_rec_meta_read(const uint8_t *buf, size_t len, dqd_rec_meta *m, dqd_rec_layer *layers, uint32_t max_layers);

/* XXH3_64bits of a layer's bytes; whether they match the record. */
uint64_t dqd_rec_hash(const void *bytes, size_t len);
bool dqd_rec_layer_ok(const dqd_rec_layer *l, const void *bytes);

#endif
