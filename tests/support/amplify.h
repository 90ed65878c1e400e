/* A request that makes dquantd answer far more bytes than it was sent: what the tests and the
 * harness of the daemon's memory limits (tests/daemon/test_conn_limits.c, abuse.c) flood it with. */
#ifndef DQD_TEST_AMPLIFY_H
#define DQD_TEST_AMPLIFY_H

#include <stddef.h>
#include <stdint.h>

/* A DECOMPRESS frame (request id id) of one value token under a client-supplied profile of
 * kv_heads x 1024 values, 3 levels, the smallest container the profile allows: *frame_len bytes
 * in (*record_bytes of them the record), *reply_bytes of f32 out. malloc'd; NULL on failure. */
uint8_t *amplify_decompress_frame(uint32_t kv_heads, uint64_t id, size_t *frame_len, size_t *reply_bytes,
                                  size_t *record_bytes);

#endif
