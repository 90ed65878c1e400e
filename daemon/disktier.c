/* dquantd disk tier (see disktier.h). */
#include "disktier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "ctx.h"
#include "diskrec.h"
#include "dquant/error.h"
#include "logging.h"
#include "tier.h"
#include "work.h"

#define NAME_LEN 36 /* 32 hex digits + ".dqr" */
#define BLOCK 4096u /* disk bytes are counted in whole blocks */
#define IOV_BATCH 256

struct dqd_drec {
    uint64_t stamp;
    uint32_t nlayers;
    char name[NAME_LEN + 1];
    dqd_rec_layer layers[];
};

struct dqd_disktier {
    dqd_ctx *ctx;
    dqd_store *store;
    dqd_hostmem *mem;
    char *dir;
    int dirfd;
    bool sync;
    uint64_t next_stamp;
};

static uint64_t blocks(uint64_t bytes)
{
    return (bytes + BLOCK - 1) / BLOCK * BLOCK;
}

/* XXH3-128 of (kind, ns length, ns, key) in hex: the record's file name. DQ_NOMEM. */
static int record_name(uint8_t kind, const void *ns, size_t ns_len, const void *key, size_t key_len,
                       char out[NAME_LEN + 1])
{
    uint8_t *buf = malloc(5 + ns_len + key_len);
    if (!buf)
        return DQ_NOMEM;
    buf[0] = kind;
    for (int i = 0; i < 4; i++)
        buf[1 + i] = (uint8_t)(ns_len >> (8 * i));
    memcpy(buf + 5, ns, ns_len);
    memcpy(buf + 5 + ns_len, key, key_len);
    XXH128_hash_t h = XXH3_128bits(buf, 5 + ns_len + key_len);
    free(buf);
    snprintf(out, NAME_LEN + 1, "%016" PRIx64 "%016" PRIx64 ".dqr", (uint64_t)h.high64, (uint64_t)h.low64);
    return DQ_OK;
}

static dqd_drec *drec_alloc(dqd_disktier *d, uint32_t nlayers, uint64_t *cost)
{
    size_t size = sizeof(dqd_drec) + (size_t)nlayers * sizeof(dqd_rec_layer);
    *cost = dqd_hostmem_cost(size);
    return dqd_hostmem_calloc(d->mem, size);
}

static void sync_dir(const dqd_disktier *d)
{
    if (d->sync && fsync(d->dirfd) < 0)
        DQD_WARN("fsync of %s: %s", d->dir, strerror(errno));
}

/* ---- writing ---- */

typedef struct spill_job {
    dqd_disktier *d;
    dqd_seq *seq;
    dqd_drec *drec;
    uint64_t drec_cost, bytes; /* bytes: disk capacity reserved */
    dqd_rec_meta meta;
    uint8_t *prefix; /* the chunk keys it is built on, as the meta lists them */
    char tmp[NAME_LEN + 32];
    int fd;
    int *lrc; /* per layer */
    int rc;
} spill_job;

static void job_free(spill_job *job)
{
    if (job->drec)
        dqd_hostmem_free(job->d->mem, job->drec);
    free(job->prefix);
    free(job->lrc);
    free(job);
}

/* Lays out seq's record (the caller holds seq exclusively, or the loop has stopped). */
static int job_prepare(dqd_disktier *d, dqd_seq *seq, spill_job **out)
{
    const dqd_model *model = seq->model;
    const dqd_codec *codec = model->codec;
    spill_job *job = calloc(1, sizeof *job);
    if (!job)
        return DQ_NOMEM;
    job->d = d;
    job->seq = seq;
    job->fd = -1;
    size_t pbytes = 0;
    for (uint32_t i = 0; i < seq->nprefix; i++)
        pbytes += dqd_rec_prefix_entry(seq->prefix[i]->key_len);
    job->prefix = malloc(pbytes ? pbytes : 1);
    job->lrc = calloc(model->layers, sizeof *job->lrc);
    job->drec = drec_alloc(d, model->layers, &job->drec_cost);
    if (!job->prefix || !job->lrc || !job->drec) {
        job_free(job);
        return DQ_NOMEM;
    }
    uint8_t *p = job->prefix;
    for (uint32_t i = 0; i < seq->nprefix; i++) {
        const dqd_seq *c = seq->prefix[i];
        p[0] = (uint8_t)c->key_len;
        p[1] = (uint8_t)(c->key_len >> 8);
        memcpy(p + 2, c->key, c->key_len);
        p += dqd_rec_prefix_entry(c->key_len);
    }
    dqd_drec *drec = job->drec;
    drec->nlayers = model->layers;
    drec->stamp = d->next_stamp++;
    if (record_name(seq->kind, seq->ns, seq->ns_len, seq->key, seq->key_len, drec->name) < 0) {
        job_free(job);
        return DQ_NOMEM;
    }
    snprintf(job->tmp, sizeof job->tmp, "%.32s.%" PRIu64 ".tmp", drec->name, drec->stamp);
    for (uint32_t i = 0; i < model->layers; i++) {
        dqd_rec_layer *rl = &drec->layers[i];
        rl->present = seq->layers[i] || dqd_seq_glayer(seq, i);
        rl->nwin = dqd_seq_layer_windows(seq, i);
        rl->tail = (uint32_t)dqd_seq_layer_tail(seq, i);
    }
    dqd_rec_meta *m = &job->meta;
    m->kind = seq->kind;
    m->stamp = drec->stamp;
    m->ns = (const uint8_t *)seq->ns;
    m->ns_len = seq->ns_len;
    m->key = seq->key;
    m->key_len = seq->key_len;
    snprintf(m->model.name, sizeof m->model.name, "%s", model->name);
    snprintf(m->model.builtin, sizeof m->model.builtin, "%s", model->builtin);
    m->model.layers = model->layers;
    m->model.q_heads = model->q_heads;
    m->model.kv_heads = model->kv_heads;
    m->model.head_dim = model->head_dim;
    m->model.chunk_tokens = model->chunk_tokens;
    memcpy(m->model.profile, codec->pbytes, codec->plen);
    m->model.profile_len = codec->plen;
    m->window_bytes = (uint32_t)codec->window_bytes;
    m->n = codec->n;
    m->nprefix = seq->nprefix;
    m->prefix = job->prefix;
    m->prefix_bytes = pbytes;
    m->nlayers = model->layers;
    m->layers = drec->layers;
    dqd_rec_layout(m);
    job->bytes = blocks(m->meta_len + m->body_len);
    *out = job;
    return DQ_OK;
}

static int job_open(spill_job *job)
{
    job->fd = openat(job->d->dirfd, job->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (job->fd < 0) {
        DQD_WARN("cannot create %s/%s: %s", job->d->dir, job->tmp, strerror(errno));
        return DQ_IO;
    }
    return DQ_OK;
}

/* Writes all of iov[0..n) at off, retrying short writes. 0 or an errno. */
static int pwritev_full(int fd, struct iovec *iov, int n, uint64_t off)
{
    while (n > 0) {
        ssize_t w = pwritev(fd, iov, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (w == 0)
            return EIO;
        off += (uint64_t)w;
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

typedef struct layer_writer {
    int fd;
    uint64_t off;
    struct iovec iov[IOV_BATCH];
    int n;
    int err;
    XXH3_state_t *st;
} layer_writer;

static void lw_flush(layer_writer *w)
{
    if (w->n == 0 || w->err)
        return;
    uint64_t len = 0;
    for (int i = 0; i < w->n; i++)
        len += w->iov[i].iov_len;
    w->err = pwritev_full(w->fd, w->iov, w->n, w->off);
    w->off += len;
    w->n = 0;
}

static void lw_add(layer_writer *w, const void *p, size_t len)
{
    if (!len)
        return;
    XXH3_64bits_update(w->st, p, len);
    w->iov[w->n].iov_base = (void *)p;
    w->iov[w->n].iov_len = len;
    if (++w->n == IOV_BATCH)
        lw_flush(w);
}

/* One layer's bytes, straight from its window records and tail (worker thread), or for a layer in
 * GPU memory (at shutdown) copied to the host first. */
static int write_layer(spill_job *job, size_t i)
{
    dqd_rec_layer *rl = &job->drec->layers[i];
    if (!rl->present)
        return DQ_OK;
    const dq_layer *l = job->seq->layers[i];
    const size_t wb = job->meta.window_bytes, tail = (size_t)rl->tail * job->meta.n * sizeof(uint16_t);
    uint8_t *copy = NULL;
    if (!l) {
        copy = malloc(rl->bytes ? rl->bytes : 1);
        int rc = copy ? dqd_tier_copy_raw(job->d->ctx, job->seq, (uint32_t)i, copy) : DQ_NOMEM;
        if (rc < 0) {
            free(copy);
            return rc;
        }
    }
    layer_writer *w = malloc(sizeof *w);
    XXH3_state_t *st = XXH3_createState();
    if (!w || !st) {
        free(w);
        XXH3_freeState(st);
        free(copy);
        return DQ_NOMEM;
    }
    w->fd = job->fd;
    w->off = rl->offset;
    w->n = 0;
    w->err = 0;
    w->st = st;
    XXH3_64bits_reset(st);
    if (copy) {
        lw_add(w, copy, rl->bytes);
    } else {
        for (size_t k = 0; k < rl->nwin; k++)
            lw_add(w, dq_layer_window(l, k), wb);
        lw_add(w, dq_layer_tail(l, DQ_KIND_K), tail);
        lw_add(w, dq_layer_tail(l, DQ_KIND_V), tail);
    }
    lw_flush(w);
    free(copy);
    rl->hash = XXH3_64bits_digest(st);
    int err = w->err;
    free(w);
    XXH3_freeState(st);
    if (err) {
        DQD_WARN("writing %s/%s: %s", job->d->dir, job->tmp, strerror(err));
        return DQ_IO;
    }
    return DQ_OK;
}

static int pread_full(int fd, void *buf, size_t len, uint64_t off);

/* A model's KVQ calibration (dquant/kvq.h) beside its records: "kvqcal-HASH.dqkc", HASH the
 * profile's kvq_calib_hash in 16 hex digits, so that a restart registers the model of a record again
 * with it. Written once (tmp + rename, like a record) before the first record of the model is
 * published; never removed (one per calibration, not counted in the capacity). */
static void calib_name(uint64_t hash, char out[40])
{
    snprintf(out, 40, "kvqcal-%016" PRIx64 ".dqkc", hash);
}

static int calib_persist(const dqd_disktier *d, const dqd_codec *codec, uint64_t stamp)
{
    char name[40], tmp[64];
    calib_name(codec->profile.kvq_calib_hash, name);
    if (faccessat(d->dirfd, name, F_OK, 0) == 0)
        return DQ_OK;
    snprintf(tmp, sizeof tmp, "%s.%" PRIu64 ".tmp", name, stamp);
    int fd = openat(d->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        DQD_WARN("cannot create %s/%s: %s", d->dir, tmp, strerror(errno));
        return DQ_IO;
    }
    struct iovec iov = {codec->calib, codec->calib_len};
    int err = pwritev_full(fd, &iov, 1, 0);
    if (!err && d->sync && fdatasync(fd) < 0)
        err = errno;
    if (close(fd) < 0 && !err)
        err = errno;
    if (!err && renameat(d->dirfd, tmp, d->dirfd, name) < 0)
        err = errno;
    if (err) {
        DQD_WARN("writing the calibration %s/%s: %s", d->dir, name, strerror(err));
        unlinkat(d->dirfd, tmp, 0);
        return DQ_IO;
    }
    sync_dir(d);
    return DQ_OK;
}

/* The calibration of a record's profile read back (malloc'd); DQ_NOT_FOUND, DQ_IO, DQ_TOO_LARGE. */
static int calib_load(const dqd_disktier *d, uint64_t hash, uint8_t **out, size_t *len)
{
    char name[40];
    calib_name(hash, name);
    *out = NULL;
    int fd = openat(d->dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? DQ_NOT_FOUND : DQ_IO;
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? DQ_IO : DQ_OK;
    if (rc == DQ_OK && ((uint64_t)st.st_size > d->ctx->cfg->max_calibration || st.st_size <= 0))
        rc = DQ_TOO_LARGE;
    uint8_t *buf = rc == DQ_OK ? malloc((size_t)st.st_size) : NULL;
    if (rc == DQ_OK && !buf)
        rc = DQ_NOMEM;
    if (rc == DQ_OK)
        rc = pread_full(fd, buf, (size_t)st.st_size, 0);
    close(fd);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = (size_t)st.st_size;
    return DQ_OK;
}

/* The meta (with every layer's hash) last, then the rename that publishes the record. */
static int write_finish(spill_job *job)
{
    const dqd_disktier *d = job->d;
    int rc = DQ_OK;
    const dqd_codec *codec = job->seq->model->codec;
    if (codec->calib)
        rc = calib_persist(d, codec, job->drec->stamp);
    uint8_t *buf = rc == DQ_OK ? malloc(job->meta.meta_len) : NULL;
    if (rc == DQ_OK && !buf)
        rc = DQ_NOMEM;
    if (rc == DQ_OK)
        rc = dqd_rec_meta_write(&job->meta, buf, job->meta.meta_len);
    if (rc == DQ_OK) {
        struct iovec iov = {buf, job->meta.meta_len};
        int err = pwritev_full(job->fd, &iov, 1, 0);
        if (!err && d->sync && fdatasync(job->fd) < 0)
            err = errno;
        if (err) {
            DQD_WARN("writing %s/%s: %s", d->dir, job->tmp, strerror(err));
            rc = DQ_IO;
        }
    }
    free(buf);
    if (close(job->fd) < 0 && rc == DQ_OK) {
        DQD_WARN("closing %s/%s: %s", d->dir, job->tmp, strerror(errno));
        rc = DQ_IO;
    }
    job->fd = -1;
    if (rc == DQ_OK && renameat(d->dirfd, job->tmp, d->dirfd, job->drec->name) < 0) {
        DQD_WARN("renaming %s/%s: %s", d->dir, job->tmp, strerror(errno));
        rc = DQ_IO;
    }
    if (rc < 0)
        unlinkat(d->dirfd, job->tmp, 0);
    else
        sync_dir(d);
    return rc;
}

static void spill_layer_task(void *arg, size_t i)
{
    spill_job *job = arg;
    job->lrc[i] = write_layer(job, i);
}

static void spill_finish_task(void *arg, size_t i)
{
    (void)i;
    spill_job *job = arg;
    job->rc = write_finish(job);
}

static void spill_finished(void *arg)
{
    spill_job *job = arg;
    dqd_drec *drec = job->rc == DQ_OK ? job->drec : NULL;
    if (drec)
        job->drec = NULL; /* the store takes it */
    dqd_store_spill_done(job->d->store, job->seq, job->rc, drec, job->drec_cost, job->bytes);
    job_free(job);
}

static void spill_layers_done(void *arg)
{
    spill_job *job = arg;
    for (uint32_t i = 0; i < job->drec->nlayers && job->rc == DQ_OK; i++)
        job->rc = job->lrc[i];
    if (job->rc == DQ_OK && dqd_tasks_run(job->d->ctx, 1, spill_finish_task, spill_finished, job) == DQ_OK)
        return;
    if (job->rc == DQ_OK)
        job->rc = DQ_NOMEM;
    close(job->fd);
    job->fd = -1;
    unlinkat(job->d->dirfd, job->tmp, 0);
    spill_finished(job);
}

static int op_spill(void *arg, dqd_seq *seq)
{
    dqd_disktier *d = arg;
    spill_job *job;
    int rc = job_prepare(d, seq, &job);
    if (rc < 0)
        return rc;
    rc = dqd_store_disk_reserve(d->store, job->bytes);
    if (rc < 0) {
        job_free(job);
        return rc;
    }
    rc = job_open(job);
    if (rc == DQ_OK) {
        rc = dqd_tasks_run(d->ctx, seq->model->layers, spill_layer_task, spill_layers_done, job);
        if (rc == DQ_OK)
            return DQ_OK;
        close(job->fd);
        unlinkat(d->dirfd, job->tmp, 0);
    }
    dqd_store_disk_unreserve(d->store, job->bytes);
    job_free(job);
    return rc;
}

/* ---- reading ---- */

typedef struct load_job {
    dqd_disktier *d;
    dqd_seq *seq;
    int fd;
    uint64_t need; /* host bytes reserved */
    dq_layer **layers;
    int *lrc;
} load_job;

/* Reads len bytes at off; DQ_CORRUPT when the file ends first (a truncated record), DQ_IO. */
static int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return DQ_IO;
        }
        if (r == 0)
            return DQ_CORRUPT;
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return DQ_OK;
}

/* Model layer `layer` back: its bytes read and checked against the record's hash, then restored
 * with that layer's codec view (a per-layer calibrated codec has one per layer). */
static int read_layer(const dqd_disktier *d, int fd, const dqd_codec *codec, uint32_t layer, const dqd_rec_layer *rl,
                      dq_layer **out)
{
    *out = NULL;
    if (!rl->present)
        return DQ_OK;
    const size_t wbytes = rl->nwin * codec->window_bytes, tbytes = (size_t)rl->tail * codec->n * sizeof(uint16_t);
    uint8_t *win = malloc(wbytes ? wbytes : 1);
    uint16_t *tk = malloc(tbytes ? tbytes : 2), *tv = malloc(tbytes ? tbytes : 2);
    int rc = win && tk && tv ? DQ_OK : DQ_NOMEM;
    if (rc == DQ_OK)
        rc = pread_full(fd, win, wbytes, rl->offset);
    if (rc == DQ_OK)
        rc = pread_full(fd, tk, tbytes, rl->offset + wbytes);
    if (rc == DQ_OK)
        rc = pread_full(fd, tv, tbytes, rl->offset + wbytes + tbytes);
    if (rc == DQ_OK) {
        XXH3_state_t *st = XXH3_createState();
        if (!st) {
            rc = DQ_NOMEM;
        } else {
            XXH3_64bits_reset(st);
            XXH3_64bits_update(st, win, wbytes);
            XXH3_64bits_update(st, tk, tbytes);
            XXH3_64bits_update(st, tv, tbytes);
            if (XXH3_64bits_digest(st) != rl->hash)
                rc = DQ_CORRUPT;
            XXH3_freeState(st);
        }
    }
    const dq_codec *view = dqd_codec_view(codec, layer);
    if (rc == DQ_OK && !view)
        rc = DQ_CORRUPT; /* a record of more layers than the model's calibration */
    if (rc == DQ_OK)
        rc = dq_layer_restore_unchecked(view, win, rl->nwin, tk, tv, rl->tail, out); /* checksummed */
    if (rc == DQ_IO)
        DQD_WARN("reading a record in %s: %s", d->dir, strerror(errno));
    free(win);
    free(tk);
    free(tv);
    return rc;
}

static void load_layer_task(void *arg, size_t i)
{
    load_job *job = arg;
    const dqd_seq *seq = job->seq;
    job->lrc[i] = read_layer(job->d, job->fd, seq->model->codec, (uint32_t)i, &seq->drec->layers[i], &job->layers[i]);
}

static void load_done(void *arg)
{
    load_job *job = arg;
    int rc = DQ_OK;
    for (uint32_t i = 0; i < job->seq->model->layers; i++)
        if (job->lrc[i] < 0 && (rc == DQ_OK || job->lrc[i] == DQ_CORRUPT))
            rc = job->lrc[i];
    close(job->fd);
    dqd_store_unreserve(job->d->store, job->need);
    dqd_store_load_done(job->d->store, job->seq, rc, job->layers);
    free(job->layers);
    free(job->lrc);
    free(job);
}

static int op_load(void *arg, dqd_seq *seq)
{
    dqd_disktier *d = arg;
    const dqd_drec *drec = seq->drec;
    const dqd_codec *codec = seq->model->codec;
    uint64_t need = 0;
    for (uint32_t i = 0; i < drec->nlayers; i++)
        if (drec->layers[i].present)
            need += dqd_store_restore_need(codec, drec->layers[i].nwin);
    int rc = dqd_store_reserve(d->store, need, seq);
    if (rc < 0)
        return rc;
    load_job *job = calloc(1, sizeof *job);
    if (job) {
        job->layers = calloc(drec->nlayers, sizeof *job->layers);
        job->lrc = calloc(drec->nlayers, sizeof *job->lrc);
    }
    if (!job || !job->layers || !job->lrc) {
        rc = DQ_NOMEM;
    } else {
        job->d = d;
        job->seq = seq;
        job->need = need;
        job->fd = openat(d->dirfd, drec->name, O_RDONLY | O_CLOEXEC);
        if (job->fd < 0) {
            DQD_WARN("cannot open %s/%s: %s", d->dir, drec->name, strerror(errno));
            rc = DQ_IO;
        } else {
            rc = dqd_tasks_run(d->ctx, drec->nlayers, load_layer_task, load_done, job);
            if (rc == DQ_OK)
                return DQ_OK;
            close(job->fd);
        }
    }
    if (job) {
        free(job->layers);
        free(job->lrc);
        free(job);
    }
    dqd_store_unreserve(d->store, need);
    return rc;
}

static void op_forget(void *arg, dqd_seq *seq, bool remove)
{
    dqd_disktier *d = arg;
    dqd_drec *drec = seq->drec;
    if (remove) {
        if (unlinkat(d->dirfd, drec->name, 0) < 0 && errno != ENOENT)
            DQD_ERROR("cannot remove %s/%s: %s (a restart may bring the stale record back)", d->dir, drec->name,
                      strerror(errno));
        else
            sync_dir(d);
    }
    dqd_hostmem_free(d->mem, drec);
    seq->drec = NULL;
}

/* ---- start-up ---- */

typedef struct found {
    char name[NAME_LEN + 1];
    uint8_t *meta_buf; /* the meta as read (its prefix keys are needed after the stubs are in) */
    dqd_rec_meta meta;
    dqd_rec_layer *layers;
    uint64_t file_bytes;
    dqd_seq *seq; /* referenced, for the prefix pass */
} found;

static void found_free(found *f)
{
    free(f->meta_buf);
    free(f->layers);
    f->meta_buf = NULL;
    f->layers = NULL;
}

/* Reads and checks a record's meta. DQ_CORRUPT for anything wrong with it, DQ_IO, DQ_NOMEM. */
static int read_meta(const dqd_disktier *d, found *f)
{
    int fd = openat(d->dirfd, f->name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return DQ_IO;
    struct stat st;
    uint8_t head[DQD_REC_FIXED];
    uint64_t meta_len = 0;
    uint32_t nlayers = 0;
    int rc = fstat(fd, &st) < 0 ? DQ_IO : pread_full(fd, head, sizeof head, 0);
    if (rc == DQ_OK)
        rc = dqd_rec_meta_len(head, sizeof head, &meta_len, &nlayers);
    if (rc == DQ_OK && (uint64_t)st.st_size < meta_len)
        rc = DQ_CORRUPT;
    if (rc == DQ_OK) {
        f->meta_buf = malloc(meta_len);
        f->layers = calloc(nlayers, sizeof *f->layers);
        rc = f->meta_buf && f->layers ? pread_full(fd, f->meta_buf, meta_len, 0) : DQ_NOMEM;
    }
    close(fd);
    if (rc == DQ_OK)
        rc = dqd_rec_meta_read(f->meta_buf, meta_len, &f->meta, f->layers, nlayers);
    if (rc == DQ_OK && f->meta.meta_len + f->meta.body_len != (uint64_t)st.st_size)
        rc = DQ_CORRUPT; /* truncated or extended */
    if (rc == DQ_OK) {
        char want[NAME_LEN + 1];
        rc = record_name(f->meta.kind, f->meta.ns, f->meta.ns_len, f->meta.key, f->meta.key_len, want);
        if (rc == DQ_OK && strcmp(want, f->name) != 0)
            rc = DQ_CORRUPT; /* not where this entry's record lives */
    }
    f->file_bytes = blocks((uint64_t)st.st_size);
    if (rc == DQ_VERSION || rc == DQ_SHAPE)
        rc = DQ_CORRUPT;
    return rc;
}

static int by_stamp(const void *a, const void *b)
{
    uint64_t x = ((const found *)a)->meta.stamp, y = ((const found *)b)->meta.stamp;
    return x < y ? -1 : x > y;
}

/* The record's model, registered from its spec (or found registered the same); NULL if that fails. */
static dqd_model *record_model(dqd_disktier *d, const dqd_rec_meta *m)
{
    const dqd_rec_model *rm = &m->model;
    dqd_model_spec spec = {
        .name = rm->name,
        .layers = rm->layers,
        .q_heads = rm->q_heads,
        .kv_heads = rm->kv_heads,
        .head_dim = rm->head_dim,
        .chunk_tokens = rm->chunk_tokens,
    };
    uint8_t *calib = NULL;
    dq_profile p;
    if (rm->builtin[0]) {
        spec.profile_name = rm->builtin;
    } else {
        spec.profile = rm->profile;
        spec.profile_len = rm->profile_len;
        if (dq_profile_deserialize(rm->profile, rm->profile_len, &p) == DQ_OK && p.codec_type == DQ_CODEC_KVQ &&
            p.kvq_calib_hash) {
            int crc = calib_load(d, p.kvq_calib_hash, &calib, &spec.calibration_len);
            if (crc < 0) {
                DQD_WARN("disk tier: the calibration of model '%s' (kvqcal-%016" PRIx64 ".dqkc): %s", rm->name,
                         p.kvq_calib_hash, dq_strerror(crc));
                return NULL;
            }
            spec.calibration = calib;
        }
    }
    dqd_model *model;
    bool existed;
    char msg[256];
    int rc = dqd_registry_register(d->ctx->reg, &spec, &model, &existed, msg, sizeof msg);
    free(calib);
    if (rc < 0) {
        DQD_WARN("disk tier: cannot register model '%s' of a record: %s", rm->name, msg);
        return NULL;
    }
    const dqd_codec *c = model->codec;
    if (c->plen != rm->profile_len || memcmp(c->pbytes, rm->profile, c->plen) != 0 ||
        c->window_bytes != m->window_bytes || c->n != m->n) {
        DQD_WARN("disk tier: model '%s' has another profile than its records", rm->name);
        return NULL;
    }
    return model;
}

static void remove_file(const dqd_disktier *d, const char *name)
{
    if (unlinkat(d->dirfd, name, 0) < 0 && errno != ENOENT)
        DQD_WARN("cannot remove %s/%s: %s", d->dir, name, strerror(errno));
}

/* Indexes one checked record as a stub; false when it cannot be (its file is then removed). */
static bool adopt(dqd_disktier *d, found *f)
{
    const dqd_rec_meta *m = &f->meta;
    dqd_model *model = record_model(d, m);
    uint64_t cost;
    dqd_drec *drec = model ? drec_alloc(d, m->nlayers, &cost) : NULL;
    dqd_seq *seq = NULL;
    int rc = drec ? dqd_store_insert_kind(d->store, (const char *)m->ns, m->ns_len, m->key, m->key_len, m->kind, model,
                                          &seq)
                  : DQ_NOMEM;
    if (rc == DQ_OK)
        rc = dqd_store_disk_reserve(d->store, f->file_bytes);
    if (rc < 0) {
        if (seq) {
            dqd_store_remove(d->store, seq);
            dqd_seq_unref(seq);
        }
        if (drec)
            dqd_hostmem_free(d->mem, drec);
        DQD_WARN("disk tier: dropping record %s (%s)", f->name, model ? dq_strerror(rc) : "its model");
        remove_file(d, f->name);
        return false;
    }
    drec->stamp = m->stamp;
    drec->nlayers = m->nlayers;
    memcpy(drec->name, f->name, sizeof drec->name);
    memcpy(drec->layers, m->layers, m->nlayers * sizeof *drec->layers);
    dqd_store_disk_attach(d->store, seq, drec, cost, f->file_bytes, true);
    f->seq = seq;
    return true;
}

/* A sequence built on chunks finds them again (they were adopted first); else it goes. */
static void relink(dqd_disktier *d, found *f)
{
    const dqd_rec_meta *m = &f->meta;
    dqd_seq **chunks = calloc(m->nprefix, sizeof *chunks);
    uint32_t got = 0;
    size_t off = 0;
    const uint8_t *key;
    size_t key_len;
    while (chunks && got < m->nprefix && dqd_rec_prefix_next(m, &off, &key, &key_len)) {
        dqd_seq *c = dqd_store_lookup_kind(d->store, (const char *)m->ns, m->ns_len, key, key_len, DQD_KIND_CHUNK);
        if (!c || c->model != f->seq->model) {
            dqd_seq_unref(c);
            break;
        }
        chunks[got++] = c;
    }
    int rc = !chunks ? DQ_NOMEM : got < m->nprefix ? DQ_NOT_FOUND : dqd_store_set_prefix(d->store, f->seq, chunks, got);
    for (uint32_t i = 0; i < got; i++)
        dqd_seq_unref(chunks[i]);
    free(chunks);
    if (rc < 0) {
        DQD_WARN("disk tier: sequence of record %s is built on chunks no longer held; dropping it", f->name);
        dqd_store_remove(d->store, f->seq);
    }
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int recover(dqd_disktier *d)
{
    int fd = dup(d->dirfd);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        if (fd >= 0)
            close(fd);
        DQD_ERROR("cannot list %s: %s", d->dir, strerror(errno));
        return DQ_IO;
    }
    uint64_t t0 = dqd_now_ns();
    found *fs = NULL;
    size_t n = 0, cap = 0, tmp = 0;
    int rc = DQ_OK;
    for (struct dirent *e; (e = readdir(dir));) {
        if (has_suffix(e->d_name, ".tmp")) {
            remove_file(d, e->d_name); /* a write a crash interrupted */
            tmp++;
            continue;
        }
        if (strlen(e->d_name) != NAME_LEN || !has_suffix(e->d_name, ".dqr"))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            found *g = realloc(fs, nc * sizeof *fs);
            if (!g) {
                rc = DQ_NOMEM;
                break;
            }
            fs = g;
            cap = nc;
        }
        memset(&fs[n], 0, sizeof fs[n]);
        memcpy(fs[n].name, e->d_name, NAME_LEN + 1);
        n++;
    }
    closedir(dir);

    uint64_t corrupt = 0, adopted = 0, bytes = 0;
    size_t good = 0;
    for (size_t i = 0; rc == DQ_OK && i < n; i++) {
        int r = read_meta(d, &fs[i]);
        if (r == DQ_OK) {
            if (good != i) {
                fs[good] = fs[i];
                fs[i].meta_buf = NULL;
                fs[i].layers = NULL;
            }
            good++;
            continue;
        }
        if (r == DQ_NOMEM) {
            rc = r;
        } else {
            DQD_WARN("disk tier: record %s fails its checks (%s); removing it", fs[i].name, dq_strerror(r));
            remove_file(d, fs[i].name);
            corrupt += r == DQ_CORRUPT;
        }
        found_free(&fs[i]);
    }
    for (size_t i = good; i < n; i++)
        found_free(&fs[i]);
    if (rc == DQ_OK) {
        /* Oldest first: the newest end up at the head of the LRU list, and a capacity smaller than
         * what is on disk keeps them. */
        if (good > 1)
            qsort(fs, good, sizeof *fs, by_stamp);
        for (size_t i = 0; i < good; i++) {
            found *f = &fs[i];
            if (f->meta.stamp >= d->next_stamp)
                d->next_stamp = f->meta.stamp + 1;
            if (adopt(d, f)) {
                adopted++;
                bytes += f->file_bytes;
                dqd_seq_unref(f->seq);
                f->seq = NULL;
                f->meta.stamp = UINT64_MAX; /* adopted */
            }
            if (f->meta.kind != DQD_KIND_SEQUENCE || f->meta.nprefix == 0)
                found_free(f); /* only a sequence built on chunks needs its meta any longer */
        }
        /* Then sequences find the chunks they are built on (still held unless the capacity took them). */
        for (size_t i = 0; i < good; i++) {
            found *f = &fs[i];
            if (f->meta.stamp != UINT64_MAX || f->meta.kind != DQD_KIND_SEQUENCE || f->meta.nprefix == 0)
                continue;
            f->seq = dqd_store_lookup_kind(d->store, (const char *)f->meta.ns, f->meta.ns_len, f->meta.key,
                                           f->meta.key_len, DQD_KIND_SEQUENCE);
            if (f->seq) {
                relink(d, f);
                dqd_seq_unref(f->seq);
            }
        }
    }
    for (size_t i = 0; i < good; i++)
        found_free(&fs[i]);
    free(fs);
    dqd_store_disk_counted(d->store, corrupt, adopted);
    DQD_INFO("disk tier %s: %llu records (%.1f MiB) recovered in %.3f s; %llu failed their checks, %zu unfinished "
             "writes removed",
             d->dir, (unsigned long long)adopted, (double)bytes / (1024.0 * 1024.0), (double)(dqd_now_ns() - t0) * 1e-9,
             (unsigned long long)corrupt, tmp);
    return rc;
}

/* ---- open, flush, free ---- */

static const dqd_store_disk_ops disk_ops = {op_spill, op_load, op_forget};

int dqd_disktier_open(dqd_ctx *ctx, dqd_disktier **out)
{
    const dqd_config *cfg = ctx->cfg;
    *out = NULL;
    if (mkdir(cfg->disk_dir, 0755) < 0 && errno != EEXIST) {
        DQD_ERROR("cannot create the disk tier's directory %s: %s", cfg->disk_dir, strerror(errno));
        return DQ_IO;
    }
    dqd_disktier *d = calloc(1, sizeof *d);
    if (!d || !(d->dir = strdup(cfg->disk_dir))) {
        free(d);
        return DQ_NOMEM;
    }
    d->ctx = ctx;
    d->store = ctx->store;
    d->mem = &ctx->mem;
    d->sync = cfg->disk_sync;
    d->next_stamp = 1;
    d->dirfd = open(d->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d->dirfd < 0) {
        DQD_ERROR("cannot open the disk tier's directory %s: %s", d->dir, strerror(errno));
        free(d->dir);
        free(d);
        return DQ_IO;
    }
    /* Two daemons on one directory would remove each other's records: the lock goes with the fd
     * (and with the process, however it ends). */
    if (flock(d->dirfd, LOCK_EX | LOCK_NB) < 0) {
        DQD_ERROR("the disk tier's directory %s is in use by another process (%s)", d->dir, strerror(errno));
        close(d->dirfd);
        free(d->dir);
        free(d);
        return DQ_IO;
    }
    uint64_t capacity = cfg->disk_capacity;
    if (!capacity) {
        struct statvfs vfs;
        capacity = fstatvfs(d->dirfd, &vfs) == 0 ? (uint64_t)vfs.f_bavail * vfs.f_frsize / 10 * 8 : 0;
        if (capacity < BLOCK)
            DQD_WARN("disk tier: no free space in %s; records will not be written", d->dir);
    }
    if (faccessat(d->dirfd, ".", W_OK, AT_EACCESS) < 0)
        DQD_WARN("disk tier: %s is not writable (%s); evicted sequences will be dropped", d->dir, strerror(errno));
    dqd_store_disk_enable(d->store, capacity, &disk_ops, d);
    *out = d; /* from now on the store's records refer to it */
    int rc = recover(d);
    if (rc < 0)
        return rc;
    DQD_INFO("disk tier in %s: capacity %llu MiB%s", d->dir, (unsigned long long)(capacity >> 20),
             d->sync ? ", fsync on" : "");
    return DQ_OK;
}

typedef struct flush_state {
    dqd_disktier *d;
    uint64_t written, bytes, failed;
} flush_state;

static void flush_one(void *arg, dqd_seq *seq)
{
    flush_state *fl = arg;
    dqd_disktier *d = fl->d;
    if (seq->drec)
        return; /* its record is up to date */
    spill_job *job;
    int rc = job_prepare(d, seq, &job);
    if (rc < 0) {
        fl->failed++;
        return;
    }
    rc = dqd_store_disk_reserve(d->store, job->bytes);
    if (rc == DQ_OK) {
        rc = job_open(job);
        for (uint32_t i = 0; rc == DQ_OK && i < seq->model->layers; i++)
            rc = write_layer(job, i);
        if (rc == DQ_OK) {
            rc = write_finish(job);
        } else if (job->fd >= 0) {
            close(job->fd);
            unlinkat(d->dirfd, job->tmp, 0);
        }
        if (rc == DQ_OK) {
            dqd_store_disk_attach(d->store, seq, job->drec, job->drec_cost, job->bytes, false);
            job->drec = NULL;
            fl->written++;
            fl->bytes += job->bytes;
        } else {
            dqd_store_disk_unreserve(d->store, job->bytes);
        }
    }
    if (rc < 0)
        fl->failed++;
    job_free(job);
}

void dqd_disktier_flush(dqd_disktier *d)
{
    if (!d)
        return;
    uint64_t t0 = dqd_now_ns();
    flush_state fl = {d, 0, 0, 0};
    dqd_store_foreach_resident(d->store, flush_one, &fl);
    DQD_INFO("disk tier: wrote %llu sequences (%.1f MiB) at shutdown in %.3f s", (unsigned long long)fl.written,
             (double)fl.bytes / (1024.0 * 1024.0), (double)(dqd_now_ns() - t0) * 1e-9);
    if (fl.failed)
        DQD_WARN("disk tier: %llu sequences could not be written at shutdown (capacity or I/O errors)",
                 (unsigned long long)fl.failed);
}

void dqd_disktier_free(dqd_disktier *d)
{
    if (!d)
        return;
    close(d->dirfd);
    free(d->dir);
    free(d);
}
