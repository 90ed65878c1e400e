/* dquantd store: budget accounting, LRU eviction order, pinning, references, RESOURCE_EXHAUSTED
 * leaving everything in place, FIFO access grants, and undoable appends. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "append.h"
#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/layer.h"
#include "hostmem.h"
#include "registry.h"
#include "store.h"

#define KV 2
#define HD 64
#define N (KV * HD)

static dqd_hostmem mem;
static dqd_registry *reg;
static dqd_store *store;
static dqd_model *model;
static dq_workspace *ws;

static void setup(void)
{
    dqd_hostmem_init(&mem);
    cr_assert_eq(dqd_registry_create(&mem, 16, &reg), 0);
    dqd_model_spec spec = {
        .name = "tiny", .layers = 2, .q_heads = 4, .kv_heads = KV, .head_dim = HD, .profile_name = "dq226"};
    bool existed;
    char msg[256];
    cr_assert_eq(dqd_registry_register(reg, &spec, &model, &existed, msg, sizeof msg), 0, "%s", msg);
    ws = dqd_codec_ws_take(model->codec);
    cr_assert_not_null(ws);
    cr_assert_eq(dqd_store_create(&mem, 64ull << 20, &store), 0);
}

static void teardown(void)
{
    /* The tests leave their last reservation; the store wants every one released before it goes
     * (as each operation releases its own). */
    dqd_store_stats st;
    dqd_store_get_stats(store, &st);
    dqd_store_unreserve(store, st.reserved);
    dqd_store_destroy(store);
    dqd_codec_ws_give(model->codec, ws);
    dqd_registry_destroy(reg);
    cr_assert_eq(dqd_hostmem_used(&mem), 0, "every counted byte is given back");
}

TestSuite(store, .init = setup, .fini = teardown);

static float *random_kv(size_t ntok, unsigned seed)
{
    float *x = malloc(ntok * N * sizeof(float));
    srand(seed);
    for (size_t i = 0; i < ntok * N; i++)
        x[i] = (float)((double)rand() / RAND_MAX * 2.0 - 1.0);
    return x;
}

/* Appends ntok tokens to a layer as a PUT holding write access would, then commits. */
static void append_commit(dqd_seq *seq, uint32_t layer, size_t ntok, unsigned seed)
{
    float *k = random_kv(ntok, seed), *v = random_kv(ntok, seed + 1);
    dqd_append a;
    cr_assert_eq(dqd_append_apply(&a, model->codec, ws, &seq->layers[layer], k, v, DQ_DTYPE_F32, ntok, NULL), 0);
    dqd_append_clear(&a);
    dqd_store_commit(store, seq);
    free(k);
    free(v);
}

static dqd_seq *make_seq(const char *key, size_t ntok)
{
    dqd_seq *seq;
    cr_assert_eq(dqd_store_insert(store, "ns", 2, (const uint8_t *)key, strlen(key), model, &seq), 0);
    append_commit(seq, 0, ntok, (unsigned)key[0]);
    dqd_seq_unref(seq);
    return seq;
}

static bool present(const char *key)
{
    dqd_seq *s = dqd_store_lookup(store, "ns", 2, (const uint8_t *)key, strlen(key));
    dqd_seq_unref(s);
    return s != NULL;
}

static uint64_t available(void)
{
    dqd_store_stats st;
    dqd_store_get_stats(store, &st);
    return st.budget - st.used - st.reserved;
}

Test(store, accounting)
{
    uint64_t before = dqd_hostmem_used(&mem);
    dqd_seq *seq;
    cr_assert_eq(dqd_store_insert(store, "ns", 2, (const uint8_t *)"a", 1, model, &seq), 0);
    cr_assert_not(dqd_seq_alive(seq), "invisible until its first commit");
    uint64_t need = dqd_store_append_need(model->codec, NULL, 300);
    uint64_t mid = dqd_hostmem_used(&mem);
    append_commit(seq, 1, 300, 7);
    uint64_t after = dqd_hostmem_used(&mem);
    cr_assert(dqd_seq_alive(seq));
    cr_assert_leq(after - mid, need, "the estimate (%llu) must cover what the append allocated (%llu)",
                  (unsigned long long)need, (unsigned long long)(after - mid));

    dqd_store_stats st;
    dqd_store_get_stats(store, &st);
    const dq_layer *l = seq->layers[1];
    cr_assert_eq(st.sequences, 1);
    cr_assert_eq(st.token_layers, 300);
    cr_assert_eq(st.stored_bytes, dq_layer_stored_bytes(l));
    cr_assert_eq(st.bf16_bytes, 300ull * N * 2 * 2);
    cr_assert_lt(st.stored_bytes, st.bf16_bytes / 3, "the sealed windows are compressed");
    cr_assert_geq(seq->bytes, dq_layer_allocated_bytes(l) + seq->overhead);
    /* What evicting it frees is close to what it costs. */
    cr_assert_geq(seq->bytes, after - before);
    cr_assert_leq(seq->bytes, (after - before) * 11 / 10);

    dqd_store_remove(store, seq);
    dqd_seq_unref(seq);
    cr_assert_eq(dqd_hostmem_used(&mem), before, "removing the sequence frees all of it");
    dqd_store_get_stats(store, &st);
    cr_assert_eq(st.sequences, 0);
    cr_assert_eq(st.token_layers, 0);
    cr_assert_eq(st.stored_bytes, 0);
}

Test(store, lru_eviction_order)
{
    make_seq("a", 256);
    make_seq("b", 256);
    make_seq("c", 256);
    dqd_seq *a = dqd_store_lookup(store, "ns", 2, (const uint8_t *)"a", 1);
    dqd_store_touch(store, a); /* b is now the least recently used */
    dqd_seq_unref(a);

    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
    cr_assert_not(present("b"));
    cr_assert(present("a") && present("c"));
    dqd_store_stats st;
    dqd_store_get_stats(store, &st);
    cr_assert_eq(st.evictions, 1, "one victim made enough room");
    cr_assert_eq(st.sequences, 2);
    dqd_store_unreserve(store, st.reserved);

    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
    cr_assert_not(present("c"), "then c, the next least recently used");
    cr_assert(present("a"));
}

Test(store, pinned_and_referenced_are_not_evicted)
{
    make_seq("a", 256);
    make_seq("b", 256);
    make_seq("c", 256);
    dqd_seq *a = dqd_store_lookup(store, "ns", 2, (const uint8_t *)"a", 1);
    dqd_store_set_pinned(store, a, true);
    dqd_seq_unref(a);
    dqd_seq *b = dqd_store_lookup(store, "ns", 2, (const uint8_t *)"b", 1); /* in use by a request */

    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
    cr_assert(present("a"), "pinned");
    cr_assert(present("b"), "referenced");
    cr_assert_not(present("c"));
    dqd_store_stats st;
    dqd_store_get_stats(store, &st);
    cr_assert_eq(st.pinned, 1);
    dqd_seq_unref(b);
}

Test(store, exhausted_leaves_store_unchanged)
{
    make_seq("a", 256);
    make_seq("b", 256);
    dqd_seq *a = dqd_store_lookup(store, "ns", 2, (const uint8_t *)"a", 1);
    dqd_store_set_pinned(store, a, true);
    dqd_seq_unref(a);
    dqd_seq *b = dqd_store_lookup(store, "ns", 2, (const uint8_t *)"b", 1);
    uint64_t b_bytes = b->bytes;
    dqd_seq_unref(b);

    dqd_store_stats before, after;
    dqd_store_get_stats(store, &before);
    /* Evicting b (the only candidate) would not make enough room: nothing may be evicted. */
    cr_assert_eq(dqd_store_reserve(store, available() + b_bytes + 4096, NULL), DQ_RESOURCE_EXHAUSTED);
    dqd_store_get_stats(store, &after);
    cr_assert(present("a") && present("b"));
    cr_assert_eq(after.evictions, before.evictions);
    cr_assert_eq(after.used, before.used);
    cr_assert_eq(after.reserved, before.reserved);
    cr_assert_eq(after.sequences, 2);

    /* Larger than the whole budget. */
    cr_assert_eq(dqd_store_reserve(store, before.budget + 1, NULL), DQ_RESOURCE_EXHAUSTED);
    cr_assert(present("a") && present("b"));

    /* Everything pinned. */
    b = dqd_store_lookup(store, "ns", 2, (const uint8_t *)"b", 1);
    dqd_store_set_pinned(store, b, true);
    dqd_seq_unref(b);
    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), DQ_RESOURCE_EXHAUSTED);
    dqd_store_get_stats(store, &after);
    cr_assert_eq(after.evictions, 0);
    cr_assert_eq(after.pinned, 2);

    /* Unpinned again, b can go. */
    b = dqd_store_lookup(store, "ns", 2, (const uint8_t *)"b", 1);
    dqd_store_set_pinned(store, b, false);
    dqd_seq_unref(b);
    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
    cr_assert_not(present("b"));
}

Test(store, requester_is_never_its_own_victim)
{
    make_seq("a", 256);
    dqd_seq *a = dqd_store_lookup(store, "ns", 2, (const uint8_t *)"a", 1);
    dqd_seq_unref(a); /* unreferenced, so only the requester rule protects it */
    cr_assert_eq(dqd_store_reserve(store, available() + 1, a), DQ_RESOURCE_EXHAUSTED);
    cr_assert(present("a"));
}

Test(store, namespaces_are_distinct)
{
    dqd_seq *x, *y;
    cr_assert_eq(dqd_store_insert(store, "n1", 2, (const uint8_t *)"k", 1, model, &x), 0);
    cr_assert_eq(dqd_store_insert(store, "n2", 2, (const uint8_t *)"k", 1, model, &y), 0);
    cr_assert_neq(x, y);
    dqd_seq *dup;
    cr_assert_eq(dqd_store_insert(store, "n1", 2, (const uint8_t *)"k", 1, model, &dup), DQ_EXISTS);
    /* "n1"+"2k" must not collide with "n12"+"k" */
    dqd_seq *z;
    cr_assert_eq(dqd_store_insert(store, "n12", 3, (const uint8_t *)"k", 1, model, &z), 0);
    dqd_seq *w = dqd_store_lookup(store, "n1", 2, (const uint8_t *)"2k", 2);
    cr_assert_null(w);
    dqd_seq_unref(x);
    dqd_seq_unref(y);
    dqd_seq_unref(z);
}

Test(store, many_sequences_grow_the_table)
{
    char key[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(key, sizeof key, "seq-%d", i);
        dqd_seq *s;
        cr_assert_eq(dqd_store_insert(store, "", 0, (const uint8_t *)key, strlen(key), model, &s), 0);
        dqd_seq_unref(s);
    }
    for (int i = 0; i < 3000; i += 97) {
        snprintf(key, sizeof key, "seq-%d", i);
        dqd_seq *s = dqd_store_lookup(store, "", 0, (const uint8_t *)key, strlen(key));
        cr_assert_not_null(s, "%s", key);
        dqd_seq_unref(s);
    }
}

/* ---- access grants ---- */

static int order[8], norder;

typedef struct rec_waiter {
    dqd_waiter w;
    int id;
} rec_waiter;

static void granted(dqd_waiter *w)
{
    order[norder++] = ((rec_waiter *)w)->id;
}

Test(store, fifo_access)
{
    dqd_seq *s;
    cr_assert_eq(dqd_store_insert(store, "ns", 2, (const uint8_t *)"q", 1, model, &s), 0);
    norder = 0;
    rec_waiter w1 = {{NULL, DQD_ACCESS_WRITE, granted}, 1};
    rec_waiter r2 = {{NULL, DQD_ACCESS_READ, granted}, 2};
    rec_waiter r3 = {{NULL, DQD_ACCESS_READ, granted}, 3};
    rec_waiter w4 = {{NULL, DQD_ACCESS_WRITE, granted}, 4};
    rec_waiter r5 = {{NULL, DQD_ACCESS_READ, granted}, 5};
    cr_assert(dqd_seq_acquire(s, &w1.w), "free: granted at once");
    cr_assert_not(dqd_seq_acquire(s, &r2.w));
    cr_assert_not(dqd_seq_acquire(s, &r3.w));
    cr_assert_not(dqd_seq_acquire(s, &w4.w));
    cr_assert_not(dqd_seq_acquire(s, &r5.w), "a reader queues behind a waiting writer");
    cr_assert_eq(norder, 0);

    dqd_seq_release(s, DQD_ACCESS_WRITE);
    cr_assert_eq(norder, 2, "both readers at the head are granted together");
    cr_assert_eq(order[0], 2);
    cr_assert_eq(order[1], 3);
    dqd_seq_release(s, DQD_ACCESS_READ);
    cr_assert_eq(norder, 2, "the writer waits for the last reader");
    dqd_seq_release(s, DQD_ACCESS_READ);
    cr_assert_eq(norder, 3);
    cr_assert_eq(order[2], 4);
    dqd_seq_release(s, DQD_ACCESS_WRITE);
    cr_assert_eq(norder, 4);
    cr_assert_eq(order[3], 5);
    dqd_seq_release(s, DQD_ACCESS_READ);
    cr_assert(dqd_seq_acquire(s, &w1.w));
    dqd_seq_release(s, DQD_ACCESS_WRITE);
    dqd_seq_unref(s);
}

/* ---- undoable appends ---- */

static uint16_t *decode_all(const dq_layer *l, dq_kind kind)
{
    size_t t = dq_layer_tokens(l);
    uint16_t *out = malloc((t ? t : 1) * N * sizeof(uint16_t));
    if (t)
        cr_assert_eq(dq_layer_decode(l, ws, kind, 0, t, out, DQ_DTYPE_BF16), 0);
    return out;
}

static void check_rollback(size_t have, size_t add)
{
    dqd_seq *s;
    cr_assert_eq(dqd_store_insert(store, "ns", 2, (const uint8_t *)"r", 1, model, &s), 0);
    append_commit(s, 0, have, 3);
    size_t windows = dq_layer_window_count(s->layers[0]);
    uint16_t *k0 = decode_all(s->layers[0], DQ_KIND_K), *v0 = decode_all(s->layers[0], DQ_KIND_V);

    float *k = random_kv(add, 11), *v = random_kv(add, 12);
    dqd_append a;
    cr_assert_eq(dqd_append_apply(&a, model->codec, ws, &s->layers[0], k, v, DQ_DTYPE_F32, add, NULL), 0);
    cr_assert_eq(dq_layer_tokens(s->layers[0]), have + add);
    cr_assert_eq(dqd_append_rollback(&a, model->codec, &s->layers[0]), 0);
    dqd_append_clear(&a);

    cr_assert_eq(dq_layer_tokens(s->layers[0]), have);
    cr_assert_eq(dq_layer_window_count(s->layers[0]), windows);
    uint16_t *k1 = decode_all(s->layers[0], DQ_KIND_K), *v1 = decode_all(s->layers[0], DQ_KIND_V);
    cr_assert_eq(memcmp(k0, k1, have * N * 2), 0, "keys as before");
    cr_assert_eq(memcmp(v0, v1, have * N * 2), 0, "values as before");
    free(k0);
    free(v0);
    free(k1);
    free(v1);
    free(k);
    free(v);
    dqd_seq_unref(s);
}

Test(store, rollback_without_seal)
{
    check_rollback(10, 5);
}

Test(store, rollback_across_a_seal)
{
    check_rollback(100, 60); /* the 128th token seals a window */
}

Test(store, rollback_of_sealed_history)
{
    check_rollback(300, 200);
}

Test(store, rollback_of_a_created_layer)
{
    dqd_seq *s;
    cr_assert_eq(dqd_store_insert(store, "ns", 2, (const uint8_t *)"c", 1, model, &s), 0);
    float *k = random_kv(4, 1), *v = random_kv(4, 2);
    dqd_append a;
    cr_assert_eq(dqd_append_apply(&a, model->codec, ws, &s->layers[1], k, v, DQ_DTYPE_F32, 4, NULL), 0);
    cr_assert(a.created);
    cr_assert_eq(dqd_append_rollback(&a, model->codec, &s->layers[1]), 0);
    cr_assert_null(s->layers[1]);
    free(k);
    free(v);
    dqd_seq_unref(s);
}

Test(store, failed_append_changes_nothing)
{
    dqd_seq *s;
    cr_assert_eq(dqd_store_insert(store, "ns", 2, (const uint8_t *)"n", 1, model, &s), 0);
    float *k = random_kv(4, 1), *v = random_kv(4, 2);
    k[7] = NAN;
    dqd_append a;
    cr_assert_eq(dqd_append_apply(&a, model->codec, ws, &s->layers[0], k, v, DQ_DTYPE_F32, 4, NULL), DQ_NONFINITE);
    cr_assert_null(s->layers[0], "the layer this append created is gone again");
    free(k);
    free(v);
    dqd_seq_unref(s);
}

/* Registering again: the same built-in spec is found without building the profile; the same
 * profile sent serialized is the same model; any other difference is DQ_EXISTS. */
Test(store, register_again)
{
    char msg[256];
    bool existed = false;
    dqd_model *m = NULL;
    dqd_model_spec spec = {
        .name = "tiny", .layers = 2, .q_heads = 4, .kv_heads = KV, .head_dim = HD, .profile_name = "dq226"};
    cr_assert_eq(dqd_registry_register(reg, &spec, &m, &existed, msg, sizeof msg), 0, "%s", msg);
    cr_assert(existed);
    cr_assert_eq(m, model);
    spec.profile_name = NULL; /* the default built-in is dq226 */
    cr_assert_eq(dqd_registry_register(reg, &spec, &m, &existed, msg, sizeof msg), 0, "%s", msg);
    cr_assert(existed);
    spec.profile = model->codec->pbytes;
    spec.profile_len = model->codec->plen;
    cr_assert_eq(dqd_registry_register(reg, &spec, &m, &existed, msg, sizeof msg), 0, "%s", msg);
    cr_assert(existed);
    cr_assert_eq(m, model);
    spec.profile = NULL, spec.profile_len = 0;
    dqd_model_spec other = spec;
    other.chunk_tokens = 2 * DQD_DEFAULT_CHUNK_TOKENS;
    cr_assert_eq(dqd_registry_register(reg, &other, &m, &existed, msg, sizeof msg), DQ_EXISTS);
    other = spec;
    other.layers = 3;
    cr_assert_eq(dqd_registry_register(reg, &other, &m, &existed, msg, sizeof msg), DQ_EXISTS);
    other = spec;
    other.profile_name = "dq196";
    cr_assert_eq(dqd_registry_register(reg, &other, &m, &existed, msg, sizeof msg), DQ_EXISTS, "%s", msg);
}
