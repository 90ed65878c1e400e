/* dquantd: command line, start-up and the event loop. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

#include "config.h"
#include "disktier.h"
#include "dquant/error.h"
#include "dquant/version.h"
#include "logging.h"
#include "notify.h"
#include "server.h"

#ifndef DQD_VERSION
#define DQD_VERSION DQ_VERSION_STRING
#endif

int main(int argc, char **argv)
{
    static dqd_config cfg;
    dqd_cli_action action;
    char err[512];
    if (dqd_config_from_args(&cfg, argc, argv, &action, err, sizeof err) < 0) {
        fprintf(stderr, "dquantd: %s\n", err);
        dqd_config_free(&cfg);
        return 2;
    }
    if (action == DQD_CLI_HELP) {
        dqd_config_print_help(stdout);
        dqd_config_free(&cfg);
        return 0;
    }
    if (action == DQD_CLI_VERSION) {
#ifdef DQD_HAVE_CUDA
        const char *backends = "cpu, cuda";
#else
        const char *backends = "cpu";
#endif
        printf("dquantd %s (libdquant %s, libuv %s, wire protocol %u, backends %s)\n", DQD_VERSION, dq_version(),
               uv_version_string(), 1u, backends);
        dqd_config_free(&cfg);
        return 0;
    }

    dqd_log_set_level(cfg.log_level);
    dqd_log_attach_lib();
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a disk tier write past RLIMIT_FSIZE fails with EFBIG instead */

    /* libuv sizes its thread pool, the daemon's workers, from this on first use. */
    char nthreads[16];
    snprintf(nthreads, sizeof nthreads, "%u", cfg.workers);
    setenv("UV_THREADPOOL_SIZE", nthreads, 1);

    uv_loop_t loop;
    int rc = uv_loop_init(&loop);
    if (rc < 0) {
        DQD_ERROR("uv_loop_init: %s", uv_strerror(rc));
        dqd_config_free(&cfg);
        return 1;
    }
    static dqd_server srv;
    int status = 0;
    rc = dqd_server_init(&srv, &loop, &cfg);
    if (rc < 0) {
        DQD_ERROR("cannot start: %s", dq_strerror(rc));
        uv_loop_close(&loop);
        dqd_config_free(&cfg);
        return 1;
    }
    /* The disk tier's records are back in the store before the first client is served. */
    dqd_disktier *disk = NULL;
    if (cfg.disk_dir && (rc = dqd_disktier_open(&srv.ctx, &disk)) < 0) {
        DQD_ERROR("cannot start the disk tier: %s", dq_strerror(rc));
        status = 1;
        dqd_server_stop(&srv);
    } else if (dqd_server_start(&srv) < 0) {
        status = 1;
        dqd_server_stop(&srv);
    } else {
        DQD_INFO("dquantd %s ready: %u workers, host memory %llu MiB, backend %s", DQD_VERSION, cfg.workers,
                 (unsigned long long)(cfg.host_memory >> 20), srv.ctx.backend_name);
        dqd_notify("READY=1\nSTATUS=serving");
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    if (status == 0)
        dqd_disktier_flush(disk);
    dqd_server_destroy(&srv);
    dqd_disktier_free(disk);
    rc = uv_loop_close(&loop);
    if (rc < 0)
        DQD_WARN("event loop closed with handles still open: %s", uv_strerror(rc));
    dqd_config_free(&cfg);
    return status;
}
