/* Allocation-failure injection (see failalloc.h). */
#define DQD_FAILALLOC_IMPL
#include "failalloc.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static dqd_fa_ctl own; /* DQD_FAIL_ALLOC=N, or nothing armed */
static dqd_fa_ctl *ctl = &own;

static void setup(void)
{
    const char *n = getenv("DQD_FAIL_ALLOC");
    if (n)
        own.countdown = strtoll(n, NULL, 10);
    const char *path = getenv("DQD_FAIL_ALLOC_CTL");
    if (!path)
        return;
    int fd = open(path, O_RDWR);
    if (fd < 0)
        abort(); /* a test build asked for injection it cannot have: fail loudly */
    void *m = mmap(NULL, sizeof *ctl, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        abort();
    ctl = m;
}

/* 1 when this allocation is the one to fail. The fields are shared with the test process, so they
 * are accessed atomically through the GCC builtins (plain int64_t in the mapped struct). */
static int should_fail(void)
{
    pthread_once(&once, setup);
    if (__atomic_load_n(&ctl->countdown, __ATOMIC_SEQ_CST) <= 0)
        return 0;
    __atomic_add_fetch(&ctl->calls, 1, __ATOMIC_SEQ_CST);
    if (__atomic_sub_fetch(&ctl->countdown, 1, __ATOMIC_SEQ_CST) != 0)
        return 0;
    __atomic_add_fetch(&ctl->fired, 1, __ATOMIC_SEQ_CST);
    return 1;
}

void *dqd_fa_malloc(size_t size)
{
    return should_fail() ? NULL : malloc(size);
}

void *dqd_fa_calloc(size_t n, size_t size)
{
    return should_fail() ? NULL : calloc(n, size);
}

void *dqd_fa_realloc(void *p, size_t size)
{
    return should_fail() ? NULL : realloc(p, size);
}

void *dqd_fa_aligned_alloc(size_t align, size_t size)
{
    return should_fail() ? NULL : aligned_alloc(align, size);
}

char *dqd_fa_strdup(const char *s)
{
    return should_fail() ? NULL : strdup(s);
}
