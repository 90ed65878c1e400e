/* Replays fuzz inputs without libFuzzer: every file named on the command line, or every file of
 * every directory named, through LLVMFuzzerTestOneInput. A crash or sanitizer report fails the
 * test; otherwise it prints "N passed, 0 failed". */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_replay: cannot open %s\n", path);
        return -1;
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return -1;
    }
    long n = ftell(f);
    rewind(f);
    if (n < 0) {
        fclose(f);
        return -1;
    }
    uint8_t *buf = malloc(n ? (size_t)n : 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "fuzz_replay: cannot read %s\n", path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    unsigned passed = 0, failed = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) < 0) {
            fprintf(stderr, "fuzz_replay: no such file or directory: %s\n", argv[i]);
            failed++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]) == 0)
                passed++;
            else
                failed++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            failed++;
            continue;
        }
        char **names = NULL;
        size_t n = 0, cap = 0;
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.')
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                char **grown = realloc(names, cap * sizeof *names);
                if (!grown)
                    break;
                names = grown;
            }
            names[n++] = strdup(e->d_name);
        }
        closedir(d);
        qsort(names, n, sizeof *names, cmp_str);
        for (size_t k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]);
            if (run_file(path) == 0)
                passed++;
            else
                failed++;
            free(names[k]);
        }
        free(names);
    }
    if (passed + failed == 0) {
        fprintf(stderr, "fuzz_replay: no inputs\n");
        return 1;
    }
    printf("%u passed, %u failed\n", passed, failed);
    return failed ? 1 : 0;
}
