/* dquantd disk records (see diskrec.h). */
#include "diskrec.h"

#include <string.h>
#include <xxhash.h>

#include "dquant/error.h"
#include "store.h"

#define LAYER_ENTRY 24u

static void put16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get16(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

uint64_t dqd_rec_hash(const void *bytes, size_t len)
{
    return XXH3_64bits(bytes, len);
}

bool dqd_rec_layer_ok(const dqd_rec_layer *l, const void *bytes)
{
    return dqd_rec_hash(bytes, l->bytes) == l->hash;
}

bool dqd_rec_prefix_next(const dqd_rec_meta *m, size_t *off, const uint8_t **key, size_t *key_len)
{
    if (*off + 2 > m->prefix_bytes)
        return false;
    size_t n = get16(m->prefix + *off);
    if (*off + 2 + n > m->prefix_bytes)
        return false;
    *key = m->prefix + *off + 2;
    *key_len = n;
    *off += 2 + n;
    return true;
}

static uint64_t variable_bytes(const dqd_rec_meta *m)
{
    return (uint64_t)m->ns_len + m->key_len + strlen(m->model.name) + strlen(m->model.builtin) + m->model.profile_len +
           m->prefix_bytes + (uint64_t)m->nlayers * LAYER_ENTRY + 8;
}

void dqd_rec_layout(dqd_rec_meta *m)
{
    m->meta_len = DQD_REC_FIXED + variable_bytes(m);
    uint64_t off = m->meta_len;
    for (uint32_t i = 0; i < m->nlayers; i++) {
        dqd_rec_layer *l = &m->layers[i];
        l->offset = off;
        l->bytes = l->present ? l->nwin * m->window_bytes + (uint64_t)l->tail * m->n * 2u * 2u : 0;
        off += l->bytes;
    }
    m->body_len = off - m->meta_len;
}

int dqd_rec_meta_write(const dqd_rec_meta *m, uint8_t *buf, size_t cap)
{
    const size_t name_len = strlen(m->model.name), builtin_len = strlen(m->model.builtin);
    if (m->meta_len > cap || m->meta_len != DQD_REC_FIXED + variable_bytes(m) || m->meta_len > DQD_REC_META_MAX ||
        m->ns_len > UINT16_MAX || m->key_len > UINT16_MAX || name_len > UINT16_MAX || builtin_len > UINT16_MAX ||
        m->nlayers != m->model.layers)
        return DQ_INVALID_ARGUMENT;
    uint8_t *p = buf;
    put32(p, DQD_REC_MAGIC);
    put16(p + 4, DQD_REC_VERSION);
    p[6] = m->kind;
    p[7] = 0;
    put32(p + 8, (uint32_t)m->meta_len);
    put32(p + 12, m->nlayers);
    put64(p + 16, m->body_len);
    put64(p + 24, m->stamp);
    put16(p + 32, (uint32_t)m->ns_len);
    put16(p + 34, (uint32_t)m->key_len);
    put32(p + 36, m->nprefix);
    put16(p + 40, (uint32_t)name_len);
    put16(p + 42, (uint32_t)builtin_len);
    put32(p + 44, (uint32_t)m->model.profile_len);
    put32(p + 48, m->model.q_heads);
    put32(p + 52, m->model.kv_heads);
    put32(p + 56, m->model.head_dim);
    put32(p + 60, m->model.chunk_tokens);
    put32(p + 64, m->window_bytes);
    put32(p + 68, m->n);
    p += DQD_REC_FIXED;
    memcpy(p, m->ns, m->ns_len);
    p += m->ns_len;
    memcpy(p, m->key, m->key_len);
    p += m->key_len;
    memcpy(p, m->model.name, name_len);
    p += name_len;
    memcpy(p, m->model.builtin, builtin_len);
    p += builtin_len;
    memcpy(p, m->model.profile, m->model.profile_len);
    p += m->model.profile_len;
    if (m->prefix_bytes)
        memcpy(p, m->prefix, m->prefix_bytes);
    p += m->prefix_bytes;
    for (uint32_t i = 0; i < m->nlayers; i++) {
        const dqd_rec_layer *l = &m->layers[i];
        put32(p, l->present);
        put32(p + 4, l->tail);
        put64(p + 8, l->nwin);
        put64(p + 16, l->hash);
        p += LAYER_ENTRY;
    }
    put64(p, XXH3_64bits(buf, (size_t)(p - buf)));
    return DQ_OK;
}

int dqd_rec_meta_len(const uint8_t *head, size_t len, uint64_t *meta_len, uint32_t *nlayers)
{
    if (len < DQD_REC_FIXED || get32(head) != DQD_REC_MAGIC)
        return DQ_CORRUPT;
    if (get16(head + 4) != DQD_REC_VERSION)
        return DQ_VERSION;
    uint64_t ml = get32(head + 8);
    uint32_t nl = get32(head + 12);
    if (ml < DQD_REC_FIXED + 8 || ml > DQD_REC_META_MAX || nl == 0 || nl > 4096)
        return DQ_CORRUPT;
    *meta_len = ml;
    *nlayers = nl;
    return DQ_OK;
}

/* Takes n bytes at *p if they are there (before end). */
static const uint8_t *take(const uint8_t **p, const uint8_t *end, size_t n)
{
    if ((size_t)(end - *p) < n)
        return NULL;
    const uint8_t *at = *p;
    *p += n;
    return at;
}

static bool copy_str(char *dst, size_t cap, const uint8_t *src, size_t n)
{
    if (n >= cap || memchr(src, 0, n))
        return false;
    memcpy(dst, src, n);
    dst[n] = 0;
    return true;
}

int dqd_rec_meta_read(const uint8_t *buf, size_t len, dqd_rec_meta *m, dqd_rec_layer *layers, uint32_t max_layers)
{
    uint64_t ml;
    uint32_t nl;
    int rc = dqd_rec_meta_len(buf, len, &ml, &nl);
    if (rc < 0)
        return rc;
    if (ml != len || XXH3_64bits(buf, len - 8) != get64(buf + len - 8))
        return DQ_CORRUPT;
    memset(m, 0, sizeof *m);
    m->meta_len = ml;
    m->kind = buf[6];
    m->nlayers = get32(buf + 12);
    m->body_len = get64(buf + 16);
    m->stamp = get64(buf + 24);
    m->ns_len = get16(buf + 32);
    m->key_len = get16(buf + 34);
    m->nprefix = get32(buf + 36);
    size_t name_len = get16(buf + 40), builtin_len = get16(buf + 42), profile_len = get32(buf + 44);
    m->model.q_heads = get32(buf + 48);
    m->model.kv_heads = get32(buf + 52);
    m->model.head_dim = get32(buf + 56);
    m->model.chunk_tokens = get32(buf + 60);
    m->window_bytes = get32(buf + 64);
    m->n = get32(buf + 68);
    m->model.layers = m->nlayers;
    if ((m->kind != DQD_KIND_SEQUENCE && m->kind != DQD_KIND_CHUNK) || buf[7] != 0)
        return DQ_CORRUPT;
    if (m->nlayers > max_layers)
        return DQ_SHAPE;

    const uint8_t *p = buf + DQD_REC_FIXED, *end = buf + len - 8;
    const uint8_t *name, *builtin, *profile;
    if (!(m->ns = take(&p, end, m->ns_len)) || !(m->key = take(&p, end, m->key_len)) ||
        !(name = take(&p, end, name_len)) || !(builtin = take(&p, end, builtin_len)) ||
        !(profile = take(&p, end, profile_len)))
        return DQ_CORRUPT;
    if (!copy_str(m->model.name, sizeof m->model.name, name, name_len) ||
        !copy_str(m->model.builtin, sizeof m->model.builtin, builtin, builtin_len) ||
        profile_len > sizeof m->model.profile)
        return DQ_CORRUPT;
    memcpy(m->model.profile, profile, profile_len);
    m->model.profile_len = profile_len;
    /* The key list: nprefix entries, each (len u16 | key). */
    m->prefix = p;
    for (uint32_t i = 0; i < m->nprefix; i++) {
        const uint8_t *lenp = take(&p, end, 2);
        if (!lenp || !take(&p, end, get16(lenp)))
            return DQ_CORRUPT;
    }
    m->prefix_bytes = (size_t)(p - m->prefix);
    if ((size_t)(end - p) != (uint64_t)m->nlayers * LAYER_ENTRY)
        return DQ_CORRUPT;
    m->layers = layers;
    for (uint32_t i = 0; i < m->nlayers; i++, p += LAYER_ENTRY) {
        uint32_t present = get32(p);
        if (present > 1)
            return DQ_CORRUPT;
        layers[i].present = present;
        layers[i].tail = get32(p + 4);
        layers[i].nwin = get64(p + 8);
        layers[i].hash = get64(p + 16);
        if (!present && (layers[i].tail || layers[i].nwin))
            return DQ_CORRUPT;
        /* Bounds that keep the layout's arithmetic far from overflowing. */
        if (layers[i].nwin > (1u << 24) || layers[i].tail > (1u << 20) || m->window_bytes > (1u << 26) ||
            m->n > (1u << 24))
            return DQ_CORRUPT;
    }
    const uint64_t body = m->body_len;
    dqd_rec_layout(m);
    if (m->meta_len != ml || m->body_len != body)
        return DQ_CORRUPT;
    return DQ_OK;
}
