/* dquantd frame buffers: a frame's bytes land in one 64-byte-aligned buffer, filled by the socket
 * in place. A large buffer (a PUT's payload of many MB) fresh from the allocator is fresh pages
 * from the kernel, so the socket read into it spends its time faulting and zeroing them, page by
 * page. Freed large buffers are therefore kept, up to a byte budget, and handed to the next frame
 * they fit.
 *
 * Thread-safe: frames are taken on the loop thread and may be given back on worker threads. */
#ifndef DQD_FRAMEBUF_H
#define DQD_FRAMEBUF_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Buffers of at least this many bytes are kept on release; smaller ones come and go through
 * malloc, whose own free lists serve them without fresh pages. */
#define DQD_FRAMEBUF_MIN_KEEP ((size_t)1 << 20)
#define DQD_FRAMEBUF_SLOTS 16

typedef struct dqd_framebufs {
    pthread_mutex_t mu;
    uint64_t budget; /* bytes of kept buffers at most */
    uint64_t kept_bytes;
    uint32_t nkept;
    uint8_t *kept[DQD_FRAMEBUF_SLOTS]; /* user pointers of the kept buffers */
    uint64_t reused, fresh;            /* buffers handed out from the kept ones / new */
} dqd_framebufs;

void dqd_framebufs_init(dqd_framebufs *fb, uint64_t budget);
/* Frees the kept buffers. Buffers still out are the caller's to give back before. */
void dqd_framebufs_destroy(dqd_framebufs *fb);
/* A 64-byte-aligned buffer of at least bytes (bytes > 0): a kept one that fits (the smallest, if
 * not over 4x the need), else a new one. NULL when out of memory. */
uint8_t *dqd_framebuf_get(dqd_framebufs *fb, size_t bytes);
/* Gives a buffer from dqd_framebuf_get back: kept while the budget allows, else freed. NULL is a
 * no-op. */
void dqd_framebuf_put(dqd_framebufs *fb, uint8_t *buf);
/* The bytes a buffer from dqd_framebuf_get can hold. */
size_t dqd_framebuf_capacity(const uint8_t *buf);
/* Counters, read under the lock. */
void dqd_framebufs_stats(dqd_framebufs *fb, uint64_t *kept_bytes, uint64_t *reused, uint64_t *fresh);

#endif
