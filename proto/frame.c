/* dquant wire framing: fixed-header encode/decode and the pure frame parser (see frame.h).
 *
 * Every multi-byte field is read and written one byte at a time, so the code is independent of
 * host byte order and alignment. The parser validates the fixed header (magic, version, flags and
 * both lengths against the caller's limits) before it looks at anything past the first 32 bytes,
 * so a caller can size its buffers from a header that this file has accepted. */
#include "frame.h"

#include <xxhash.h>

#include "dquant/error.h"

static uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static dq_frame_status fail(int *err, int code)
{
    if (err)
        *err = code;
    return DQ_FRAME_ERROR;
}

/* The magic as it appears on the wire, for rejecting garbage before 32 bytes have arrived. */
static const uint8_t magic_bytes[4] = {
    (uint8_t)DQ_FRAME_MAGIC,
    (uint8_t)(DQ_FRAME_MAGIC >> 8),
    (uint8_t)(DQ_FRAME_MAGIC >> 16),
    (uint8_t)(DQ_FRAME_MAGIC >> 24),
};

dq_frame_status dq_frame_parse_header(const uint8_t *buf, size_t len, const dq_frame_limits *lim, dq_frame_header *out,
                                      int *err)
{
    if ((!buf && len) || !lim || !out)
        return fail(err, DQ_INVALID_ARGUMENT);
    if (err)
        *err = DQ_OK;

    /* Garbage is refused as soon as the bytes that prove it have arrived. */
    size_t have = len < 4 ? len : 4;
    for (size_t i = 0; i < have; i++)
        if (buf[i] != magic_bytes[i])
            return fail(err, DQ_PROTOCOL);
    if (len < DQ_FRAME_HEADER_BYTES)
        return DQ_FRAME_INCOMPLETE;

    dq_frame_header h;
    h.version = rd16(buf + 4);
    h.flags = rd16(buf + 6);
    h.header_len = rd32(buf + 8);
    h.header_crc = rd32(buf + 12);
    h.payload_len = rd64(buf + 16);
    h.request_id = rd64(buf + 24);

    if (h.version != DQ_WIRE_VERSION)
        return fail(err, DQ_VERSION);
    if (h.flags != 0)
        return fail(err, DQ_PROTOCOL);
    if (h.header_len == 0)
        return fail(err, DQ_PROTOCOL);
    if (h.header_len > lim->max_header || h.payload_len > lim->max_payload)
        return fail(err, DQ_TOO_LARGE);
    /* The whole frame must be addressable (matters only where size_t is 32 bits). */
    if (h.payload_len > (uint64_t)(SIZE_MAX - DQ_FRAME_HEADER_BYTES - h.header_len))
        return fail(err, DQ_TOO_LARGE);

    *out = h;
    return DQ_FRAME_OK;
}

dq_frame_status dq_frame_parse(const uint8_t *buf, size_t len, const dq_frame_limits *lim, dq_frame *out,
                               size_t *consumed, int *err)
{
    if ((!buf && len) || !lim || !out || !consumed)
        return fail(err, DQ_INVALID_ARGUMENT);

    dq_frame_header h;
    dq_frame_status st = dq_frame_parse_header(buf, len, lim, &h, err);
    if (st == DQ_FRAME_INCOMPLETE) {
        *consumed = DQ_FRAME_HEADER_BYTES;
        return st;
    }
    if (st != DQ_FRAME_OK)
        return st;

    size_t total = DQ_FRAME_HEADER_BYTES + (size_t)h.header_len + (size_t)h.payload_len;
    if (len < total) {
        *consumed = total;
        return DQ_FRAME_INCOMPLETE;
    }

    const uint8_t *msg = buf + DQ_FRAME_HEADER_BYTES;
    if ((uint32_t)XXH32(msg, h.header_len, 0) != h.header_crc)
        return fail(err, DQ_CORRUPT);

    out->hdr = h;
    out->header = msg;
    out->payload = h.payload_len ? msg + h.header_len : NULL;
    *consumed = total;
    return DQ_FRAME_OK;
}

void dq_frame_write_header(uint8_t out[DQ_FRAME_HEADER_BYTES], const uint8_t *header, uint32_t header_len,
                           uint64_t payload_len, uint64_t request_id)
{
    uint32_t crc = header_len ? (uint32_t)XXH32(header, header_len, 0) : (uint32_t)XXH32("", 0, 0);
    wr32(out, DQ_FRAME_MAGIC);
    wr16(out + 4, (uint16_t)DQ_WIRE_VERSION);
    wr16(out + 6, 0);
    wr32(out + 8, header_len);
    wr32(out + 12, crc);
    wr64(out + 16, payload_len);
    wr64(out + 24, request_id);
}
