/* dquantd configuration: defaults, the INI file, flags overriding it, size suffixes, bad values. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "dquant/error.h"

static dqd_config cfg;
static char err[512];

static void setup(void)
{
    memset(err, 0, sizeof err);
    dqd_config_default(&cfg);
}

static void teardown(void)
{
    dqd_config_free(&cfg);
}

TestSuite(config, .init = setup, .fini = teardown);

static int from_args(int argc, char *const argv[], dqd_cli_action *action)
{
    dqd_config_free(&cfg);
    return dqd_config_from_args(&cfg, argc, argv, action, err, sizeof err);
}

/* A config file in a temporary directory; returns its path (static buffer). */
static const char *write_ini(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/dqd-test-ini-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

Test(config, defaults)
{
    dqd_cli_action a;
    char *argv[] = {"dquantd", NULL};
    cr_assert_eq(from_args(1, argv, &a), 0, "%s", err);
    cr_assert_eq(a, DQD_CLI_RUN);
    cr_assert_eq(cfg.nlisten, 2);
    cr_assert_eq(cfg.listen[0].kind, DQD_LISTEN_UNIX);
    cr_assert_str_eq(cfg.listen[0].path, "/tmp/dquantd.sock");
    cr_assert_eq(cfg.listen[1].kind, DQD_LISTEN_TCP);
    cr_assert_str_eq(cfg.listen[1].host, "127.0.0.1");
    cr_assert_eq(cfg.listen[1].port, 7733);
    cr_assert(cfg.metrics_enabled);
    cr_assert_eq(cfg.metrics_port, 9733);
    cr_assert_eq(cfg.host_memory, 4ull << 30);
    cr_assert_eq(cfg.max_frame, 32 + cfg.max_header + cfg.max_payload, "max_frame is derived when unset");
    cr_assert_null(cfg.secret);
    cr_assert_geq(cfg.workers, 1);
    cr_assert_eq(cfg.gpu_threads, 2);
    cr_assert_eq(cfg.gpu_spin_us, 200);
    cr_assert_eq(cfg.attend_kernel, 0, "auto");
    cr_assert_eq(cfg.encode_kernel, 0, "auto");
    cr_assert_eq(cfg.encode_schedule, DQD_ENCODE_PLANNED);
    cr_assert_eq(cfg.gpu_attention_layout, DQD_GPU_LAYOUT_CONTAINERS);
    cr_assert_eq(cfg.attention_value_mass, 0.0, "off");
}

Test(config, attention_value_mass)
{
    const char *path = write_ini("[server]\n"
                                 "attention_value_mass = 0.999\n");
    char cfgflag[] = "--config";
    char *argv[] = {"dquantd", cfgflag, (char *)path, NULL};
    dqd_cli_action a;
    cr_assert_eq(from_args(3, argv, &a), 0, "%s", err);
    unlink(path);
    cr_assert_eq(cfg.attention_value_mass, 0.999, "from the file");
    cr_assert_eq(dqd_config_set(&cfg, "server", "attention_value_mass", "OFF", false, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cfg.attention_value_mass, 0.0);
    static const char *const bad[] = {"nan", "-0.1", "1.5", "0.9x", "", "inf", "high"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_lt(dqd_config_set(&cfg, "server", "attention_value_mass", bad[i], false, err, sizeof err), 0, "%s",
                     bad[i]);
        cr_assert(strstr(err, "attention_value_mass: expected off or a mass target in [0, 1]"), "%s", err);
        cr_assert_eq(cfg.attention_value_mass, 0.0, "a refused value changes nothing");
    }
    cr_assert_eq(dqd_config_set(&cfg, "server", "attention_value_mass", "1", false, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cfg.attention_value_mass, 1.0, "1: exact");
    char flag[] = "--attention-value-mass", v[] = "0.99";
    char *argv2[] = {"dquantd", flag, v, NULL};
    cr_assert_eq(from_args(3, argv2, &a), 0, "%s", err);
    cr_assert_eq(cfg.attention_value_mass, 0.99, "from the flag");
}

Test(config, gpu_attention_layout)
{
    const char *path = write_ini("[server]\n"
                                 "gpu_attention_layout = hot\n");
    char cfgflag[] = "--config";
    char *argv[] = {"dquantd", cfgflag, (char *)path, NULL};
    dqd_cli_action a;
    cr_assert_eq(from_args(3, argv, &a), 0, "%s", err);
    unlink(path);
    cr_assert_eq(cfg.gpu_attention_layout, DQD_GPU_LAYOUT_HOT, "from the file");
    cr_assert_eq(dqd_config_set(&cfg, "server", "gpu_attention_layout", "CONTAINERS", false, err, sizeof err), 0, "%s",
                 err);
    cr_assert_eq(cfg.gpu_attention_layout, DQD_GPU_LAYOUT_CONTAINERS);
    cr_assert_lt(dqd_config_set(&cfg, "server", "gpu_attention_layout", "warm", false, err, sizeof err), 0);
    cr_assert(strstr(err, "gpu_attention_layout: unknown value 'warm' (containers|hot|hot-only)"), "%s", err);
    cr_assert_eq(cfg.gpu_attention_layout, DQD_GPU_LAYOUT_CONTAINERS, "a refused value changes nothing");

    char flag[] = "--gpu-attention-layout", hot[] = "hot";
    char *argv2[] = {"dquantd", flag, hot, NULL};
    cr_assert_eq(from_args(3, argv2, &a), 0, "%s", err);
    cr_assert_eq(cfg.gpu_attention_layout, DQD_GPU_LAYOUT_HOT, "from the flag");

    char hot_only[] = "hot-only";
    char *argv3[] = {"dquantd", flag, hot_only, NULL};
    cr_assert_eq(from_args(3, argv3, &a), 0, "%s", err);
    cr_assert_eq(cfg.gpu_attention_layout, DQD_GPU_LAYOUT_HOT_ONLY, "hot-only from the flag");
    cr_assert_eq(dqd_config_set(&cfg, "server", "gpu_attention_layout", "Hot-Only", false, err, sizeof err), 0, "%s",
                 err);
    cr_assert_eq(cfg.gpu_attention_layout, DQD_GPU_LAYOUT_HOT_ONLY, "from the INI key, any case");
    cr_assert_lt(dqd_config_set(&cfg, "server", "gpu_attention_layout", "hot_only", false, err, sizeof err), 0);
    cr_assert_eq(cfg.gpu_attention_layout, DQD_GPU_LAYOUT_HOT_ONLY);
}

Test(config, kernel_versions)
{
    const char *path = write_ini("[server]\n"
                                 "attend_kernel = 5\n"
                                 "encode_kernel = 4\n"
                                 "encode_schedule = plain\n");
    char cfgflag[] = "--config", enc[] = "--encode-kernel", auto_[] = "auto", att[] = "--attend-kernel=3";
    char *argv[] = {"dquantd", cfgflag, (char *)path, enc, auto_, att, NULL};
    dqd_cli_action a;
    cr_assert_eq(from_args(6, argv, &a), 0, "%s", err);
    unlink(path);
    cr_assert_eq(cfg.attend_kernel, 3, "the flag overrides the file");
    cr_assert_eq(cfg.encode_kernel, 0, "auto from the flag");
    cr_assert_eq(cfg.encode_schedule, DQD_ENCODE_PLAIN, "from the file");
    cr_assert_eq(dqd_config_set(&cfg, "server", "attend_kernel", "7", false, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cfg.attend_kernel, 7);
    cr_assert_eq(dqd_config_set(&cfg, "server", "encode_schedule", "PLANNED", false, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cfg.encode_schedule, DQD_ENCODE_PLANNED);
    cr_assert_lt(dqd_config_set(&cfg, "server", "encode_kernel", "3", false, err, sizeof err), 0);
    cr_assert(strstr(err, "encode_kernel: unknown value '3' (auto|5|4)"), "%s", err);
    cr_assert_eq(cfg.encode_kernel, 0, "a refused value changes nothing");
}

Test(config, file_then_flags_override)
{
    const char *path = write_ini("; comment\n"
                                 "[server]\n"
                                 "listen = unix:/tmp/a.sock\n"
                                 "listen = tcp://127.0.0.1:9000\n"
                                 "workers = 3\n"
                                 "gpu_threads = 0\n"
                                 "gpu_spin_us = 50\n"
                                 "log_level = debug\n"
                                 "[store]\n"
                                 "host_memory = 512M\n"
                                 "[limits]\n"
                                 "max_payload = 64K\n"
                                 "max_connections = 7\n"
                                 "[metrics]\n"
                                 "listen = off\n");
    dqd_cli_action a;
    char *argv[] = {"dquantd", "--config", (char *)path, "--workers=5", "--host-memory", "1G", NULL};
    cr_assert_eq(from_args(6, argv, &a), 0, "%s", err);
    unlink(path);
    cr_assert_eq(cfg.nlisten, 2, "the file's listeners replace the defaults");
    cr_assert_str_eq(cfg.listen[0].path, "/tmp/a.sock");
    cr_assert_eq(cfg.listen[1].port, 9000);
    cr_assert_eq(cfg.workers, 5, "flag beats file");
    cr_assert_eq(cfg.gpu_threads, 0);
    cr_assert_eq(cfg.gpu_spin_us, 50);
    cr_assert_eq(cfg.host_memory, 1ull << 30, "flag beats file");
    cr_assert_eq(cfg.max_payload, 64 * 1024);
    cr_assert_eq(cfg.max_connections, 7);
    cr_assert_eq(cfg.log_level, DQ_LOG_DEBUG);
    cr_assert_not(cfg.metrics_enabled);
    cr_assert_eq(cfg.max_frame, 32 + cfg.max_header + 64 * 1024);
}

Test(config, listen_flags_replace_file_listeners)
{
    const char *path = write_ini("[server]\nlisten = unix:/tmp/from-file.sock\n");
    dqd_cli_action a;
    char *argv[] = {"dquantd",    "--listen", "tcp://[::1]:7000", "--config",
                    (char *)path, "--listen", "unix:/tmp/b.sock", NULL};
    cr_assert_eq(from_args(7, argv, &a), 0, "%s", err);
    unlink(path);
    cr_assert_eq(cfg.nlisten, 2);
    cr_assert_eq(cfg.listen[0].kind, DQD_LISTEN_TCP);
    cr_assert_str_eq(cfg.listen[0].host, "::1");
    cr_assert_eq(cfg.listen[0].port, 7000);
    cr_assert_str_eq(cfg.listen[1].path, "/tmp/b.sock");
}

Test(config, help_and_version_win)
{
    dqd_cli_action a;
    char *argv[] = {"dquantd", "--bogus", "--help", NULL};
    cr_assert_eq(from_args(3, argv, &a), 0);
    cr_assert_eq(a, DQD_CLI_HELP);
    char *argv2[] = {"dquantd", "--version", NULL};
    cr_assert_eq(from_args(2, argv2, &a), 0);
    cr_assert_eq(a, DQD_CLI_VERSION);
}

/* Criterion hands parameters to a re-executed test process: no pointers inside them. */
struct size_case {
    char text[32];
    int ok;
    unsigned long long value;
};

ParameterizedTestParameters(config, sizes)
{
    static struct size_case cases[] = {
        {"0", 1, 0},
        {"4096", 1, 4096},
        {"64K", 1, 64ull << 10},
        {"64k", 1, 64ull << 10},
        {"512M", 1, 512ull << 20},
        {"4G", 1, 4ull << 30},
        {"4GiB", 1, 4ull << 30},
        {"4GB", 1, 4ull << 30},
        {"2T", 1, 2ull << 40},
        {" 8M ", 1, 8ull << 20},
        {"", 0, 0},
        {"M", 0, 0},
        {"-1", 0, 0},
        {"1.5G", 0, 0},
        {"12Q", 0, 0},
        {"4G junk", 0, 0},
        {"18446744073709551616", 0, 0},
        {"16777216T", 0, 0},
    };
    return cr_make_param_array(struct size_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct size_case *c, config, sizes)
{
    uint64_t v = 12345;
    int rc = dqd_parse_size(c->text, &v);
    if (c->ok) {
        cr_assert_eq(rc, 0, "'%s' should parse", c->text);
        cr_assert_eq(v, c->value, "'%s' -> %llu", c->text, (unsigned long long)v);
    } else {
        cr_assert_lt(rc, 0, "'%s' should be refused", c->text);
        cr_assert_eq(v, 12345, "a refused size leaves the output alone");
    }
}

struct bad_case {
    char args[4][48];
    char needle[80];
};

ParameterizedTestParameters(config, bad_flags)
{
    static struct bad_case cases[] = {
        {{"--bogus"}, "unknown option '--bogus'"},
        {{"--max-frame", "abc"}, "--max-frame: invalid size 'abc'"},
        {{"--host-memory", "10"}, "--host-memory: 10 is out of range"},
        {{"--workers", "0"}, "--workers: 0 is out of range"},
        {{"--workers", "2x"}, "--workers: invalid number"},
        {{"--gpu-threads", "65"}, "--gpu-threads: 65 is out of range"},
        {{"--gpu-spin-us", "-1"}, "--gpu-spin-us"},
        {{"--backend", "tpu"}, "unknown backend 'tpu'"},
        {{"--log-level", "loud"}, "unknown level 'loud'"},
        {{"--attend-kernel", "6"}, "--attend-kernel: unknown value '6' (auto|7|5|3)"},
        {{"--attend-kernel", "4"}, "--attend-kernel: unknown value '4'"},
        {{"--attend-kernel="}, "--attend-kernel"},
        {{"--encode-kernel", "3"}, "--encode-kernel: unknown value '3' (auto|5|4)"},
        {{"--encode-schedule", "fast"}, "--encode-schedule: unknown value 'fast' (planned|plain)"},
        {{"--gpu-attention-layout", "fast"}, "--gpu-attention-layout: unknown value 'fast' (containers|hot|hot-only)"},
        {{"--gpu-attention-layout="}, "--gpu-attention-layout"},
        {{"--listen", "http://x"}, "expected unix:/path or tcp://host:port"},
        {{"--listen", "tcp://example.com:80"}, "numeric IPv4/IPv6 address"},
        {{"--listen", "tcp://127.0.0.1:99999"}, "port must be 1..65535"},
        {{"--listen", "tcp://0.0.0.0:7733"}, "needs a shared secret"},
        {{"--metrics", "nohost"}, "expected HOST:PORT"},
        {{"--max-connections"}, "needs a value"},
        {{"positional"}, "unexpected argument 'positional'"},
        {{"--config", "/nonexistent/dquantd.ini"}, "cannot open config file"},

        {{"--listen", "unix:/tmp/x", "--listen", "unix:/tmp/x"}, "given twice"},
    };
    return cr_make_param_array(struct bad_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct bad_case *c, config, bad_flags)
{
    char *argv[6] = {"dquantd"};
    int argc = 1;
    for (int i = 0; i < 4 && c->args[i][0]; i++)
        argv[argc++] = c->args[i];
    argv[argc] = NULL;
    dqd_cli_action a;
    cr_assert_lt(from_args(argc, argv, &a), 0, "should be refused: %s", c->needle);
    cr_assert(strstr(err, c->needle), "message '%s' lacks '%s'", err, c->needle);
}

Test(config, empty_secret)
{
    dqd_cli_action a;
    char *argv[] = {"dquantd", "--secret", "", NULL};
    cr_assert_lt(from_args(3, argv, &a), 0);
    cr_assert(strstr(err, "must not be empty"), "%s", err);
}

Test(config, secret_allows_public_tcp)
{
    dqd_cli_action a;
    char *argv[] = {"dquantd", "--listen", "tcp://0.0.0.0:7733", "--secret", "s3cr3t", "--allow-plaintext", NULL};
    cr_assert_eq(from_args(6, argv, &a), 0, "%s", err);
    cr_assert(cfg.allow_plaintext);
    cr_assert_eq(cfg.secret_len, 6);
    cr_assert_str_eq(cfg.secret, "s3cr3t");
}

Test(config, secret_file)
{
    const char *path = write_ini("from-file\n");
    char arg[128];
    snprintf(arg, sizeof arg, "--secret-file=%s", path);
    dqd_cli_action a;
    char *argv[] = {"dquantd", arg, NULL};
    cr_assert_eq(from_args(2, argv, &a), 0, "%s", err);
    unlink(path);
    cr_assert_str_eq(cfg.secret, "from-file", "the trailing newline is stripped");
}

Test(config, ini_errors_name_the_line)
{
    cr_assert_lt(dqd_config_load_string(&cfg, "[server]\nworkers = 2\nnonsense = 1\n", err, sizeof err), 0);
    cr_assert(strstr(err, ":3:") && strstr(err, "unknown key 'nonsense'"), "%s", err);
    cr_assert_lt(dqd_config_load_string(&cfg, "[nosuch]\nkey = 1\n", err, sizeof err), 0);
    cr_assert(strstr(err, "unknown section [nosuch]"), "%s", err);
    cr_assert_lt(dqd_config_load_string(&cfg, "workers = 2\n", err, sizeof err), 0);
    cr_assert(strstr(err, "outside of a section"), "%s", err);
    cr_assert_lt(dqd_config_load_string(&cfg, "[store]\nhost_memory = lots\n", err, sizeof err), 0);
    cr_assert(strstr(err, "invalid size 'lots'"), "%s", err);
}

Test(config, coherent_limits)
{
    dqd_cli_action a;
    char *argv[] = {"dquantd", "--max-header", "1M", "--max-frame", "512K", NULL};
    cr_assert_lt(from_args(5, argv, &a), 0);
    cr_assert(strstr(err, "does not fit in max_frame"), "%s", err);
}

Test(config, loopback_detection)
{
    cr_assert(dqd_host_is_loopback("127.0.0.1"));
    cr_assert(dqd_host_is_loopback("127.8.9.10"));
    cr_assert(dqd_host_is_loopback("::1"));
    cr_assert(dqd_host_is_loopback("::ffff:127.0.0.1"));
    cr_assert_not(dqd_host_is_loopback("0.0.0.0"));
    cr_assert_not(dqd_host_is_loopback("10.1.2.3"));
    cr_assert_not(dqd_host_is_loopback("::"));
}

Test(config, shipped_example_parses)
{
    char e[512];
    cr_assert_eq(dqd_config_load_file(&cfg, DQD_EXAMPLE_INI, e, sizeof e), 0, "deploy/dquantd.ini: %s", e);
    cr_assert_eq(dqd_config_finish(&cfg, e, sizeof e), 0, "%s", e);
    cr_assert_eq(cfg.nlisten, 2);
    cr_assert_str_eq(cfg.listen[0].path, "/run/dquantd/dquantd.sock");
    cr_assert_eq(cfg.host_memory, 4ull << 30);
    cr_assert_eq(cfg.max_inflight, 64);
    cr_assert_eq(cfg.frame_cache, 512ull << 20);
    cr_assert(cfg.metrics_enabled);
}

/* The disk tier's settings: off by default; the directory, capacity and fsync from the file, the
 * flags winning; bad values refused; --help documents them. */
Test(config, disk_tier)
{
    dqd_cli_action a;
    char *plain[] = {"dquantd", NULL};
    cr_assert_eq(from_args(1, plain, &a), 0, "%s", err);
    cr_assert_null(cfg.disk_dir);
    cr_assert_eq(cfg.disk_capacity, 0);
    cr_assert_not(cfg.disk_sync);

    const char *path = write_ini("[store]\n"
                                 "disk_dir = /var/lib/dquantd/disk\n"
                                 "disk_capacity = 200G\n"
                                 "disk_sync = on\n");
    char *argv[] = {"dquantd", "--config", (char *)path, "--disk-dir", "/mnt/nvme/dq", NULL};
    cr_assert_eq(from_args(5, argv, &a), 0, "%s", err);
    unlink(path);
    cr_assert_str_eq(cfg.disk_dir, "/mnt/nvme/dq", "flag beats file");
    cr_assert_eq(cfg.disk_capacity, 200ull << 30);
    cr_assert(cfg.disk_sync);
    char *off[] = {"dquantd", "--disk-dir=/d", "--disk-sync", "off", "--disk-capacity", "1M", NULL};
    cr_assert_eq(from_args(6, off, &a), 0, "%s", err);
    cr_assert_not(cfg.disk_sync);
    cr_assert_eq(cfg.disk_capacity, 1ull << 20);

    char *bad_sync[] = {"dquantd", "--disk-sync", "maybe", NULL};
    cr_assert_eq(from_args(3, bad_sync, &a), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(err, "--disk-sync"), "%s", err);
    char *small[] = {"dquantd", "--disk-capacity", "64K", NULL};
    cr_assert_eq(from_args(3, small, &a), DQ_INVALID_ARGUMENT, "below 1 MiB");
    char *empty[] = {"dquantd", "--disk-dir", "", NULL};
    cr_assert_eq(from_args(3, empty, &a), DQ_INVALID_ARGUMENT);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    dqd_config_print_help(f);
    fclose(f);
    cr_assert(strstr(text, "--disk-dir DIR") && strstr(text, "--disk-capacity SIZE") &&
              strstr(text, "--disk-sync on|off"));
    cr_assert(strstr(text, "INI: [store] disk_dir."));
    free(text);
}

/* The limits on what clients may hold and for how long (issue 18): defaults, INI keys, flags. */
Test(config, connection_limits)
{
    dqd_cli_action a;
    char *argv[] = {"dquantd", NULL};
    cr_assert_eq(from_args(1, argv, &a), 0, "%s", err);
    cr_assert_eq(cfg.max_io_memory, 1ull << 30, "1G when max_frame is the default");
    cr_assert_eq(cfg.handshake_timeout, 10);
    cr_assert_eq(cfg.idle_timeout, 300);
    cr_assert_eq(cfg.frame_timeout, 30);
    cr_assert_eq(cfg.frame_min_rate, 1u << 20);
    cr_assert_eq(cfg.write_timeout, 60);
    cr_assert_eq(cfg.auth_fail_burst, 10);
    cr_assert_eq(cfg.auth_fail_per_min, 60);
    cr_assert_eq(cfg.metrics_max_connections, 16);
    cr_assert_eq(cfg.metrics_timeout_ms, 2000);
    cr_assert_null(cfg.metrics_token);

    char *big[] = {"dquantd", "--max-payload", "2G", NULL};
    cr_assert_eq(from_args(3, big, &a), 0, "%s", err);
    cr_assert_eq(cfg.max_io_memory, 2 * cfg.max_frame, "twice max_frame when that is larger");
    char *small[] = {"dquantd", "--max-io-memory", "64M", NULL};
    cr_assert_lt(from_args(3, small, &a), 0);
    cr_assert(strstr(err, "must hold at least one max_frame"), "%s", err);

    const char *path = write_ini("[limits]\nmax_payload = 1M\nmax_io_memory = 8M\nhandshake_timeout = 3\n"
                                 "idle_timeout = 0\nframe_timeout = 5\nframe_min_rate = 64K\nwrite_timeout = 7\n"
                                 "[server]\nauth_fail_burst = 4\nauth_fail_per_min = 6\n"
                                 "[metrics]\nmax_connections = 4\ntimeout_ms = 500\ntoken = from-ini\n");
    char arg[128];
    snprintf(arg, sizeof arg, "--config=%s", path);
    char *flags[] = {"dquantd", arg, "--write-timeout", "9", "--secret", "s", NULL};
    cr_assert_eq(from_args(6, flags, &a), 0, "%s", err);
    unlink(path);
    cr_assert_eq(cfg.max_io_memory, 8u << 20);
    cr_assert_eq(cfg.handshake_timeout, 3);
    cr_assert_eq(cfg.idle_timeout, 0);
    cr_assert_eq(cfg.frame_timeout, 5);
    cr_assert_eq(cfg.frame_min_rate, 64u << 10);
    cr_assert_eq(cfg.write_timeout, 9, "the flag wins");
    cr_assert_eq(cfg.auth_fail_burst, 4);
    cr_assert_eq(cfg.auth_fail_per_min, 6);
    cr_assert_eq(cfg.metrics_max_connections, 4);
    cr_assert_eq(cfg.metrics_timeout_ms, 500);
    cr_assert_str_eq(cfg.metrics_token, "from-ini", "setting the secret leaves the metrics token alone");
    cr_assert_str_eq(cfg.secret, "s");
}

/* The KVQ calibration limit (issue 20): 64M by default, the INI key and the flag; --help says
 * which profiles the cuda backend serves on the host path. */
Test(config, kvq_calibration_limit_and_backend_help)
{
    dqd_cli_action a;
    char *plain[] = {"dquantd", NULL};
    cr_assert_eq(from_args(1, plain, &a), 0, "%s", err);
    cr_assert_eq(cfg.max_calibration, 64ull << 20);
    const char *path = write_ini("[limits]\nmax_calibration_bytes = 8M\n");
    char *argv[] = {"dquantd", "--config", (char *)path, NULL};
    cr_assert_eq(from_args(3, argv, &a), 0, "%s", err);
    unlink(path);
    cr_assert_eq(cfg.max_calibration, 8ull << 20);
    char *flag[] = {"dquantd", "--max-calibration-bytes", "1K", NULL};
    cr_assert_eq(from_args(3, flag, &a), 0, "%s", err);
    cr_assert_eq(cfg.max_calibration, 1024);
    char *bad[] = {"dquantd", "--max-calibration-bytes", "lots", NULL};
    cr_assert_eq(from_args(3, bad, &a), DQ_INVALID_ARGUMENT);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    dqd_config_print_help(f);
    fclose(f);
    cr_assert(strstr(text, "--max-calibration-bytes SIZE"));
    cr_assert(strstr(text, "KVQuant++") && strstr(text, "host path"), "--backend's help states the KVQ host path");
    free(text);
}
