/* dquantd logging (see logging.h). */
#include "logging.h"

#include <stdio.h>
#include <strings.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

dq_log_level dqd_log_max = DQ_LOG_INFO;

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

void dqd_log_set_level(dq_log_level level)
{
    dqd_log_max = level;
}

int dqd_log_level_parse(const char *name, dq_log_level *out)
{
    static const struct {
        const char *name;
        dq_log_level level;
    } names[] = {
        {"error", DQ_LOG_ERROR}, {"warn", DQ_LOG_WARN},   {"warning", DQ_LOG_WARN},
        {"info", DQ_LOG_INFO},   {"debug", DQ_LOG_DEBUG},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcasecmp(name, names[i].name) == 0) {
            *out = names[i].level;
            return DQ_OK;
        }
    }
    return DQ_INVALID_ARGUMENT;
}

const char *dqd_log_level_name(dq_log_level level)
{
    if ((unsigned)level >= sizeof level_names / sizeof level_names[0])
        return "?";
    return level_names[level];
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

void dqd_log_vwrite(dq_log_level level, const char *file, int line, const char *fmt, va_list ap)
{
    char buf[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);

    int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, dqd_log_level_name(level));
    if (file && n >= 0 && (size_t)n < sizeof buf)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s:%d ", base_name(file), line);
    if (n >= 0 && (size_t)n < sizeof buf)
        n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof buf - 1 ? (size_t)n : sizeof buf - 2;
    buf[len++] = '\n';
    /* One write per line keeps lines of concurrent threads apart; a short write to stderr is
     * not worth retrying for a log line. */
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

void dqd_log_write(dq_log_level level, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dqd_log_vwrite(level, file, line, fmt, ap);
    va_end(ap);
}

static uint64_t suppressed_total;

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

bool dqd_lograte_allow(dqd_lograte *r, dq_log_level level, const char *file, int line)
{
    const uint64_t now = mono_ms();
    if (r->window_start_ms == 0 || now - r->window_start_ms >= DQD_LOGRATE_MS) {
        if (r->suppressed)
            dqd_log_write(level, file, line, "%llu more lines like the next were suppressed in %.0f s",
                          (unsigned long long)r->suppressed, (double)(now - r->window_start_ms) / 1000.0);
        r->window_start_ms = now ? now : 1;
        r->in_window = 0;
        r->suppressed = 0;
    }
    if (r->in_window < DQD_LOGRATE_BURST) {
        r->in_window++;
        return true;
    }
    r->suppressed++;
    suppressed_total++;
    return false;
}

uint64_t dqd_log_suppressed_total(void)
{
    return suppressed_total;
}

static void lib_log(void *opaque, dq_log_level level, const char *file, int line, const char *msg)
{
    (void)opaque;
    if (level <= dqd_log_max)
        dqd_log_write(level, file, line, "libdquant: %s", msg);
}

void dqd_log_attach_lib(void)
{
    dq_set_log(lib_log, NULL, dqd_log_max);
}
