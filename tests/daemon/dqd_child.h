/* Runs the dquantd under test ($DQUANTD) as a child process for the CLI and server tests. */
#ifndef DQD_TEST_CHILD_H
#define DQD_TEST_CHILD_H

#include <sys/types.h>

/* Starts $DQUANTD with args (NULL-terminated, without argv[0]); stdout / stderr go to pipes
 * returned in *out_fd / *err_fd (NULL: inherited). Returns the pid. */
pid_t dqd_spawn(const char *const args[], int *out_fd, int *err_fd);
/* Waits for the child: its exit status, 128 + signal if killed, -1 on timeout (then it is killed). */
int dqd_wait(pid_t pid, int timeout_ms);
/* Reads a pipe to EOF (malloc'd, NUL-terminated). */
char *dqd_read_all(int fd);
/* Polls until a Unix socket at path accepts connections. 0 or -1 on timeout. */
int dqd_wait_socket(const char *path, int timeout_ms);
/* A fresh private directory under /tmp (static buffer). */
const char *dqd_tmpdir(void);

#endif
