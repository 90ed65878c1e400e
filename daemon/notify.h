/* dquantd service-manager notification (systemd Type=notify): sends a state string such as
 * "READY=1" to $NOTIFY_SOCKET. Without NOTIFY_SOCKET it does nothing. */
#ifndef DQD_NOTIFY_H
#define DQD_NOTIFY_H

/* Returns 1 when sent, 0 when there is no NOTIFY_SOCKET, a negative dq_error on failure. */
int dqd_notify(const char *state);

#endif
