/* dquant wire framing: the fixed frame header and a pure, connection-free parser.
 *
 * Frame = 32-byte little-endian header | protobuf header message (header_len bytes) |
 *         raw payload (payload_len bytes).
 *
 *   off  size  field
 *     0     4  magic        0x544E5144 ("DQNT" on the wire)
 *     4     2  version      DQ_WIRE_VERSION
 *     6     2  flags        0 (reserved; nonzero is a protocol error)
 *     8     4  header_len   protobuf header bytes, 1 .. limits.max_header
 *    12     4  header_crc   XXH32(header message, seed 0)
 *    16     8  payload_len  0 .. limits.max_payload
 *    24     8  request_id   echoed in the reply
 *
 * dq_frame_parse never allocates and never reads past len: it validates the fixed header against
 * the limits before the caller allocates anything for the rest of the frame. */
#ifndef DQUANT_FRAME_H
#define DQUANT_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define DQ_FRAME_MAGIC 0x544E5144u
#define DQ_WIRE_VERSION 1u
#define DQ_FRAME_HEADER_BYTES 32u

typedef struct dq_frame_limits {
    uint32_t max_header;  /* largest protobuf header message, bytes */
    uint64_t max_payload; /* largest payload, bytes */
} dq_frame_limits;

typedef struct dq_frame_header {
    uint16_t version;
    uint16_t flags;
    uint32_t header_len;
    uint32_t header_crc;
    uint64_t payload_len;
    uint64_t request_id;
} dq_frame_header;

/* Result of dq_frame_parse. */
typedef enum dq_frame_status {
    DQ_FRAME_OK = 0,         /* a whole frame is in buf: *consumed = its size */
    DQ_FRAME_INCOMPLETE = 1, /* need more bytes; *need = total bytes of the frame if known, else 32 */
    DQ_FRAME_ERROR = 2, /* unparseable or over limits; *err = DQ_PROTOCOL / DQ_TOO_LARGE / DQ_VERSION / DQ_CORRUPT */
} dq_frame_status;

typedef struct dq_frame {
    dq_frame_header hdr;
    const uint8_t *header;  /* points into buf */
    const uint8_t *payload; /* points into buf (NULL when payload_len == 0) */
} dq_frame;

/* Parses only the fixed header (needs >= 32 bytes). Returns DQ_FRAME_OK / INCOMPLETE / ERROR. */
dq_frame_status dq_frame_parse_header(const uint8_t *buf, size_t len, const dq_frame_limits *lim, dq_frame_header *out,
                                      int *err);
/* Parses one whole frame at the start of buf. On OK, *consumed = 32 + header_len + payload_len and
 * the header CRC has been checked. On INCOMPLETE, *consumed = bytes needed in total (>= len). */
dq_frame_status dq_frame_parse(const uint8_t *buf, size_t len, const dq_frame_limits *lim, dq_frame *out,
                               size_t *consumed, int *err);
/* Writes a fixed header (32 bytes) for a header message and payload length. */
void dq_frame_write_header(uint8_t out[DQ_FRAME_HEADER_BYTES], const uint8_t *header, uint32_t header_len,
                           uint64_t payload_len, uint64_t request_id);

#endif
