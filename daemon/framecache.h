/* dquantd frame buffers for large requests.
 *
 * A frame larger than a connection's read buffer gets a buffer of its own that the socket fills in
 * place. Freshly allocated, such a buffer is an anonymous mapping whose pages fault in (and are
 * zeroed by the kernel) inside the loop thread's read() and are unmapped again when the request
 * ends; for a stream of 100 MB PUTs that is most of what the loop thread does. The cache keeps
 * released buffers, up to a byte limit (--frame-cache), for the next large frames: sizes rounded
 * up to 2 MiB (transparent huge pages asked for), a buffer reused for a frame of up to 1.5 times
 * less, the least recently released dropped first when the limit is reached, and everything unused
 * for a while given back (dqd_framecache_trim, on a timer).
 *
 * Loop thread only. */
#ifndef DQD_FRAMECACHE_H
#define DQD_FRAMECACHE_H

#include <stddef.h>
#include <stdint.h>

#define DQD_FRAMECACHE_SLOTS 32

typedef struct dqd_framebuf {
    uint8_t *p;
    size_t cap;
    uint64_t released_ns;
} dqd_framebuf;

typedef struct dqd_framecache {
    dqd_framebuf slot[DQD_FRAMECACHE_SLOTS];
    size_t n;
    uint64_t bytes;   /* held by the cache now */
    uint64_t limit;   /* the most it holds; 0: nothing is kept */
    uint64_t hits, misses;
} dqd_framecache;

void dqd_framecache_init(dqd_framecache *fc, uint64_t limit);
/* A buffer of at least bytes (64-byte aligned), its capacity in *cap for dqd_framecache_put; NULL
 * when the system has no memory for it. */
uint8_t *dqd_framecache_get(dqd_framecache *fc, size_t bytes, size_t *cap);
/* Takes back a buffer from dqd_framecache_get (p may be NULL). */
void dqd_framecache_put(dqd_framecache *fc, uint8_t *p, size_t cap, uint64_t now_ns);
/* Unmaps the buffers released before now_ns - idle_ns (all of them with idle_ns = 0). */
void dqd_framecache_trim(dqd_framecache *fc, uint64_t now_ns, uint64_t idle_ns);

#endif
