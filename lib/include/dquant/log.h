/* dquant — library logging. The library never prints; it reports through this callback. */
#ifndef DQUANT_LOG_H
#define DQUANT_LOG_H

#include "dquant/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dq_log_level { DQ_LOG_ERROR = 0, DQ_LOG_WARN = 1, DQ_LOG_INFO = 2, DQ_LOG_DEBUG = 3 } dq_log_level;
typedef void (*dq_log_fn)(void *opaque, dq_log_level level, const char *file, int line, const char *msg);

/* Sets the process-wide callback (NULL: silent, the default). Set it before other threads use the
 * library. */
DQ_API void dq_set_log(dq_log_fn fn, void *opaque, dq_log_level max_level);

#ifdef __cplusplus
}
#endif
#endif
