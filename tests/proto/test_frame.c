/* Unit tests of the pure frame parser (proto/frame.c): complete, incomplete and garbage input,
 * lying lengths, bad magic/version/flags/CRC, and a frame stream split at every byte boundary. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "dquant/error.h"
#include "frame.h"

static const dq_frame_limits lim = {.max_header = 4096, .max_payload = 1u << 20};

/* Builds a frame with a header message of hlen bytes and a payload of plen bytes (deterministic
 * contents) into buf; returns its size. */
static size_t build_frame(uint8_t *buf, uint32_t hlen, uint64_t plen, uint64_t id)
{
    uint8_t *msg = buf + DQ_FRAME_HEADER_BYTES;
    for (uint32_t i = 0; i < hlen; i++)
        msg[i] = (uint8_t)(i * 7 + 3);
    for (uint64_t i = 0; i < plen; i++)
        msg[hlen + i] = (uint8_t)(i * 13 + 1);
    dq_frame_write_header(buf, msg, hlen, plen, id);
    return DQ_FRAME_HEADER_BYTES + hlen + (size_t)plen;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

Test(frame, header_layout_is_little_endian_bytewise)
{
    uint8_t buf[64];
    uint8_t msg[3] = {1, 2, 3};
    dq_frame_write_header(buf, msg, 3, 0x0102030405060708ull, 0x1122334455667788ull);
    const uint8_t want_head[16] = {'D', 'Q', 'N', 'T', 1, 0, 0, 0, 3, 0, 0, 0};
    cr_assert_arr_eq(buf, want_head, 12);
    uint32_t crc = XXH32(msg, 3, 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(buf[12 + i], (uint8_t)(crc >> (8 * i)));
    const uint8_t want_tail[16] = {8, 7, 6, 5, 4, 3, 2, 1, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11};
    cr_assert_arr_eq(buf + 16, want_tail, 16);
}

Test(frame, complete_frame_parses)
{
    uint8_t buf[256];
    size_t n = build_frame(buf, 17, 40, 99);
    dq_frame f;
    size_t consumed = 0;
    int err = 12345;
    cr_assert_eq(dq_frame_parse(buf, n, &lim, &f, &consumed, &err), DQ_FRAME_OK);
    cr_assert_eq(err, DQ_OK);
    cr_assert_eq(consumed, n);
    cr_assert_eq(f.hdr.version, DQ_WIRE_VERSION);
    cr_assert_eq(f.hdr.flags, 0);
    cr_assert_eq(f.hdr.header_len, 17);
    cr_assert_eq(f.hdr.payload_len, 40);
    cr_assert_eq(f.hdr.request_id, 99);
    cr_assert_eq(f.header, buf + 32);
    cr_assert_eq(f.payload, buf + 32 + 17);
    cr_assert_eq(f.payload[0], 1);
    cr_assert_eq(f.payload[1], 14);
}

Test(frame, trailing_bytes_are_left_alone)
{
    uint8_t buf[256];
    size_t n = build_frame(buf, 5, 3, 1);
    memset(buf + n, 0xAB, 20);
    dq_frame f;
    size_t consumed = 0;
    int err;
    cr_assert_eq(dq_frame_parse(buf, n + 20, &lim, &f, &consumed, &err), DQ_FRAME_OK);
    cr_assert_eq(consumed, n);
}

Test(frame, empty_payload_gives_null_pointer)
{
    uint8_t buf[64];
    size_t n = build_frame(buf, 2, 0, 7);
    dq_frame f;
    size_t consumed;
    int err;
    cr_assert_eq(dq_frame_parse(buf, n, &lim, &f, &consumed, &err), DQ_FRAME_OK);
    cr_assert_null(f.payload);
    cr_assert_eq(consumed, 34);
}

Test(frame, every_prefix_is_incomplete_with_the_right_need)
{
    uint8_t buf[256];
    size_t n = build_frame(buf, 21, 50, 3);
    for (size_t len = 0; len < n; len++) {
        dq_frame f;
        size_t consumed = 0;
        int err = 1;
        cr_assert_eq(dq_frame_parse(buf, len, &lim, &f, &consumed, &err), DQ_FRAME_INCOMPLETE, "len %zu", len);
        cr_assert_geq(consumed, len);
        cr_assert_eq(consumed, len < 32 ? 32 : n, "len %zu need %zu", len, consumed);
        dq_frame_header h;
        dq_frame_status hs = dq_frame_parse_header(buf, len, &lim, &h, &err);
        cr_assert_eq(hs, len < 32 ? DQ_FRAME_INCOMPLETE : DQ_FRAME_OK);
    }
}

/* A stream of three frames delivered in two chunks split at every byte boundary, parsed the way a
 * connection would: accumulate, parse while OK, keep the rest. */
Test(frame, stream_split_at_every_byte_boundary)
{
    uint8_t stream[512];
    size_t n = 0;
    n += build_frame(stream + n, 9, 0, 10);
    n += build_frame(stream + n, 30, 77, 11);
    n += build_frame(stream + n, 1, 5, 12);

    for (size_t split = 0; split <= n; split++) {
        uint8_t acc[512];
        size_t have = 0, parsed = 0;
        uint64_t next_id = 10;
        const size_t cuts[2] = {split, n - split};
        size_t off = 0;
        for (int c = 0; c < 2; c++) {
            memcpy(acc + have, stream + off, cuts[c]);
            have += cuts[c];
            off += cuts[c];
            for (;;) {
                dq_frame f;
                size_t consumed;
                int err;
                dq_frame_status st = dq_frame_parse(acc + parsed, have - parsed, &lim, &f, &consumed, &err);
                cr_assert_neq(st, DQ_FRAME_ERROR, "split %zu err %d", split, err);
                if (st == DQ_FRAME_INCOMPLETE)
                    break;
                cr_assert_eq(f.hdr.request_id, next_id, "split %zu", split);
                next_id++;
                parsed += consumed;
            }
        }
        cr_assert_eq(next_id, 13, "split %zu: %llu frames", split, (unsigned long long)(next_id - 10));
        cr_assert_eq(parsed, n);
    }
}

Test(frame, bad_magic_in_each_byte_is_refused_early)
{
    uint8_t buf[128];
    size_t n = build_frame(buf, 8, 8, 1);
    for (int b = 0; b < 4; b++) {
        uint8_t bad[128];
        memcpy(bad, buf, n);
        bad[b] ^= 0x20;
        for (size_t len = (size_t)b + 1; len <= n; len++) {
            dq_frame f;
            size_t consumed;
            int err = 0;
            cr_assert_eq(dq_frame_parse(bad, len, &lim, &f, &consumed, &err), DQ_FRAME_ERROR, "byte %d len %zu", b,
                         len);
            cr_assert_eq(err, DQ_PROTOCOL);
        }
    }
}

Test(frame, garbage_is_refused)
{
    uint32_t seed = 12345;
    for (int trial = 0; trial < 1000; trial++) {
        uint8_t buf[64];
        for (size_t i = 0; i < sizeof buf; i++) {
            seed = seed * 1664525u + 1013904223u;
            buf[i] = (uint8_t)(seed >> 24);
        }
        if (buf[0] == 'D')
            buf[0] = 'x';
        dq_frame f;
        size_t consumed;
        int err = 0;
        cr_assert_eq(dq_frame_parse(buf, sizeof buf, &lim, &f, &consumed, &err), DQ_FRAME_ERROR);
        cr_assert_eq(err, DQ_PROTOCOL);
        cr_assert_eq(dq_frame_parse(buf, 1, &lim, &f, &consumed, &err), DQ_FRAME_ERROR);
    }
    /* Correct magic, garbage after it: refused on version or flags or limits or CRC, never OK. */
    for (int trial = 0; trial < 1000; trial++) {
        uint8_t buf[64];
        for (size_t i = 0; i < sizeof buf; i++) {
            seed = seed * 1664525u + 1013904223u;
            buf[i] = (uint8_t)(seed >> 24);
        }
        memcpy(buf, "DQNT", 4);
        dq_frame f;
        size_t consumed = 0;
        int err = 0;
        dq_frame_status st = dq_frame_parse(buf, sizeof buf, &lim, &f, &consumed, &err);
        cr_assert_neq(st, DQ_FRAME_OK);
        if (st == DQ_FRAME_INCOMPLETE)
            cr_assert_gt(consumed, sizeof buf);
    }
}

Test(frame, bad_version_and_flags)
{
    uint8_t buf[64];
    size_t n = build_frame(buf, 4, 0, 1);
    dq_frame f;
    size_t consumed;
    int err;

    buf[4] = 2;
    cr_assert_eq(dq_frame_parse(buf, n, &lim, &f, &consumed, &err), DQ_FRAME_ERROR);
    cr_assert_eq(err, DQ_VERSION);
    buf[4] = 0;
    cr_assert_eq(dq_frame_parse(buf, n, &lim, &f, &consumed, &err), DQ_FRAME_ERROR);
    cr_assert_eq(err, DQ_VERSION);
    buf[4] = 1;
    buf[7] = 0x80;
    cr_assert_eq(dq_frame_parse(buf, n, &lim, &f, &consumed, &err), DQ_FRAME_ERROR);
    cr_assert_eq(err, DQ_PROTOCOL);
}

Test(frame, bad_crc_is_corrupt)
{
    uint8_t buf[128];
    size_t n = build_frame(buf, 20, 10, 1);
    dq_frame f;
    size_t consumed;
    int err;
    /* Every single-bit flip in the header message or in the stored CRC is caught. */
    for (size_t byte = 12; byte < 32 + 20; byte++) {
        if (byte >= 16 && byte < 32)
            continue;
        for (int bit = 0; bit < 8; bit++) {
            buf[byte] ^= (uint8_t)(1u << bit);
            cr_assert_eq(dq_frame_parse(buf, n, &lim, &f, &consumed, &err), DQ_FRAME_ERROR, "byte %zu bit %d", byte,
                         bit);
            cr_assert_eq(err, DQ_CORRUPT);
            buf[byte] ^= (uint8_t)(1u << bit);
        }
    }
    cr_assert_eq(dq_frame_parse(buf, n, &lim, &f, &consumed, &err), DQ_FRAME_OK);
    /* The payload is not covered by the header CRC. */
    buf[n - 1] ^= 1;
    cr_assert_eq(dq_frame_parse(buf, n, &lim, &f, &consumed, &err), DQ_FRAME_OK);
}

/* ---- lying lengths: refused from the 32-byte fixed header alone ---- */

typedef struct lie {
    uint64_t header_len; /* written as u32 */
    uint64_t payload_len;
    int want_err; /* 0: accepted (then the frame is incomplete) */
} lie;

ParameterizedTestParameters(frame, lying_lengths)
{
    static lie params[] = {
        {0, 0, DQ_PROTOCOL},
        {0, 100, DQ_PROTOCOL},
        {4096, 0, 0},                   /* exactly the limit */
        {4097, 0, DQ_TOO_LARGE},        /* limit + 1 */
        {0x7FFFFFFFu, 0, DQ_TOO_LARGE}, /* 2^31 - 1 */
        {0x80000000u, 0, DQ_TOO_LARGE},
        {0xFFFFFFFFu, 0, DQ_TOO_LARGE}, /* 2^32 - 1 */
        {1, 1u << 20, 0},               /* payload exactly the limit */
        {1, (1u << 20) + 1, DQ_TOO_LARGE},
        {1, 0x7FFFFFFFu, DQ_TOO_LARGE},
        {1, 0xFFFFFFFFu, DQ_TOO_LARGE},
        {1, 0x100000000ull, DQ_TOO_LARGE},
        {1, 0x7FFFFFFFFFFFFFFFull, DQ_TOO_LARGE},
        {1, 0xFFFFFFFFFFFFFFFFull, DQ_TOO_LARGE},
        {0xFFFFFFFFu, 0xFFFFFFFFFFFFFFFFull, DQ_TOO_LARGE},
    };
    return cr_make_param_array(lie, params, sizeof params / sizeof params[0]);
}

ParameterizedTest(lie *p, frame, lying_lengths)
{
    uint8_t buf[32];
    dq_frame_write_header(buf, (const uint8_t *)"x", 1, 0, 5);
    put_u32(buf + 8, (uint32_t)p->header_len);
    put_u64(buf + 16, p->payload_len);

    dq_frame f;
    size_t consumed = 0;
    int err = 0;
    dq_frame_status st = dq_frame_parse(buf, sizeof buf, &lim, &f, &consumed, &err);
    dq_frame_header h;
    int herr = 0;
    dq_frame_status hs = dq_frame_parse_header(buf, sizeof buf, &lim, &h, &herr);
    if (p->want_err) {
        cr_assert_eq(st, DQ_FRAME_ERROR);
        cr_assert_eq(err, p->want_err, "got %d", err);
        cr_assert_eq(hs, DQ_FRAME_ERROR);
        cr_assert_eq(herr, p->want_err);
    } else {
        cr_assert_eq(st, DQ_FRAME_INCOMPLETE);
        cr_assert_eq(consumed, 32 + p->header_len + p->payload_len);
        cr_assert_eq(hs, DQ_FRAME_OK);
        cr_assert_eq(h.header_len, p->header_len);
        cr_assert_eq(h.payload_len, p->payload_len);
    }
}

Test(frame, limits_of_zero_refuse_everything)
{
    const dq_frame_limits zero = {0, 0};
    uint8_t buf[64];
    size_t n = build_frame(buf, 1, 0, 1);
    dq_frame f;
    size_t consumed;
    int err;
    cr_assert_eq(dq_frame_parse(buf, n, &zero, &f, &consumed, &err), DQ_FRAME_ERROR);
    cr_assert_eq(err, DQ_TOO_LARGE);
}

Test(frame, invalid_arguments)
{
    uint8_t buf[64];
    size_t n = build_frame(buf, 1, 0, 1);
    dq_frame f;
    dq_frame_header h;
    size_t consumed;
    int err = 0;
    cr_assert_eq(dq_frame_parse(NULL, 5, &lim, &f, &consumed, &err), DQ_FRAME_ERROR);
    cr_assert_eq(err, DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_frame_parse(buf, n, NULL, &f, &consumed, &err), DQ_FRAME_ERROR);
    cr_assert_eq(dq_frame_parse(buf, n, &lim, NULL, &consumed, &err), DQ_FRAME_ERROR);
    cr_assert_eq(dq_frame_parse(buf, n, &lim, &f, NULL, &err), DQ_FRAME_ERROR);
    cr_assert_eq(dq_frame_parse_header(buf, n, &lim, NULL, &err), DQ_FRAME_ERROR);
    cr_assert_eq(dq_frame_parse(NULL, 0, &lim, &f, &consumed, &err), DQ_FRAME_INCOMPLETE);
    cr_assert_eq(consumed, 32);
    cr_assert_eq(dq_frame_parse_header(buf, n, &lim, &h, NULL), DQ_FRAME_OK);
}
