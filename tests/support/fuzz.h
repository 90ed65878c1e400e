/* What the fuzz targets share: the check that aborts (so libFuzzer and the replay driver
 * fuzz_replay.c report it as a crash) and the writer of seed-corpus files (a selector byte, then
 * the body). */
#ifndef DQTEST_FUZZ_H
#define DQTEST_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                             \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                 \
        }                                                                            \
    } while (0)

/* Writes DIR/NAME = sel, body[0..len). Returns 0 or -1 (reported on stderr). */
static inline int fuzz_write_seed(const char *dir, const char *name, uint8_t sel, const uint8_t *body, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return -1;
    }
    int ok = fwrite(&sel, 1, 1, f) == 1 && fwrite(body, 1, len, f) == len;
    ok &= fclose(f) == 0;
    return ok ? 0 : -1;
}

#endif
