/* Chunk keys of the shared KV tier: a hash chain over the token prefix, so that any client of the
 * same model namespace computes the same key for the same prompt prefix (LMCache/Mooncake style).
 *
 * A chunk is chunk_tokens consecutive tokens of a prompt (all layers). Its key is
 *
 *   key_i = XXH3-128( "dqchunk1" | u32le(len(ns)) | ns | parent_i | u32le(n) | u32le(tok_0) ... u32le(tok_n-1) )
 *
 * where ns is the model namespace (the namespace the chunks are stored under), parent_i is key_(i-1)
 * (16 zero bytes for the first chunk of a prompt), n the chunk's token count and tok its token ids.
 * A key is written as XXH128's canonical form: 16 bytes, the high 64 bits first, big endian.
 * Test vectors: tests/proto/chunk_key_vectors.txt. */
#ifndef DQ_CHUNKKEY_H
#define DQ_CHUNKKEY_H

#include <stddef.h>
#include <stdint.h>

#define DQ_CHUNK_KEY_BYTES 16

/* The key of one chunk of n tokens. parent: the previous chunk's key, or NULL for the first chunk
 * (the same as 16 zero bytes). Borrowed pointers; tokens may be NULL when n is 0. */
void dq_chunk_key(const char *ns, size_t ns_len, const uint8_t *parent, const uint32_t *tokens, uint32_t n,
                  uint8_t out[DQ_CHUNK_KEY_BYTES]);

/* The keys of the full chunks of a prompt of ntokens tokens, chained from parent (NULL: the
 * prompt's start): min(ntokens / chunk_tokens, max_keys) keys into out (16 bytes each). A final
 * partial chunk has no key (it stays in a sequence's private tail). Returns the number of keys
 * written; 0 when chunk_tokens is 0. */
size_t dq_chunk_keys(const char *ns, size_t ns_len, const uint8_t *parent, const uint32_t *tokens, size_t ntokens,
                     uint32_t chunk_tokens, uint8_t *out, size_t max_keys);

#endif
