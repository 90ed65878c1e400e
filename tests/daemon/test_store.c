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
    cr_assert_eq(dqd_append_apply(&a, model->codec, layer, ws, &seq->layers[layer], k, v, DQ_DTYPE_F32, ntok, NULL), 0);
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
    rec_waiter w1 = {{NULL, DQD_ACCESS_WRITE, granted, false}, 1};
    rec_waiter r2 = {{NULL, DQD_ACCESS_READ, granted, false}, 2};
    rec_waiter r3 = {{NULL, DQD_ACCESS_READ, granted, false}, 3};
    rec_waiter w4 = {{NULL, DQD_ACCESS_WRITE, granted, false}, 4};
    rec_waiter r5 = {{NULL, DQD_ACCESS_READ, granted, false}, 5};
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
    cr_assert_eq(dqd_append_apply(&a, model->codec, 0, ws, &s->layers[0], k, v, DQ_DTYPE_F32, add, NULL), 0);
    cr_assert_eq(dq_layer_tokens(s->layers[0]), have + add);
    cr_assert_eq(dqd_append_rollback(&a, model->codec, 0, &s->layers[0]), 0);
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
    cr_assert_eq(dqd_append_apply(&a, model->codec, 1, ws, &s->layers[1], k, v, DQ_DTYPE_F32, 4, NULL), 0);
    cr_assert(a.created);
    cr_assert_eq(dqd_append_rollback(&a, model->codec, 1, &s->layers[1]), 0);
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
    cr_assert_eq(dqd_append_apply(&a, model->codec, 0, ws, &s->layers[0], k, v, DQ_DTYPE_F32, 4, NULL), DQ_NONFINITE);
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

/* ---- the disk tier's state machine, with fake record I/O ----
 *
 * The hooks record what the store asks for; the test then finishes the spill or the load by hand,
 * as disktier.c does from its workers' completion. A "record" keeps the layers' raw parts, so that
 * a load restores exactly what was spilled. */

typedef struct fake_rec {
    uint8_t *windows[2];
    uint16_t *tk[2], *tv[2];
    size_t nwin[2], tail[2];
    bool present[2];
} fake_rec;

static struct {
    dqd_seq *spilling, *loading;
    int spills, loads, forgets, removes;
    int spill_rc, load_rc;
} fk;

static int fake_spill(void *arg, dqd_seq *seq)
{
    (void)arg;
    if (fk.spill_rc)
        return fk.spill_rc;
    cr_assert(seq->spilling && seq->writer, "held exclusively while written");
    cr_assert_eq(dqd_store_disk_reserve(store, 4096), 0);
    fk.spilling = seq;
    fk.spills++;
    return 0;
}

static int fake_load(void *arg, dqd_seq *seq)
{
    (void)arg;
    if (fk.load_rc)
        return fk.load_rc;
    cr_assert(seq->loading && seq->writer && seq->on_disk);
    fk.loading = seq;
    fk.loads++;
    return 0;
}

static void fake_forget(void *arg, dqd_seq *seq, bool remove)
{
    (void)arg;
    fake_rec *r = (fake_rec *)seq->drec;
    for (int l = 0; l < 2; l++) {
        free(r->windows[l]);
        free(r->tk[l]);
        free(r->tv[l]);
    }
    free(r);
    seq->drec = NULL;
    fk.forgets++;
    fk.removes += remove;
}

static const dqd_store_disk_ops fake_ops = {fake_spill, fake_load, fake_forget};

static void disk_setup(void)
{
    setup();
    memset(&fk, 0, sizeof fk);
    dqd_store_disk_enable(store, 3 * 4096, &fake_ops, NULL);
}

TestSuite(store_disk, .init = disk_setup, .fini = teardown);

/* Finishes the spill in progress: the layers' parts become its record. */
static void finish_spill(int rc)
{
    dqd_seq *seq = fk.spilling;
    cr_assert_not_null(seq);
    fk.spilling = NULL;
    fake_rec *r = NULL;
    if (rc == 0) {
        r = calloc(1, sizeof *r);
        const size_t wb = model->codec->window_bytes;
        for (int l = 0; l < 2; l++) {
            const dq_layer *dl = seq->layers[l];
            if (!(r->present[l] = dl != NULL))
                continue;
            r->nwin[l] = dq_layer_window_count(dl);
            r->tail[l] = dq_layer_tail_tokens(dl);
            r->windows[l] = malloc(r->nwin[l] * wb + 1);
            for (size_t w = 0; w < r->nwin[l]; w++)
                memcpy(r->windows[l] + w * wb, dq_layer_window(dl, w), wb);
            size_t tb = r->tail[l] * N * sizeof(uint16_t);
            r->tk[l] = malloc(tb + 2);
            r->tv[l] = malloc(tb + 2);
            memcpy(r->tk[l], dq_layer_tail(dl, DQ_KIND_K), tb);
            memcpy(r->tv[l], dq_layer_tail(dl, DQ_KIND_V), tb);
        }
    }
    dqd_store_spill_done(store, seq, rc, (dqd_drec *)r, 64, 4096);
}

static void finish_load(int rc)
{
    dqd_seq *seq = fk.loading;
    cr_assert_not_null(seq);
    fk.loading = NULL;
    dq_layer *layers[2] = {NULL, NULL};
    const fake_rec *r = (const fake_rec *)seq->drec;
    for (int l = 0; rc == 0 && l < 2; l++)
        if (r->present[l])
            cr_assert_eq(dq_layer_restore(model->codec->codec, r->windows[l], r->nwin[l], r->tk[l], r->tv[l],
                                          r->tail[l], &layers[l]),
                         0);
    dqd_store_load_done(store, seq, rc, rc == 0 ? layers : NULL);
}

static dqd_seq *find(const char *key)
{
    return dqd_store_lookup(store, "ns", 2, (const uint8_t *)key, strlen(key));
}

static dqd_store_stats stats(void)
{
    dqd_store_stats st;
    dqd_store_get_stats(store, &st);
    return st;
}

/* Eviction spills: the victim's bytes count as free at once, it is held until written, then it is
 * a stub (no layers, still found, still alive) whose next reader waits for a load; the load keeps
 * the record as a clean copy, so the next eviction writes nothing. */
Test(store_disk, spill_stub_load_clean_copy)
{
    make_seq("a", 300);
    make_seq("b", 300);
    dqd_seq *held = find("a");
    uint16_t *k0 = decode_all(held->layers[0], DQ_KIND_K);
    dqd_seq_unref(held);
    uint64_t before = available();
    cr_assert_eq(dqd_store_reserve(store, before + 1, NULL), 0, "a spill makes room before it is written");
    cr_assert_eq(fk.spills, 1);
    dqd_seq *a = fk.spilling;
    cr_assert(a->key[0] == 'a' && a->layers[0], "the least recently used, layers still there while written");
    dqd_store_unreserve(store, stats().reserved);

    /* A reader arriving meanwhile waits behind the write, then behind the load. */
    norder = 0;
    rec_waiter r1 = {{NULL, DQD_ACCESS_READ, granted, false}, 1};
    dqd_seq *ref = find("a");
    cr_assert_eq(ref, a);
    cr_assert_not(dqd_seq_acquire(a, &r1.w));
    finish_spill(0);
    cr_assert(a->on_disk && !a->layers[0] && dqd_seq_alive(a), "a stub");
    cr_assert_eq(stats().disk_records, 1);
    cr_assert_eq(stats().disk_stubs, 1);
    cr_assert_eq(fk.loads, 1, "the waiting reader asked for a load");
    cr_assert_eq(norder, 0);
    finish_load(0);
    cr_assert_eq(norder, 1, "granted once the layers are back");
    cr_assert(!a->on_disk && a->layers[0] && a->drec, "back in memory, the record kept");
    uint16_t *k1 = decode_all(a->layers[0], DQ_KIND_K);
    cr_assert_eq(memcmp(k0, k1, 300 * N * 2), 0);
    dqd_seq_release(a, DQD_ACCESS_READ);
    dqd_seq_unref(ref);

    /* b is older now: evict both; a goes without a write. */
    dqd_seq *b = find("b");
    dqd_store_touch(store, b);
    dqd_seq_unref(b);
    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
    dqd_store_unreserve(store, stats().reserved);
    cr_assert(a->on_disk);
    cr_assert_eq(fk.spills, 1, "a clean copy needs no write");
    cr_assert_eq(stats().disk_clean_evictions, 1);
    cr_assert_eq(stats().disk_loads, 1);
    free(k0);
    free(k1);
}

/* A write to a sequence read back from disk removes its record before it commits; DELETE (no
 * load) removes the record of a stub without reading it. */
Test(store_disk, writes_and_deletes_remove_the_record)
{
    make_seq("a", 200);
    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
    dqd_store_unreserve(store, stats().reserved);
    finish_spill(0);
    dqd_seq *a = find("a");
    rec_waiter w = {{NULL, DQD_ACCESS_WRITE, granted, false}, 1};
    norder = 0;
    cr_assert_not(dqd_seq_acquire(a, &w.w));
    finish_load(0);
    cr_assert_eq(norder, 1);
    append_commit(a, 1, 10, 5);
    cr_assert_eq(fk.removes, 1, "the stale record goes with the commit");
    cr_assert_null(a->drec);
    cr_assert_eq(stats().disk_records, 0);
    dqd_seq_release(a, DQD_ACCESS_WRITE);
    dqd_seq_unref(a);

    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
    dqd_store_unreserve(store, stats().reserved);
    cr_assert_eq(fk.spills, 2, "written again");
    finish_spill(0);
    a = find("a");
    rec_waiter del = {{NULL, DQD_ACCESS_WRITE, granted, true}, 2};
    cr_assert(dqd_seq_acquire(a, &del.w), "no load for a waiter that needs no layers");
    cr_assert_eq(fk.loads, 1);
    dqd_store_remove(store, a);
    cr_assert_eq(fk.removes, 2);
    dqd_seq_release(a, DQD_ACCESS_WRITE);
    dqd_seq_unref(a);
    cr_assert_null(find("a"));
    cr_assert_eq(stats().disk_records, 0);
    cr_assert_eq(stats().sequences, 0);
}

/* A record that fails its read (a checksum) is a miss: the waiters are granted a sequence that is
 * gone, it is counted, and its record removed. A failed write drops the sequence, counted. */
Test(store_disk, failures_are_misses)
{
    make_seq("a", 200);
    make_seq("b", 200);
    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
    dqd_store_unreserve(store, stats().reserved);
    finish_spill(0);
    dqd_seq *a = find("a");
    rec_waiter r = {{NULL, DQD_ACCESS_READ, granted, false}, 1};
    norder = 0;
    cr_assert_not(dqd_seq_acquire(a, &r.w));
    finish_load(DQ_CORRUPT);
    cr_assert_eq(norder, 1);
    cr_assert_not(dqd_seq_alive(a), "the request finds it gone");
    cr_assert_eq(stats().disk_corrupt, 1);
    cr_assert_eq(fk.removes, 1);
    dqd_seq_release(a, DQD_ACCESS_READ);
    dqd_seq_unref(a);
    cr_assert_null(find("a"));

    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
    dqd_store_unreserve(store, stats().reserved);
    finish_spill(DQ_IO);
    cr_assert_null(find("b"));
    cr_assert_eq(stats().disk_spill_failures, 1);
    cr_assert_eq(stats().disk_reserved, 0, "the failed write's capacity is given back");

    make_seq("c", 200);
    fk.spill_rc = DQ_RESOURCE_EXHAUSTED; /* no disk room: evicted as before */
    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
    dqd_store_unreserve(store, stats().reserved);
    cr_assert_null(find("c"));
    cr_assert_eq(stats().disk_full_drops, 1);
}

/* The capacity (3 records here): making room removes the least recently used records nothing
 * refers to; a stub in use stays. */
Test(store_disk, capacity_evicts_least_recently_used_records)
{
    const char *keys[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 3; i++) {
        make_seq(keys[i], 150);
        cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
        dqd_store_unreserve(store, stats().reserved);
        finish_spill(0);
    }
    cr_assert_eq(stats().disk_records, 3);
    dqd_seq *a = find("a"); /* held by a request: not a victim */
    dqd_store_touch(store, a);
    make_seq("d", 150);
    cr_assert_eq(dqd_store_reserve(store, available() + 1, NULL), 0);
    dqd_store_unreserve(store, stats().reserved);
    finish_spill(0);
    cr_assert_eq(stats().disk_records, 3);
    cr_assert_eq(stats().disk_evictions, 1);
    cr_assert_null(find("b"), "the least recently used record went");
    dqd_seq *c = find("c");
    cr_assert_not_null(c);
    dqd_seq_unref(c);
    dqd_seq_unref(a);
    cr_assert_eq(dqd_store_disk_reserve(store, 4 * 4096), DQ_RESOURCE_EXHAUSTED, "larger than the capacity");
    cr_assert_eq(dqd_store_disk_reserve(store, 2 * 4096), 0);
    cr_assert_eq(stats().disk_records, 1);
    dqd_store_disk_unreserve(store, 2 * 4096);
}

/* A client's serialized profile: the canonical bytes of a cached codec find that codec without
 * being deserialized again; anything else is deserialized and validated first. */
Test(store, codec_by_bytes)
{
    dqd_codec *c = NULL;
    cr_assert_eq(dqd_registry_codec_bytes(reg, model->codec->pbytes, model->codec->plen, &c), DQ_OK);
    cr_assert_eq(c, model->codec, "the cached codec itself");
    dqd_registry_codec_release(reg, c);
    uint8_t bad[DQ_PROFILE_SERIALIZED_MAX];
    memcpy(bad, model->codec->pbytes, model->codec->plen);
    bad[0] ^= 0xff;
    cr_assert_lt(dqd_registry_codec_bytes(reg, bad, model->codec->plen, &c), 0, "not a profile");
    cr_assert_lt(dqd_registry_codec_bytes(reg, model->codec->pbytes, 3, &c), 0, "truncated");
    cr_assert_lt(dqd_registry_codec_bytes(reg, NULL, 0, &c), 0, "none");
}
