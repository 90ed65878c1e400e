/* dquantd server (see server.h). */
#include "server.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "conn.h"
#include "dquant/error.h"
#include "dquant/version.h"
#include "gpu.h"
#include "http.h"
#include "lane.h"
#include "logging.h"
#include "notify.h"

#ifndef DQD_VERSION
#define DQD_VERSION DQ_VERSION_STRING
#endif

uint64_t dqd_now_ns(void)
{
    return uv_hrtime();
}

int dqd_handoff_init(uv_loop_t *loop, pthread_mutex_t *mu, pthread_cond_t *cv, uv_async_t *async, uv_async_cb cb)
{
    pthread_mutex_init(mu, NULL);
    pthread_cond_init(cv, NULL);
    if (uv_async_init(loop, async, cb) < 0) {
        pthread_mutex_destroy(mu);
        pthread_cond_destroy(cv);
        return -1;
    }
    return 0;
}

int dqd_server_init(dqd_server *srv, uv_loop_t *loop, const dqd_config *cfg)
{
    memset(srv, 0, sizeof *srv);
    srv->loop = loop;
    srv->cfg = cfg;
    srv->start_ns = dqd_now_ns();
    dqd_limits_default(&srv->limits);
    srv->limits.max_payload = cfg->max_payload;
    srv->limits.max_batch_items = cfg->max_batch_items;
    srv->frame_limits.max_header = (uint32_t)cfg->max_header;
    srv->frame_limits.max_payload = cfg->max_payload;
    dqd_hostmem_init(&srv->mem);
    dqd_metrics_init(&srv->metrics);
    dqd_framebufs_init(&srv->frames, cfg->frame_cache);

    int rc = dqd_registry_create(&srv->mem, cfg->max_models, &srv->reg);
    if (rc < 0)
        return rc;
    rc = dqd_store_create(&srv->mem, cfg->host_memory, &srv->store);
    if (rc < 0) {
        dqd_registry_destroy(srv->reg);
        srv->reg = NULL;
        return rc;
    }

    srv->backend_name = "cpu";
    if (cfg->backend == DQD_BACKEND_CUDA) {
        char why[256] = "";
        rc = dqd_gpu_create(cfg, &srv->mem, &srv->gpu, why, sizeof why);
        if (rc == DQ_OK) {
            srv->backend_name = "cuda";
            dqd_store_gpu_enable(srv->store, dqd_gpu_budget(srv->gpu), dqd_gpu_free_seq_layers, srv->gpu);
            DQD_INFO("backend cuda: %s; GPU budget %llu MiB", dqd_gpu_describe(srv->gpu),
                     (unsigned long long)(dqd_gpu_budget(srv->gpu) >> 20));
        } else {
            DQD_WARN("backend cuda requested, but %s; using cpu", why);
        }
    }
    return DQ_OK;
}

static void on_connection(uv_stream_t *server, int status)
{
    dqd_listener *l = server->data;
    if (status < 0) {
        DQD_WARN("listener: %s", uv_strerror(status));
        return;
    }
    dqd_conn_accept(l);
}

/* A stale socket file (no one accepting) is removed; a live one is an error. */
static int prepare_unix_path(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISSOCK(st.st_mode))
        return -EEXIST;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int live = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    if (live)
        return -EADDRINUSE;
    return unlink(path) < 0 ? -errno : 0;
}

static int open_listener(dqd_server *srv, dqd_listener *l)
{
    char name[160];
    dqd_listen_format(&l->addr, name, sizeof name);
    int rc;
    if (l->addr.kind == DQD_LISTEN_UNIX) {
        rc = prepare_unix_path(l->addr.path);
        if (rc < 0) {
            DQD_ERROR("cannot listen on %s: %s", name,
                      rc == -EADDRINUSE ? "another server is accepting on it" : strerror(-rc));
            return DQ_IO;
        }
        uv_pipe_init(srv->loop, &l->h.pipe, 0);
        l->open = true;
        rc = uv_pipe_bind(&l->h.pipe, l->addr.path);
        if (rc == 0)
            l->bound_unix = true;
    } else {
        union {
            struct sockaddr sa;
            struct sockaddr_in in4;
            struct sockaddr_in6 in6;
        } addr;
        uv_tcp_init(srv->loop, &l->h.tcp);
        l->open = true;
        rc = strchr(l->addr.host, ':') ? uv_ip6_addr(l->addr.host, l->addr.port, &addr.in6)
                                       : uv_ip4_addr(l->addr.host, l->addr.port, &addr.in4);
        if (rc == 0)
            rc = uv_tcp_bind(&l->h.tcp, &addr.sa, 0);
        l->require_secret = srv->cfg->secret != NULL;
    }
    l->h.handle.data = l;
    if (rc == 0)
        rc = uv_listen(&l->h.stream, 511, on_connection);
    if (rc < 0) {
        DQD_ERROR("cannot listen on %s: %s", name, uv_strerror(rc));
        return DQ_IO;
    }
    DQD_INFO("listening on %s%s", name, l->require_secret ? " (secret required)" : "");
    return DQ_OK;
}

static void on_signal(uv_signal_t *s, int signum)
{
    dqd_server *srv = s->data;
    DQD_INFO("received %s; shutting down", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    dqd_server_stop(srv);
}

static void on_reap(uv_idle_t *idle)
{
    dqd_server *srv = idle->data;
    while (srv->reap) {
        dqd_conn *c = srv->reap;
        srv->reap = c->reap_next;
        c->reap_next = NULL;
        c->reap_queued = false;
        if (!dqd_conn_reapable(c))
            continue; /* re-queued by its last request */
        if (c->prev)
            c->prev->next = c->next;
        else
            srv->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        srv->metrics.conns_open--;
        DQD_DEBUG("conn %llu freed", (unsigned long long)c->id);
        dqd_conn_free(c);
    }
    uv_idle_stop(idle);
    dqd_server_check_idle(srv);
}

void dqd_server_conn_closed(dqd_server *srv, dqd_conn *c)
{
    if (c->reap_queued || !dqd_conn_reapable(c))
        return;
    c->reap_queued = true;
    c->reap_next = srv->reap;
    srv->reap = c;
    if (srv->handles_ready)
        uv_idle_start(&srv->reaper, on_reap);
}

int dqd_server_start(dqd_server *srv)
{
    const dqd_config *cfg = srv->cfg;
    uv_signal_init(srv->loop, &srv->sig_term);
    uv_signal_init(srv->loop, &srv->sig_int);
    uv_idle_init(srv->loop, &srv->reaper);
    uv_timer_init(srv->loop, &srv->shutdown_timer);
    srv->sig_term.data = srv->sig_int.data = srv->reaper.data = srv->shutdown_timer.data = srv;
    srv->handles_ready = true;
    uv_signal_start(&srv->sig_term, on_signal, SIGTERM);
    uv_signal_start(&srv->sig_int, on_signal, SIGINT);

    for (uint32_t i = 0; i < cfg->nlisten; i++) {
        dqd_listener *l = &srv->listeners[srv->nlisteners++];
        l->srv = srv;
        l->addr = cfg->listen[i];
        if (open_listener(srv, l) < 0)
            return DQ_IO;
    }
    if (cfg->metrics_enabled && dqd_http_start(srv, cfg->metrics_host, cfg->metrics_port, &srv->http) < 0)
        return DQ_IO;
    if (srv->gpu && cfg->gpu_threads && dqd_lane_start(srv, cfg->gpu_threads, cfg->gpu_spin_us, &srv->lane) < 0)
        DQD_WARN("cannot start the GPU threads; the workers run GPU tasks");
    if (cfg->io_threads && dqd_lane_start(srv, cfg->io_threads, 0, &srv->io_lane) < 0)
        DQD_WARN("cannot start the I/O threads; the event loop reads every socket");
    return DQ_OK;
}

static void on_listener_closed(uv_handle_t *h)
{
    dqd_listener *l = h->data;
    if (l->bound_unix) {
        unlink(l->addr.path);
        l->bound_unix = false;
    }
}

static void on_shutdown_timeout(uv_timer_t *t)
{
    dqd_server *srv = t->data;
    DQD_WARN("shutdown timeout: closing %s connections with requests still in progress",
             srv->conns ? "the remaining" : "no");
    for (dqd_conn *c = srv->conns; c; c = c->next)
        dqd_conn_close(c);
}

static void finish(dqd_server *srv)
{
    if (srv->finished)
        return;
    srv->finished = true;
    uv_close((uv_handle_t *)&srv->sig_term, NULL);
    uv_close((uv_handle_t *)&srv->sig_int, NULL);
    uv_close((uv_handle_t *)&srv->reaper, NULL);
    uv_close((uv_handle_t *)&srv->shutdown_timer, NULL);
    dqd_lane_stop(srv->lane);
    srv->lane = NULL;
    dqd_lane_stop(srv->io_lane);
    srv->io_lane = NULL;
    DQD_INFO("stopped");
}

void dqd_server_check_idle(dqd_server *srv)
{
    if (srv->stopping && !srv->finished && !srv->conns && !srv->reap && !srv->tasks_inflight &&
        !srv->reqs_inflight && srv->handles_ready)
        finish(srv);
}

void dqd_server_stop(dqd_server *srv)
{
    if (srv->stopping)
        return;
    srv->stopping = true;
    dqd_notify("STOPPING=1");
    for (uint32_t i = 0; i < srv->nlisteners; i++) {
        dqd_listener *l = &srv->listeners[i];
        if (l->open) {
            l->open = false;
            uv_close(&l->h.handle, on_listener_closed);
        }
    }
    dqd_http_stop(srv->http);
    srv->http = NULL;
    if (!srv->handles_ready)
        return;
    for (dqd_conn *c = srv->conns; c; c = c->next)
        dqd_conn_drain(c, (uint64_t)srv->cfg->shutdown_timeout * 1000u);
    uv_timer_start(&srv->shutdown_timer, on_shutdown_timeout, (uint64_t)srv->cfg->shutdown_timeout * 1000u, 0);
    uv_unref((uv_handle_t *)&srv->shutdown_timer);
    dqd_server_check_idle(srv);
}

void dqd_server_destroy(dqd_server *srv)
{
    /* The store frees its GPU layers through the backend, which goes before the codecs. */
    dqd_store_destroy(srv->store);
    dqd_gpu_destroy(srv->gpu);
    dqd_registry_destroy(srv->reg);
    srv->store = NULL;
    srv->gpu = NULL;
    srv->reg = NULL;
    dqd_framebufs_destroy(&srv->frames);
}

void dqd_server_gauges(const dqd_server *srv, dqd_gauges *g)
{
    dqd_store_get_stats(srv->store, &g->store);
    g->gpu_allocated = srv->gpu ? dqd_gpu_allocated(srv->gpu) : 0;
    g->models = dqd_registry_model_count(srv->reg);
    g->inflight_requests = srv->reqs_inflight;
    dqd_framebufs_stats((dqd_framebufs *)&srv->frames, &g->frame_cache_bytes, &g->frame_buffers_reused,
                        &g->frame_buffers_fresh);
    g->workers = srv->cfg->workers;
    g->uptime_seconds = (double)(dqd_now_ns() - srv->start_ns) * 1e-9;
    g->backend = srv->backend_name;
    g->version = DQD_VERSION;
}
