/* dquantd frame buffers (framebuf.h). Each buffer has a 64-byte header in front of the pointer
 * handed out: its capacity, so that a buffer given back can be matched to later frames. */
#include "framebuf.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define HDR 64u

/* Capacities are rounded up so that frames of slightly different sizes share buffers: to 64
 * bytes below DQD_FRAMEBUF_MIN_KEEP, to 1 MiB above. */
static size_t round_capacity(size_t bytes)
{
    const size_t q = bytes < DQD_FRAMEBUF_MIN_KEEP ? 64u : DQD_FRAMEBUF_MIN_KEEP;
    return (bytes + q - 1) / q * q;
}

size_t dqd_framebuf_capacity(const uint8_t *buf)
{
    size_t cap;
    memcpy(&cap, buf - HDR, sizeof cap);
    return cap;
}

void dqd_framebufs_init(dqd_framebufs *fb, uint64_t budget)
{
    memset(fb, 0, sizeof *fb);
    pthread_mutex_init(&fb->mu, NULL);
    fb->budget = budget;
}

void dqd_framebufs_destroy(dqd_framebufs *fb)
{
    for (uint32_t i = 0; i < fb->nkept; i++)
        free(fb->kept[i] - HDR);
    fb->nkept = 0;
    fb->kept_bytes = 0;
    pthread_mutex_destroy(&fb->mu);
}

uint8_t *dqd_framebuf_get(dqd_framebufs *fb, size_t bytes)
{
    if (bytes == 0 || bytes > SIZE_MAX - HDR - DQD_FRAMEBUF_MIN_KEEP)
        return NULL;
    if (bytes >= DQD_FRAMEBUF_MIN_KEEP) {
        pthread_mutex_lock(&fb->mu);
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < fb->nkept; i++) {
            const size_t cap = dqd_framebuf_capacity(fb->kept[i]);
            if (cap >= bytes && cap / 4 <= bytes && (best == UINT32_MAX || cap < dqd_framebuf_capacity(fb->kept[best])))
                best = i;
        }
        uint8_t *buf = NULL;
        if (best != UINT32_MAX) {
            buf = fb->kept[best];
            fb->kept[best] = fb->kept[--fb->nkept];
            fb->kept_bytes -= dqd_framebuf_capacity(buf);
            fb->reused++;
        } else {
            fb->fresh++;
        }
        pthread_mutex_unlock(&fb->mu);
        if (buf)
            return buf;
    }
    const size_t cap = round_capacity(bytes);
    uint8_t *base = aligned_alloc(64, HDR + cap);
    if (!base)
        return NULL;
    memcpy(base, &cap, sizeof cap);
    return base + HDR;
}

void dqd_framebuf_put(dqd_framebufs *fb, uint8_t *buf)
{
    if (!buf)
        return;
    const size_t cap = dqd_framebuf_capacity(buf);
    if (cap >= DQD_FRAMEBUF_MIN_KEEP) {
        pthread_mutex_lock(&fb->mu);
        const bool keep = fb->nkept < DQD_FRAMEBUF_SLOTS && fb->kept_bytes + cap <= fb->budget;
        if (keep) {
            fb->kept[fb->nkept++] = buf;
            fb->kept_bytes += cap;
        }
        pthread_mutex_unlock(&fb->mu);
        if (keep)
            return;
    }
    free(buf - HDR);
}

void dqd_framebufs_stats(dqd_framebufs *fb, uint64_t *kept_bytes, uint64_t *reused, uint64_t *fresh)
{
    pthread_mutex_lock(&fb->mu);
    *kept_bytes = fb->kept_bytes;
    *reused = fb->reused;
    *fresh = fb->fresh;
    pthread_mutex_unlock(&fb->mu);
}
