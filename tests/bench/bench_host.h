/* What the CPU benchmarks record about the machine they ran on (their JSON's "cpu" and
 * "loadavg": a loaded machine skews ratios through its caches). */
#ifndef DQ_BENCH_HOST_H
#define DQ_BENCH_HOST_H

#include <stdio.h>
#include <string.h>

/* The first line of `path` that starts with `key`, after the colon (or the whole line for no key),
 * without its newline or quotes; "unknown" when there is none. */
static inline void bench_read_line(const char *path, const char *key, char *out, size_t cap)
{
    char line[256];
    FILE *f = fopen(path, "r");
    snprintf(out, cap, "unknown");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        if (key && strncmp(line, key, strlen(key)))
            continue;
        const char *v = key ? strchr(line, ':') : line;
        if (!v)
            continue;
        v += key ? 1 : 0;
        while (*v == ' ' || *v == '\t')
            v++;
        snprintf(out, cap, "%s", v);
        out[strcspn(out, "\n\"")] = 0;
        break;
    }
    fclose(f);
}

#endif
