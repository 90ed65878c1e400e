/* dquantd bounded protobuf-c allocator (see pbmem.h). */
#include "pbmem.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PB_HDR 16u

static void *pb_alloc(void *data, size_t size)
{
    dqd_pbmem *m = data;
    if (size > m->cap || m->used + size + PB_HDR > m->cap)
        return NULL;
    size_t need = size + PB_HDR;
    uint8_t *p = malloc(need);
    if (!p) {
        m->nomem = 1;
        return NULL;
    }
    memcpy(p, &need, sizeof need);
    m->used += need;
    return p + PB_HDR;
}

static void pb_free(void *data, void *ptr)
{
    dqd_pbmem *m = data;
    if (!ptr)
        return;
    uint8_t *p = (uint8_t *)ptr - PB_HDR;
    size_t need;
    memcpy(&need, p, sizeof need);
    assert(need <= m->used);
    m->used -= need;
    free(p);
}

size_t dqd_pbmem_cap(size_t header_len)
{
    return header_len * 32u + (1u << 20);
}

void dqd_pbmem_init(dqd_pbmem *m, size_t cap)
{
    m->a.alloc = pb_alloc;
    m->a.free = pb_free;
    m->a.allocator_data = m;
    m->used = 0;
    m->nomem = 0;
    m->cap = cap;
}
