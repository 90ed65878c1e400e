/* dquantd host-memory accounting: a counting allocator handed to libdquant (dq_allocator), so that
 * every byte the codec allocates for the store (codecs, workspaces, window records, tails) is
 * counted, plus the daemon's own per-sequence structures allocated through the same functions.
 *
 * Thread-safe: worker threads allocate while the loop thread reads the counters. */
#ifndef DQD_HOSTMEM_H
#define DQD_HOSTMEM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dquant/types.h"

typedef struct dqd_hostmem {
    _Atomic uint64_t used; /* bytes currently allocated, headers included */
    _Atomic uint64_t peak;
    _Atomic uint64_t allocs; /* live allocations */
    dq_allocator alloc;      /* hooks for libdquant: opaque = this struct */
} dqd_hostmem;

void dqd_hostmem_init(dqd_hostmem *m);
/* 64-byte aligned; NULL on failure or size 0. */
void *dqd_hostmem_alloc(dqd_hostmem *m, size_t size);
void *dqd_hostmem_calloc(dqd_hostmem *m, size_t size);
void dqd_hostmem_free(dqd_hostmem *m, void *p);
uint64_t dqd_hostmem_used(const dqd_hostmem *m);
/* Bytes an allocation of size counts for (what _alloc adds to used). */
uint64_t dqd_hostmem_cost(size_t size);

#endif
