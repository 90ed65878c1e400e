#include <stdarg.h>
#include <stdio.h>

#include "codec_internal.h"

static dq_log_fn g_log_fn;
static void *g_log_opaque;
static dq_log_level g_log_max = DQ_LOG_ERROR;

void dq_set_log(dq_log_fn fn, void *opaque, dq_log_level max_level)
{
    g_log_fn = fn;
    g_log_opaque = opaque;
    g_log_max = max_level;
}

void dq__log(dq_log_level level, const char *file, int line, const char *fmt, ...)
{
    if (!g_log_fn || level > g_log_max)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g_log_fn(g_log_opaque, level, file, line, msg);
}
