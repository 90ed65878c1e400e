/* dquantd disk records (daemon/diskrec.c): the meta round trip, the layout, and the checks the
 * disk tier makes on every record it reads — a record image with any single bit flipped, every
 * bit in turn, fails them (the meta's checksum, the file size, or its layer's checksum). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diskrec.h"
#include "dquant/error.h"
#include "dquant/profile.h"
#include "store.h"

#define NL 3

typedef struct image {
    uint8_t *bytes;
    size_t len;
    dqd_rec_layer layers[NL];
    dqd_rec_meta meta;
    uint8_t prefix[64];
} image;

/* A record of 3 layers (one never written), window_bytes wb, with random body bytes; its meta is
 * written last, with the layers' hashes, as the disk tier does. */
static void build(image *im, uint32_t wb)
{
    memset(im, 0, sizeof *im);
    dqd_rec_meta *m = &im->meta;
    m->kind = DQD_KIND_SEQUENCE;
    m->stamp = 42;
    m->ns = (const uint8_t *)"tenant";
    m->ns_len = 6;
    m->key = (const uint8_t *)"request-7";
    m->key_len = 9;
    snprintf(m->model.name, sizeof m->model.name, "llama");
    snprintf(m->model.builtin, sizeof m->model.builtin, "dq226");
    m->model.layers = NL;
    m->model.q_heads = 4;
    m->model.kv_heads = 2;
    m->model.head_dim = 8;
    m->model.chunk_tokens = 256;
    dq_profile p;
    cr_assert_eq(dq_profile_builtin("dq226", 2, 8, &p), 0);
    cr_assert_eq(dq_profile_serialize(&p, m->model.profile, sizeof m->model.profile, &m->model.profile_len), 0);
    m->window_bytes = wb;
    m->n = 16;
    /* two chunk keys: 16 and 3 bytes */
    uint8_t *q = im->prefix;
    q[0] = 16;
    q[1] = 0;
    memset(q + 2, 0xab, 16);
    q += 18;
    q[0] = 3;
    q[1] = 0;
    memcpy(q + 2, "xyz", 3);
    m->nprefix = 2;
    m->prefix = im->prefix;
    m->prefix_bytes = 18 + 5;
    m->nlayers = NL;
    m->layers = im->layers;
    im->layers[0] = (dqd_rec_layer){.present = true, .tail = 5, .nwin = 2};
    im->layers[1] = (dqd_rec_layer){.present = false};
    im->layers[2] = (dqd_rec_layer){.present = true, .tail = 0, .nwin = 1};
    dqd_rec_layout(m);
    im->len = m->meta_len + m->body_len;
    im->bytes = malloc(im->len);
    srand(9);
    for (size_t i = m->meta_len; i < im->len; i++)
        im->bytes[i] = (uint8_t)rand();
    for (int l = 0; l < NL; l++)
        im->layers[l].hash = dqd_rec_hash(im->bytes + im->layers[l].offset, im->layers[l].bytes);
    cr_assert_eq(dqd_rec_meta_write(m, im->bytes, m->meta_len), 0);
}

/* What the disk tier checks: the meta at start (with the file's size), each layer when read. */
static int check(const uint8_t *bytes, size_t len)
{
    uint64_t meta_len;
    uint32_t nlayers;
    int rc = dqd_rec_meta_len(bytes, len, &meta_len, &nlayers);
    if (rc < 0)
        return rc;
    if (meta_len > len || nlayers > NL)
        return DQ_CORRUPT;
    dqd_rec_meta m;
    dqd_rec_layer layers[NL];
    rc = dqd_rec_meta_read(bytes, meta_len, &m, layers, NL);
    if (rc < 0)
        return rc;
    if (m.meta_len + m.body_len != len)
        return DQ_CORRUPT;
    for (uint32_t l = 0; l < m.nlayers; l++)
        if (layers[l].present && !dqd_rec_layer_ok(&layers[l], bytes + layers[l].offset))
            return DQ_CORRUPT;
    return DQ_OK;
}

Test(diskrec, round_trip)
{
    image im;
    build(&im, 100);
    dqd_rec_meta m;
    dqd_rec_layer layers[NL];
    cr_assert_eq(dqd_rec_meta_read(im.bytes, im.meta.meta_len, &m, layers, NL), 0);
    cr_assert_eq(m.kind, DQD_KIND_SEQUENCE);
    cr_assert_eq(m.stamp, 42);
    cr_assert(m.ns_len == 6 && memcmp(m.ns, "tenant", 6) == 0);
    cr_assert(m.key_len == 9 && memcmp(m.key, "request-7", 9) == 0);
    cr_assert_str_eq(m.model.name, "llama");
    cr_assert_str_eq(m.model.builtin, "dq226");
    cr_assert_eq(m.model.layers, NL);
    cr_assert_eq(m.model.q_heads, 4);
    cr_assert_eq(m.model.kv_heads, 2);
    cr_assert_eq(m.model.head_dim, 8);
    cr_assert_eq(m.model.chunk_tokens, 256);
    cr_assert(m.model.profile_len == im.meta.model.profile_len &&
              memcmp(m.model.profile, im.meta.model.profile, m.model.profile_len) == 0);
    cr_assert_eq(m.window_bytes, 100);
    cr_assert_eq(m.n, 16);
    cr_assert_eq(m.nprefix, 2);
    size_t off = 0, klen;
    const uint8_t *key;
    cr_assert(dqd_rec_prefix_next(&m, &off, &key, &klen) && klen == 16 && key[15] == 0xab);
    cr_assert(dqd_rec_prefix_next(&m, &off, &key, &klen) && klen == 3 && memcmp(key, "xyz", 3) == 0);
    cr_assert_not(dqd_rec_prefix_next(&m, &off, &key, &klen));
    /* The layout: layers back to back after the meta, window records then K then V tails. */
    cr_assert_eq(layers[0].offset, m.meta_len);
    cr_assert_eq(layers[0].bytes, 2 * 100 + 5 * 16 * 2 * 2);
    cr_assert_eq(layers[1].bytes, 0);
    cr_assert_eq(layers[2].offset, layers[0].offset + layers[0].bytes);
    cr_assert_eq(layers[2].bytes, 100);
    cr_assert_eq(m.body_len, layers[0].bytes + layers[2].bytes);
    for (int l = 0; l < NL; l++)
        cr_assert_eq(layers[l].hash, im.layers[l].hash);
    cr_assert_eq(check(im.bytes, im.len), DQ_OK);
    free(im.bytes);
}

/* Every single-bit flip of a whole record image, one at a time, is caught. */
Test(diskrec, every_flipped_bit_is_caught)
{
    image im;
    build(&im, 700);
    cr_assert_eq(check(im.bytes, im.len), DQ_OK);
    size_t caught = 0, bits = im.len * 8;
    for (size_t b = 0; b < bits; b++) {
        im.bytes[b / 8] ^= (uint8_t)(1u << (b % 8));
        int rc = check(im.bytes, im.len);
        im.bytes[b / 8] ^= (uint8_t)(1u << (b % 8));
        if (rc < 0)
            caught++;
        else
            cr_log_error("bit %zu (byte %zu of %zu) flipped went unnoticed", b, b / 8, im.len);
    }
    cr_assert_eq(caught, bits, "%zu of %zu flipped bits caught", caught, bits);
    cr_assert_eq(check(im.bytes, im.len), DQ_OK);
    free(im.bytes);
}

/* Truncated or extended files, another version, impossible lengths. */
Test(diskrec, bad_shapes)
{
    image im;
    build(&im, 64);
    for (size_t cut = 0; cut < im.len; cut += 7)
        cr_assert_lt(check(im.bytes, cut), 0, "a record cut to %zu of %zu bytes passed", cut, im.len);
    uint8_t *longer = calloc(1, im.len + 1);
    memcpy(longer, im.bytes, im.len);
    cr_assert_eq(check(longer, im.len + 1), DQ_CORRUPT);
    free(longer);
    uint64_t ml;
    uint32_t nl;
    im.bytes[4] = 2; /* version 2 */
    cr_assert_eq(dqd_rec_meta_len(im.bytes, im.len, &ml, &nl), DQ_VERSION);
    im.bytes[4] = 1;
    uint8_t save = im.bytes[12];
    im.bytes[12] = 0; /* no layers */
    im.bytes[13] = 0;
    cr_assert_eq(dqd_rec_meta_len(im.bytes, im.len, &ml, &nl), DQ_CORRUPT);
    im.bytes[12] = save;
    /* A meta that does not fit its fields is refused at write time. */
    im.meta.model.layers = NL + 1;
    uint8_t buf[4096];
    cr_assert_eq(dqd_rec_meta_write(&im.meta, buf, sizeof buf), DQ_INVALID_ARGUMENT);
    im.meta.model.layers = NL;
    cr_assert_eq(dqd_rec_meta_write(&im.meta, buf, 10), DQ_INVALID_ARGUMENT);
    free(im.bytes);
}
