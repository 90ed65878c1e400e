/* dquantd store, GPU tier (no CUDA needed: GPU layers here are shadows with made-up device bytes):
 * accounting of GPU-resident layers, LRU choice of victims to move to the host, pinned and in-use
 * sequences left alone, RESOURCE_EXHAUSTED touching nothing, drops when the host budget cannot take
 * a victim, and how a finished move settles (moved, failed, not run); the GPU settings. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "append.h"
#include "config.h"
#include "dquant/error.h"
#include "hostmem.h"
#include "registry.h"
#include "store.h"

#define KV 2
#define HD 64
#define N (KV * HD)
#define MiB (1ull << 20)

static dqd_hostmem mem;
static dqd_registry *reg;
static dqd_store *store;
static dqd_model *model;
static dq_workspace *ws;
static int freed_layers;

/* The store's hook: what the cuda backend's dqd_gpu_free_seq_layers does, minus the device. */
static void free_layers(void *ctx, dqd_seq *seq)
{
    (void)ctx;
    for (uint32_t i = 0; i < seq->model->layers; i++) {
        if (seq->glayers[i]) {
            dqd_hostmem_free(&mem, seq->glayers[i]);
            seq->glayers[i] = NULL;
            freed_layers++;
        }
    }
}

static void open_store(uint64_t host_budget, uint64_t gpu_budget)
{
    dqd_hostmem_init(&mem);
    cr_assert_eq(dqd_registry_create(&mem, 16, &reg), 0);
    dqd_model_spec spec = {
        .name = "tiny", .layers = 2, .q_heads = 4, .kv_heads = KV, .head_dim = HD, .profile_name = "dq226"};
    bool existed;
    char msg[256];
    cr_assert_eq(dqd_registry_register(reg, &spec, &model, &existed, msg, sizeof msg), 0, "%s", msg);
    ws = dqd_codec_ws_take(model->codec);
    cr_assert_eq(dqd_store_create(&mem, host_budget, &store), 0);
    dqd_store_gpu_enable(store, gpu_budget, free_layers, NULL);
    cr_assert(dqd_store_gpu_enabled(store));
    freed_layers = 0;
}

static void setup(void)
{
    open_store(64 * MiB, 10 * MiB);
}

static void teardown(void)
{
    dqd_store_destroy(store);
    dqd_codec_ws_give(model->codec, ws);
    dqd_registry_destroy(reg);
    cr_assert_eq(dqd_hostmem_used(&mem), 0, "every counted byte is given back");
}

TestSuite(gpu_tier, .init = setup, .fini = teardown);

/* A committed sequence whose layer 0 is on the GPU: 2 windows + 3 tokens, dev_bytes device bytes. */
static dqd_seq *make_gseq(const char *key, uint64_t dev_bytes)
{
    dqd_seq *seq;
    cr_assert_eq(dqd_store_insert(store, "ns", 2, (const uint8_t *)key, strlen(key), model, &seq), 0);
    cr_assert_eq(dqd_store_gpu_slots(store, seq), 0);
    dqd_glayer *g = dqd_hostmem_calloc(&mem, sizeof *g);
    g->W = g->R = 128;
    g->nwin = 2;
    g->tail = 3;
    g->dev_bytes = dev_bytes;
    seq->glayers[0] = g;
    dqd_store_commit(store, seq);
    dqd_seq_unref(seq);
    return seq;
}

static dqd_seq *find(const char *key)
{
    dqd_seq *s = dqd_store_lookup(store, "ns", 2, (const uint8_t *)key, strlen(key));
    dqd_seq_unref(s);
    return s;
}

static dqd_store_stats stats(void)
{
    dqd_store_stats st;
    dqd_store_get_stats(store, &st);
    return st;
}

/* What the mover does to a victim: its GPU layers become host layers of the same length. */
static void move_to_host(dqd_seq *seq)
{
    for (uint32_t i = 0; i < seq->model->layers; i++) {
        dqd_glayer *g = seq->glayers[i];
        if (!g)
            continue;
        size_t ntok = (size_t)dqd_glayer_tokens(g);
        float *k = calloc(ntok * N, sizeof *k), *v = calloc(ntok * N, sizeof *v);
        for (size_t j = 0; j < ntok * N; j++)
            k[j] = v[j] = (float)(j % 7) - 3.0f;
        dqd_append a;
        cr_assert_eq(
            dqd_append_apply(&a, model->codec, (uint32_t)i, ws, &seq->layers[i], k, v, DQ_DTYPE_F32, ntok, NULL), 0);
        dqd_append_clear(&a);
        free(k);
        free(v);
        dqd_hostmem_free(&mem, g);
        seq->glayers[i] = NULL;
    }
}

Test(gpu_tier, accounting)
{
    dqd_seq *a = make_gseq("a", 3 * MiB);
    dqd_seq *b = make_gseq("b", 2 * MiB);
    dqd_store_stats st = stats();
    cr_assert_eq(st.gpu_used, 5 * MiB);
    cr_assert_eq(st.gpu_budget, 10 * MiB);
    cr_assert_eq(st.gpu_sequences, 2);
    cr_assert_eq(st.token_layers, 2 * (2 * 128 + 3), "GPU layers' tokens count");
    size_t wb = model->codec->window_bytes;
    cr_assert_eq(st.stored_bytes, 2 * (2 * wb + 3 * N * 4), "window records + tails in use");
    cr_assert_eq(dqd_seq_layer_tokens(a, 0), 2 * 128 + 3);
    cr_assert_eq(dqd_seq_layer_windows(a, 0), 2);
    cr_assert_eq(dqd_seq_layer_tail(a, 0), 3);
    cr_assert_eq(dqd_seq_layer_tokens(a, 1), 0);
    cr_assert_gt(a->bytes, a->overhead, "the shadow counts as host bytes");

    dqd_store_remove(store, b);
    st = stats();
    cr_assert_eq(st.gpu_used, 3 * MiB, "freed with the sequence");
    cr_assert_eq(st.gpu_sequences, 1);
    cr_assert_eq(freed_layers, 1);
}

Test(gpu_tier, reserve_moves_least_recently_used_to_host)
{
    dqd_seq *a = make_gseq("a", 3 * MiB);
    make_gseq("b", 3 * MiB);
    make_gseq("c", 3 * MiB);
    dqd_store_touch(store, a); /* b is now the least recently used */
    dqd_gpu_moves mv = {0};
    cr_assert_eq(dqd_store_gpu_reserve(store, 1 * MiB, &mv), 0);
    cr_assert_eq(mv.n, 0, "1 MiB is free");
    cr_assert_eq(dqd_store_gpu_reserve(store, 3 * MiB, &mv), 0);
    cr_assert_eq(mv.n, 1);
    dqd_seq *b = find("b");
    cr_assert_eq(mv.seqs[0], b);
    cr_assert(b->moving && b->writer && b->refs == 1, "held exclusively for the mover");
    cr_assert_gt(b->move_reserved, 0);
    dqd_store_stats st = stats();
    cr_assert_eq(st.reserved, b->move_reserved, "its host room is reserved");
    cr_assert_eq(st.gpu_reserved, 4 * MiB);

    /* a second reservation cannot pick the sequence already moving */
    dqd_gpu_moves mv2 = {0};
    cr_assert_eq(dqd_store_gpu_reserve(store, 3 * MiB, &mv2), 0);
    cr_assert_eq(mv2.n, 1);
    cr_assert_eq(mv2.seqs[0], find("c"));

    move_to_host(b);
    mv.rc[0] = 0;
    dqd_store_gpu_moves_finish(store, &mv);
    cr_assert_eq(mv.n, 0);
    cr_assert_not(b->moving);
    cr_assert_eq(b->refs, 0);
    cr_assert_not(b->writer);
    st = stats();
    cr_assert_eq(st.gpu_demotions, 1);
    cr_assert_eq(st.evictions, 0, "moved, not evicted");
    cr_assert_eq(st.gpu_used, 6 * MiB);
    cr_assert_eq(st.gpu_sequences, 2);
    cr_assert_eq(dqd_seq_layer_tokens(b, 0), 2 * 128 + 3, "same tokens on the host");
    cr_assert(dqd_seq_alive(b));
    cr_assert_eq(st.reserved, mv2.seqs[0]->move_reserved, "b's host reservation is released");

    mv2.rc[0] = 1; /* the mover never ran: released as it was */
    dqd_seq *c = mv2.seqs[0];
    dqd_store_gpu_moves_finish(store, &mv2);
    cr_assert_eq(c->gpu_bytes, 3 * MiB);
    cr_assert_not(c->moving);
    cr_assert_eq(stats().reserved, 0);
    dqd_store_gpu_unreserve(store, 7 * MiB);
    cr_assert_eq(stats().gpu_reserved, 0);
}

Test(gpu_tier, pinned_and_in_use_sequences_stay)
{
    dqd_seq *a = make_gseq("a", 3 * MiB);
    make_gseq("b", 3 * MiB);
    make_gseq("c", 3 * MiB);
    dqd_store_set_pinned(store, a, true);
    dqd_seq *b = dqd_store_lookup(store, "ns", 2, (const uint8_t *)"b", 1); /* a request holds it */
    dqd_gpu_moves mv = {0};
    cr_assert_eq(dqd_store_gpu_reserve(store, 7 * MiB, &mv), DQ_RESOURCE_EXHAUSTED, "only c could go");
    cr_assert_eq(mv.n, 0, "nothing touched");
    cr_assert_eq(stats().gpu_reserved, 0);
    cr_assert_eq(dqd_store_gpu_reserve(store, 4 * MiB, &mv), 0);
    cr_assert_eq(mv.n, 1);
    cr_assert_eq(mv.seqs[0], find("c"));
    dqd_store_gpu_moves_finish(store, &mv);
    dqd_seq_unref(b);
    dqd_store_gpu_unreserve(store, 4 * MiB);
}

Test(gpu_tier, host_eviction_leaves_gpu_sequences_to_the_gpu_tier)
{
    make_gseq("g", 3 * MiB);
    dqd_store_stats st = stats();
    uint64_t avail = st.budget - st.used - st.reserved;
    cr_assert_eq(dqd_store_reserve(store, avail + 1, NULL), DQ_RESOURCE_EXHAUSTED,
                 "the GPU sequence's few host bytes are not evictable");
    cr_assert_not_null(find("g"));
}

Test(gpu_tier, failed_move_drops_the_sequence)
{
    make_gseq("a", 6 * MiB);
    make_gseq("b", 3 * MiB);
    dqd_gpu_moves mv = {0};
    cr_assert_eq(dqd_store_gpu_reserve(store, 5 * MiB, &mv), 0);
    cr_assert_eq(mv.n, 1);
    mv.rc[0] = DQ_INTERNAL;
    dqd_store_gpu_moves_finish(store, &mv);
    cr_assert_null(find("a"));
    dqd_store_stats st = stats();
    cr_assert_eq(st.evictions, 1);
    cr_assert_eq(st.gpu_drops, 1);
    cr_assert_eq(st.gpu_used, 3 * MiB);
    cr_assert_eq(freed_layers, 1, "its GPU layers went with it");
    dqd_store_gpu_unreserve(store, 5 * MiB);
}

Test(gpu_tier, victims_without_host_room_are_dropped)
{
    /* a host budget that holds the model's codec and little else */
    dqd_store_destroy(store);
    store = NULL;
    cr_assert_eq(dqd_store_create(&mem, dqd_hostmem_used(&mem) + 64 * 1024, &store), 0);
    dqd_store_gpu_enable(store, 10 * MiB, free_layers, NULL);
    make_gseq("a", 4 * MiB);
    make_gseq("b", 4 * MiB);
    dqd_gpu_moves mv = {0};
    cr_assert_eq(dqd_store_gpu_reserve(store, 6 * MiB, &mv), 0);
    cr_assert_eq(mv.n, 0, "no host room: nothing to move");
    cr_assert_null(find("a"), "dropped at once");
    cr_assert_not_null(find("b"));
    dqd_store_stats st = stats();
    cr_assert_eq(st.gpu_drops, 1);
    cr_assert_eq(st.evictions, 1);
    cr_assert_eq(st.gpu_used, 4 * MiB);
    dqd_store_gpu_moves_finish(store, &mv);
    dqd_store_gpu_unreserve(store, 6 * MiB);
}

/* The GPU settings: INI keys, flags, bounds. */
Test(gpu_config, ini_and_flags)
{
    dqd_config cfg;
    char err[256];
    dqd_config_default(&cfg);
    cr_assert_eq(cfg.gpu_memory, 0, "0: 80%% of the free GPU memory");
    cr_assert_eq(cfg.gpu_device, 0);
    cr_assert_eq(dqd_config_load_string(&cfg, "[server]\nbackend = cuda\ngpu_device = 1\n[store]\ngpu_memory = 24G\n",
                                        err, sizeof err),
                 0, "%s", err);
    cr_assert_eq(cfg.backend, DQD_BACKEND_CUDA);
    cr_assert_eq(cfg.gpu_device, 1);
    cr_assert_eq(cfg.gpu_memory, 24ull << 30);
    cr_assert_eq(dqd_config_set(&cfg, NULL, "gpu_memory", "512K", true, err, sizeof err), DQ_INVALID_ARGUMENT,
                 "at least 1M");
    cr_assert(strstr(err, "out of range"), "%s", err);
    dqd_config_free(&cfg);

    char *argv[] = {"dquantd", "--gpu-memory", "3G", "--gpu-device", "2", NULL};
    dqd_cli_action action;
    cr_assert_eq(dqd_config_from_args(&cfg, 5, argv, &action, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cfg.gpu_memory, 3ull << 30);
    cr_assert_eq(cfg.gpu_device, 2);
    dqd_config_free(&cfg);
}
