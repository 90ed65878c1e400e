/* dquantd's bounded allocator for protobuf-c: every request header is unpacked with one, so a
 * hostile header cannot make the daemon allocate more than dqd_pbmem_cap(header_len) bytes. The
 * request fuzzer (tests/daemon/fuzz_request.c) unpacks with this same allocator. */
#ifndef DQD_PBMEM_H
#define DQD_PBMEM_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

typedef struct dqd_pbmem {
    ProtobufCAllocator a; /* pass &a to dquant__request__unpack / __free_unpacked */
    size_t used, cap;     /* bytes allocated now (with headers), the limit */
    int nomem;            /* malloc failed (not the cap): the unpack failed for want of memory */
} dqd_pbmem;

/* The limit for unpacking a header of header_len bytes. */
size_t dqd_pbmem_cap(size_t header_len);
/* An allocator that refuses any allocation past cap bytes in all. */
void dqd_pbmem_init(dqd_pbmem *m, size_t cap);

#endif
