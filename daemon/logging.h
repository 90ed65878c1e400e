/* dquantd logging: leveled lines on stderr ("2025-01-31T12:00:00.123Z WARN  conn.c:210 message"),
 * plus the check macros the daemon uses to log a failure's file and line before leaving.
 *
 * Thread-safe: each line is formatted on the caller's stack and written with one write(2). */
#ifndef DQD_LOGGING_H
#define DQD_LOGGING_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "dquant/error.h"
#include "dquant/log.h"

/* The most verbose level printed; written once at start-up, read by every thread. */
extern dq_log_level dqd_log_max;

void dqd_log_set_level(dq_log_level level);
/* "error", "warn"/"warning", "info", "debug" → level. Returns 0 or DQ_INVALID_ARGUMENT. */
int dqd_log_level_parse(const char *name, dq_log_level *out);
const char *dqd_log_level_name(dq_log_level level);

void dqd_log_write(dq_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void dqd_log_vwrite(dq_log_level level, const char *file, int line, const char *fmt, va_list ap);

/* Routes libdquant's log callback into ours. */
void dqd_log_attach_lib(void);

/* Lines a client can cause (a refused connection, a failed HELLO) are limited per call site, so that
 * a flood of them cannot flood the log: at most DQD_LOGRATE_BURST lines per DQD_LOGRATE_MS window;
 * the next line after a window with suppressed lines is preceded by one that counts them. */
#define DQD_LOGRATE_MS 10000u
#define DQD_LOGRATE_BURST 5u

typedef struct dqd_lograte {
    uint64_t window_start_ms;
    uint32_t in_window;
    uint64_t suppressed;
} dqd_lograte;

/* Whether a line at file:line may be written now (counts it as suppressed if not). Thread-safe only
 * per call site run by one thread: the daemon's limited lines are all on the loop thread. */
bool dqd_lograte_allow(dqd_lograte *r, dq_log_level level, const char *file, int line);
/* Lines dqd_lograte_allow has suppressed since start, over every call site (for tests). */
uint64_t dqd_log_suppressed_total(void);

#define DQD_LOG(level, ...)                                          \
    do {                                                             \
        if ((level) <= dqd_log_max)                                  \
            dqd_log_write((level), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define DQD_ERROR(...) DQD_LOG(DQ_LOG_ERROR, __VA_ARGS__)
#define DQD_WARN(...) DQD_LOG(DQ_LOG_WARN, __VA_ARGS__)
#define DQD_INFO(...) DQD_LOG(DQ_LOG_INFO, __VA_ARGS__)
#define DQD_DEBUG(...) DQD_LOG(DQ_LOG_DEBUG, __VA_ARGS__)

/* DQD_LOG with the call site's own dqd_lograte. */
#define DQD_LOG_LIMITED(level, ...)                                                               \
    do {                                                                                          \
        static dqd_lograte dqd__rate;                                                             \
        if ((level) <= dqd_log_max && dqd_lograte_allow(&dqd__rate, (level), __FILE__, __LINE__)) \
            dqd_log_write((level), __FILE__, __LINE__, __VA_ARGS__);                              \
    } while (0)
#define DQD_WARN_LIMITED(...) DQD_LOG_LIMITED(DQ_LOG_WARN, __VA_ARGS__)
#define DQD_INFO_LIMITED(...) DQD_LOG_LIMITED(DQ_LOG_INFO, __VA_ARGS__)

/* Evaluates expr (an int-returning call); on a negative result stores it in rc, logs the call
 * with its file:line at debug level and jumps to label. */
#define DQD_CHECK_GOTO(expr, rc, label)                             \
    do {                                                            \
        int dqd__r = (expr);                                        \
        if (dqd__r < 0) {                                           \
            (rc) = dqd__r;                                          \
            DQD_DEBUG("%s failed: %s", #expr, dq_err_name(dqd__r)); \
            goto label;                                             \
        }                                                           \
    } while (0)

#endif
