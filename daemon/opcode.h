/* dquantd request kinds, as counted in metrics and dispatched by ops. The values follow the
 * Request oneof of proto/dquant.proto, so a body case converts directly. */
#ifndef DQD_OPCODE_H
#define DQD_OPCODE_H

typedef enum dqd_op {
    DQD_OP_UNKNOWN = 0,
    DQD_OP_HELLO = 1,
    DQD_OP_REGISTER_MODEL = 2,
    DQD_OP_PUT = 3,
    DQD_OP_GET = 4,
    DQD_OP_ATTEND = 5,
    DQD_OP_COMPRESS = 6,
    DQD_OP_DECOMPRESS = 7,
    DQD_OP_DELETE = 8,
    DQD_OP_PIN = 9,
    DQD_OP_UNPIN = 10,
    DQD_OP_STATS = 11,
    DQD_OP_PING = 12,
    DQD_OP_NCCL_SETUP = 13,
    DQD_OP_PUT_CHUNKS = 14,
    DQD_OP_LOOKUP = 15,
    DQD_OP_PUT_RAW = 16,
    DQD_OP_PUT_CHUNKS_RAW = 17,
    DQD_OP_UNREGISTER_MODEL = 18,
    DQD_OP_COUNT
} dqd_op;

static inline const char *dqd_op_name(dqd_op op)
{
    static const char *const names[DQD_OP_COUNT] = {
        "unknown",
        "hello",
        "register_model",
        "put",
        "get",
        "attend",
        "compress",
        "decompress",
        "delete",
        "pin",
        "unpin",
        "stats",
        "ping",
        "nccl_setup",
        "put_chunks",
        "lookup",
        "put_raw",
        "put_chunks_raw",
        "unregister_model",
    };
    return (unsigned)op < DQD_OP_COUNT ? names[op] : "unknown";
}

#endif
