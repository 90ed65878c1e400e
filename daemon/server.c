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
#include "http.h"
#include "lane.h"
#include "logging.h"
#include "notify.h"
#include "tls.h"

static void check_idle(void *arg);
static void kick_housekeeping(void *arg);

int dqd_server_init(dqd_server *srv, uv_loop_t *loop, const dqd_config *cfg)
{
    memset(srv, 0, sizeof *srv);
    int rc = dqd_ctx_init(&srv->ctx, loop, cfg);
    srv->ctx.on_idle = check_idle;
    srv->ctx.idle_arg = srv;
    srv->ctx.iomem.kick = kick_housekeeping;
    srv->ctx.iomem.kick_arg = srv;
    return rc;
}

static void conn_closed(dqd_conn *c, void *arg);

static void on_connection(uv_stream_t *server, int status)
{
    dqd_listener *l = server->data;
    if (status < 0) {
        DQD_WARN("listener: %s", uv_strerror(status));
        return;
    }
    dqd_server *srv = l->srv;
    dqd_conn *c = dqd_conn_create(&srv->ctx, l->addr.kind == DQD_LISTEN_TCP, l->require_secret, ++srv->next_conn_id,
                                  conn_closed, srv);
    if (!c)
        return;
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->ctx.metrics.conns_open++;
    dqd_conn_accept(c, &l->h.stream);
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
        uv_pipe_init(srv->ctx.loop, &l->h.pipe, 0);
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
        uv_tcp_init(srv->ctx.loop, &l->h.tcp);
        l->open = true;
        rc = strchr(l->addr.host, ':') ? uv_ip6_addr(l->addr.host, l->addr.port, &addr.in6)
                                       : uv_ip4_addr(l->addr.host, l->addr.port, &addr.in4);
        if (rc == 0)
            rc = uv_tcp_bind(&l->h.tcp, &addr.sa, 0);
        /* A verified client certificate authenticates in place of the secret (tls.h). */
        l->require_secret = srv->ctx.cfg->secret != NULL && !dqd_tls_ctx_mutual(srv->ctx.tls);
    }
    l->h.handle.data = l;
    if (rc == 0)
        rc = uv_listen(&l->h.stream, 511, on_connection);
    if (rc < 0) {
        DQD_ERROR("cannot listen on %s: %s", name, uv_strerror(rc));
        return DQ_IO;
    }
    bool tls = l->addr.kind == DQD_LISTEN_TCP && srv->ctx.tls;
    DQD_INFO("listening on %s%s%s", name,
             tls ? (dqd_tls_ctx_mutual(srv->ctx.tls) ? " (TLS, client certificate required)" : " (TLS)") : "",
             l->require_secret ? " (secret required)" : "");
    return DQ_OK;
}

static void on_signal(uv_signal_t *s, int signum)
{
    dqd_server *srv = s->data;
    DQD_INFO("received %s; shutting down", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    dqd_server_stop(srv);
}

/* Housekeeping on the loop, between callbacks: free closed connections, wake those waiting for
 * client I/O memory. */
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
        srv->ctx.metrics.conns_open--;
        DQD_DEBUG("conn %llu freed", (unsigned long long)c->id);
        dqd_conn_free(c);
    }
    uv_idle_stop(idle);
    dqd_iomem_wake(&srv->ctx.iomem);
    check_idle(srv);
}

static void kick_housekeeping(void *arg)
{
    dqd_server *srv = arg;
    if (srv->handles_ready && !srv->finished)
        uv_idle_start(&srv->reaper, on_reap);
}

/* A connection has closed and no request refers to it any more: free it on the reaper. */
static void conn_closed(dqd_conn *c, void *arg)
{
    dqd_server *srv = arg;
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
    const dqd_config *cfg = srv->ctx.cfg;
    uv_signal_init(srv->ctx.loop, &srv->sig_term);
    uv_signal_init(srv->ctx.loop, &srv->sig_int);
    uv_idle_init(srv->ctx.loop, &srv->reaper);
    uv_timer_init(srv->ctx.loop, &srv->shutdown_timer);
    srv->sig_term.data = srv->sig_int.data = srv->reaper.data = srv->shutdown_timer.data = srv;
    srv->handles_ready = true;
    uv_signal_start(&srv->sig_term, on_signal, SIGTERM);
    uv_signal_start(&srv->sig_int, on_signal, SIGINT);

    if (dqd_tls_ctx_create(cfg, &srv->ctx.tls) < 0)
        return DQ_IO;
    for (uint32_t i = 0; i < cfg->nlisten; i++) {
        dqd_listener *l = &srv->listeners[srv->nlisteners++];
        l->srv = srv;
        l->addr = cfg->listen[i];
        if (open_listener(srv, l) < 0)
            return DQ_IO;
    }
    if (cfg->metrics_enabled && dqd_http_start(&srv->ctx, cfg->metrics_host, cfg->metrics_port, &srv->http) < 0)
        return DQ_IO;
    if (srv->ctx.gpu && cfg->gpu_threads &&
        dqd_lane_start(&srv->ctx, cfg->gpu_threads, cfg->gpu_spin_us, &srv->ctx.lane) < 0)
        DQD_WARN("cannot start the GPU threads; the workers run GPU tasks");
    if (cfg->io_threads && dqd_lane_start(&srv->ctx, cfg->io_threads, 0, &srv->ctx.io_lane) < 0)
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
    dqd_lane_stop(srv->ctx.lane);
    srv->ctx.lane = NULL;
    dqd_lane_stop(srv->ctx.io_lane);
    srv->ctx.io_lane = NULL;
    DQD_INFO("stopped");
}

static void check_idle(void *arg)
{
    dqd_server *srv = arg;
    if (srv->ctx.stopping && !srv->finished && !srv->conns && !srv->reap && !srv->ctx.tasks_inflight &&
        !srv->ctx.reqs_inflight && srv->handles_ready)
        finish(srv);
}

void dqd_server_stop(dqd_server *srv)
{
    if (srv->ctx.stopping)
        return;
    srv->ctx.stopping = true;
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
        dqd_conn_drain(c, (uint64_t)srv->ctx.cfg->shutdown_timeout * 1000u);
    uv_timer_start(&srv->shutdown_timer, on_shutdown_timeout, (uint64_t)srv->ctx.cfg->shutdown_timeout * 1000u, 0);
    uv_unref((uv_handle_t *)&srv->shutdown_timer);
    check_idle(srv);
}

void dqd_server_destroy(dqd_server *srv)
{
    dqd_tls_ctx_free(srv->ctx.tls);
    srv->ctx.tls = NULL;
    dqd_ctx_destroy(&srv->ctx);
}
