/* dquantd logging: leveled lines on stderr ("2025-01-31T12:00:00.123Z WARN  conn.c:210 message"),
 * plus the check macros the daemon uses to log a failure's file and line before leaving.
 *
 * Thread-safe: each line is formatted on the caller's stack and written with one write(2). */
#ifndef DQD_LOGGING_H
#define DQD_LOGGING_H

#include <stdarg.h>

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

#define DQD_LOG(level, ...)                                          \
    do {                                                             \
        if ((level) <= dqd_log_max)                                  \
            dqd_log_write((level), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define DQD_ERROR(...) DQD_LOG(DQ_LOG_ERROR, __VA_ARGS__)
#define DQD_WARN(...) DQD_LOG(DQ_LOG_WARN, __VA_ARGS__)
#define DQD_INFO(...) DQD_LOG(DQ_LOG_INFO, __VA_ARGS__)
#define DQD_DEBUG(...) DQD_LOG(DQ_LOG_DEBUG, __VA_ARGS__)

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
