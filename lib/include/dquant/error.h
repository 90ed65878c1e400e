/* dquant — error codes shared by libdquant, the daemon and the client.
 *
 * Every function of the library that can fail returns an int: 0 (DQ_OK) on success or one of the
 * negative codes below. The values are fixed: they travel on the wire (the daemon's error replies
 * carry them) and must never be renumbered. New codes are only appended. */
#ifndef DQUANT_ERROR_H
#define DQUANT_ERROR_H

#include "dquant/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message) */
#define DQ_ERRNO_MAP(X)                                                                     \
    X(OK, 0, "success")                                                                     \
    X(INVALID_ARGUMENT, -1, "invalid argument")                                             \
    X(NOMEM, -2, "out of memory")                                                           \
    X(NONFINITE, -3, "input holds NaN or infinity")                                         \
    X(RANGE, -4, "value outside the codec range (fp16 scale/offset)")                       \
    X(SHAPE, -5, "wrong shape")                                                             \
    X(DTYPE, -6, "unsupported data type")                                                   \
    X(PROFILE, -7, "invalid or unknown codec profile")                                      \
    X(CONTAINER_TOO_SMALL, -8, "container too small for the profile's cheapest assignment") \
    X(CORRUPT, -9, "corrupted container or record")                                         \
    X(TRUNCATED, -10, "truncated input")                                                    \
    X(VERSION, -11, "unsupported format or protocol version")                               \
    X(OUT_OF_BOUNDS, -12, "token range out of bounds")                                      \
    X(NOT_FOUND, -13, "not found")                                                          \
    X(EXISTS, -14, "already exists")                                                        \
    X(RESOURCE_EXHAUSTED, -15, "resource exhausted")                                        \
    X(UNAUTHENTICATED, -16, "unauthenticated")                                              \
    X(PERMISSION, -17, "permission denied")                                                 \
    X(PROTOCOL, -18, "protocol error")                                                      \
    X(TOO_LARGE, -19, "frame or payload larger than the configured limit")                  \
    X(UNSUPPORTED, -20, "unsupported operation or message type")                            \
    X(IO, -21, "I/O error")                                                                 \
    X(TIMEOUT, -22, "timed out")                                                            \
    X(CONNECTION, -23, "connection failed or closed")                                       \
    X(BUSY, -24, "busy, try again")                                                         \
    X(ORDER, -25, "append out of order")                                                    \
    X(SHUTTING_DOWN, -26, "server is shutting down")                                        \
    X(INTERNAL, -27, "internal error")

typedef enum dq_error {
#define DQ__ERR_ENUM(name, value, msg) DQ_##name = value,
    DQ_ERRNO_MAP(DQ__ERR_ENUM)
#undef DQ__ERR_ENUM
} dq_error;

/* A static, human-readable message for an error code ("unknown error" for others). */
DQ_API const char *dq_strerror(int err);
/* The code's name without prefix, e.g. "NONFINITE" ("UNKNOWN" for others). */
DQ_API const char *dq_err_name(int err);

#ifdef __cplusplus
}
#endif
#endif
