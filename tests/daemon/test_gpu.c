/* dquantd --backend cuda: the fallback to cpu (no CUDA device, no such device) with its log line,
 * the cuda backend coming up on the CPU emulation of CUDA (dquantd-fakecuda), and the GPU options
 * in --help. The GPU code paths themselves are checked by gpu_e2e (daemon-gpu-fake-check). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dqd_child.h"
#include "wire.h"

static char dir[64], sock[128], listen_arg[160];

/* Runs the daemon with extra flags, says HELLO and returns its backend (static buffer) and, when
 * stat is set, that STATS gauge in *value; then SIGTERM. *log gets its stderr. */
static const char *run_daemon(const char *const extra[], char **log, const char *stat, double *value)
{
    snprintf(dir, sizeof dir, "%s", dqd_tmpdir());
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(listen_arg, sizeof listen_arg, "unix:%s", sock);
    const char *args[32] = {"--listen", listen_arg, "--metrics", "off", "--log-level", "info"};
    int n = 6;
    for (int i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    int efd;
    pid_t pid = dqd_spawn(args, NULL, &efd);
    cr_assert_eq(dqd_wait_socket(sock, 20000), 0, "dquantd did not come up");

    int fd = wire_connect_unix(sock);
    cr_assert_geq(fd, 0);
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = 1;
    h.max_version = 1;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    Dquant__Response *r;
    cr_assert_eq(wire_call(fd, &req, NULL, &r, NULL, NULL), 0);
    cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_HELLO);
    static char backend[64];
    snprintf(backend, sizeof backend, "%s", r->hello->backend ? r->hello->backend : "");
    dquant__response__free_unpacked(r, NULL);

    if (stat) {
        Dquant__Stats s = DQUANT__STATS__INIT;
        Dquant__Request sreq = DQUANT__REQUEST__INIT;
        sreq.body_case = DQUANT__REQUEST__BODY_STATS;
        sreq.stats = &s;
        cr_assert_eq(wire_call(fd, &sreq, NULL, &r, NULL, NULL), 0);
        cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_STATS);
        bool found = false;
        for (size_t i = 0; i < r->stats->n_gauges; i++) {
            if (strcmp(r->stats->gauges[i]->key, stat) == 0) {
                *value = r->stats->gauges[i]->value;
                found = true;
            }
        }
        cr_assert(found, "STATS has no gauge %s", stat);
        dquant__response__free_unpacked(r, NULL);
    }
    close(fd);
    kill(pid, SIGTERM);
    *log = dqd_read_all(efd);
    cr_assert_eq(dqd_wait(pid, 30000), 0, "clean exit on SIGTERM; log:\n%s", *log);
    rmdir(dir);
    return backend;
}

static void use_fake(const char *devices)
{
    const char *fake = getenv("DQUANTD_FAKECUDA");
    if (!fake)
        cr_skip_test("this build has no dquantd-fakecuda");
    setenv("DQUANTD", fake, 1);
    if (devices)
        setenv("DQCU_FAKE_DEVICES", devices, 1);
}

Test(gpu, falls_back_to_cpu_without_a_device)
{
    /* meson runs this with CUDA_VISIBLE_DEVICES="": no device even on a GPU host */
    const char *extra[] = {"--backend", "cuda", NULL};
    char *log;
    const char *backend = run_daemon(extra, &log, "gpu_budget", &(double){0});
    cr_assert_str_eq(backend, "cpu");
    cr_assert(strstr(log, "backend cuda requested, but ") && strstr(log, "; using cpu"), "one log line says why:\n%s",
              log);
    cr_assert(strstr(log, "backend cpu"), "%s", log);
    free(log);
}

Test(gpu, cpu_backend_reports_no_gpu)
{
    const char *extra[] = {"--backend", "cpu", NULL};
    char *log;
    double budget = -1;
    const char *backend = run_daemon(extra, &log, "gpu_budget", &budget);
    cr_assert_str_eq(backend, "cpu");
    cr_assert_eq(budget, 0.0);
    cr_assert_null(strstr(log, "backend cuda"));
    free(log);
}

Test(gpu, emulated_device_brings_up_the_cuda_backend)
{
    use_fake(NULL);
    const char *extra[] = {"--backend", "cuda", "--gpu-memory", "64M", NULL};
    char *log;
    double budget = 0;
    const char *backend = run_daemon(extra, &log, "gpu_budget", &budget);
    cr_assert_str_eq(backend, "cuda", "log:\n%s", log);
    cr_assert_eq(budget, 64.0 * 1024 * 1024);
    cr_assert(strstr(log, "backend cuda: fake GPU"), "the device is logged:\n%s", log);
    free(log);
}

Test(gpu, default_budget_is_most_of_the_free_memory)
{
    use_fake(NULL);
    setenv("DQCU_FAKE_MEM", "1073741824", 1);
    const char *extra[] = {"--backend", "cuda", NULL};
    char *log;
    double budget = 0;
    const char *backend = run_daemon(extra, &log, "gpu_budget", &budget);
    cr_assert_str_eq(backend, "cuda");
    cr_assert_eq(budget, (double)(1073741824ull / 10 * 8));
    free(log);
}

Test(gpu, no_device_in_the_emulation_falls_back)
{
    use_fake("0");
    const char *extra[] = {"--backend", "cuda", NULL};
    char *log;
    const char *backend = run_daemon(extra, &log, NULL, NULL);
    cr_assert_str_eq(backend, "cpu");
    cr_assert(strstr(log, "no CUDA device of compute capability 9.0 or newer"), "%s", log);
    free(log);
}

Test(gpu, missing_device_ordinal_falls_back)
{
    use_fake("1");
    const char *extra[] = {"--backend", "cuda", "--gpu-device", "3", NULL};
    char *log;
    const char *backend = run_daemon(extra, &log, NULL, NULL);
    cr_assert_str_eq(backend, "cpu");
    cr_assert(strstr(log, "gpu_device 3 does not exist"), "%s", log);
    free(log);
}

Test(gpu, help_lists_the_gpu_options)
{
    const char *args[] = {"--help", NULL};
    int ofd;
    pid_t pid = dqd_spawn(args, &ofd, NULL);
    char *out = dqd_read_all(ofd);
    cr_assert_eq(dqd_wait(pid, 10000), 0);
    cr_assert(strstr(out, "--gpu-memory SIZE"));
    cr_assert(strstr(out, "INI: [store] gpu_memory"));
    cr_assert(strstr(out, "--gpu-device N"));
    cr_assert(strstr(out, "--gpu-attention-layout containers|hot|hot-only"), "%s", out);
    cr_assert(strstr(out, "INI: [server] gpu_attention_layout"));
    free(out);
}

Test(gpu, hot_layout_reports_hot_windows)
{
    use_fake(NULL);
    const char *extra[] = {"--backend", "cuda", "--gpu-attention-layout", "hot", NULL};
    char *log;
    double v = -1;
    const char *backend = run_daemon(extra, &log, "gpu_hot_windows", &v);
    cr_assert_str_eq(backend, "cuda", "%s", log);
    cr_assert_eq(v, 0.0, "no sequence yet");
    free(log);
}

Test(gpu, hot_only_layout_reports_its_metrics)
{
    use_fake(NULL);
    const char *extra[] = {"--backend", "cuda", "--gpu-attention-layout", "hot-only", NULL};
    char *log;
    double v = -1;
    const char *backend = run_daemon(extra, &log, "gpu_hot_only_windows", &v);
    cr_assert_str_eq(backend, "cuda", "%s", log);
    cr_assert_eq(v, 0.0, "no sequence yet");
    free(log);
}

Test(gpu, bad_attention_layout_is_refused_at_startup)
{
    const char *args[] = {"--backend", "cuda", "--gpu-attention-layout", "warm", NULL};
    int efd;
    pid_t pid = dqd_spawn(args, NULL, &efd);
    char *err = dqd_read_all(efd);
    int st = dqd_wait(pid, 10000);
    cr_assert_neq(st, 0, "dquantd started with a bad layout");
    cr_assert(strstr(err, "--gpu-attention-layout: unknown value 'warm' (containers|hot|hot-only)"), "%s", err);
    free(err);
}
