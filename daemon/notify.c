/* dquantd service-manager notification (see notify.h): libsystemd's sd_notify when built with it,
 * else the datagram protocol itself (one AF_UNIX datagram to $NOTIFY_SOCKET; a leading '@' names
 * an abstract socket). */
#include "notify.h"

#include "dquant/error.h"

#ifdef DQD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

int dqd_notify(const char *state)
{
    int rc = sd_notify(0, state);
    return rc < 0 ? DQ_IO : rc > 0;
}

#else
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int dqd_notify(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t len = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || len >= sizeof sa.sun_path)
        return DQ_INVALID_ARGUMENT;
    memcpy(sa.sun_path, path, len);
    if (sa.sun_path[0] == '@')
        sa.sun_path[0] = 0;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return DQ_IO;
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (const struct sockaddr *)&sa, salen);
    close(fd);
    return n < 0 ? DQ_IO : 1;
}
#endif
