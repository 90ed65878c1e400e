/* dquant command-line tool: what the subcommands share — the connection options, number and
 * size parsing, sequence keys, tensor files and random tensors. */
#ifndef DQUANT_CLI_COMMON_H
#define DQUANT_CLI_COMMON_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dquant/client.h"

/* Exit statuses of every subcommand. */
#define CLI_OK 0
#define CLI_FAILED 1
#define CLI_USAGE 2

/* getopt_long codes of the connection options (beyond any short option character). */
enum {
    CLI_OPT_CONNECT = 1000,
    CLI_OPT_SECRET,
    CLI_OPT_SECRET_FILE,
    CLI_OPT_TIMEOUT,
    CLI_OPT_HELP,
    CLI_OPT_FIRST_OWN,   /* subcommands number their own long-only options from here */
};

#define CLI_CONN_LONGOPTS                                           \
    {"connect", required_argument, NULL, CLI_OPT_CONNECT},          \
    {"secret", required_argument, NULL, CLI_OPT_SECRET},            \
    {"secret-file", required_argument, NULL, CLI_OPT_SECRET_FILE},  \
    {"timeout", required_argument, NULL, CLI_OPT_TIMEOUT},          \
    {"help", no_argument, NULL, CLI_OPT_HELP}

/* The manual text of the connection options, for the subcommands' --help. */
#define CLI_CONN_HELP                                                                                 \
    "   --connect ADDR\n"                                                                             \
    "       Daemon address: unix:/path/to/socket or tcp://host:port. Default: $DQUANT_CONNECT if\n"     \
    "       set, else " DQC_DEFAULT_ADDR " (dquantd's default Unix socket; its default TCP\n"             \
    "       listener is " DQC_DEFAULT_TCP ").\n"                                                         \
    "   --secret SECRET, --secret-file FILE\n"                                                        \
    "       Shared secret sent in HELLO (required by TCP listeners of a daemon started with\n"          \
    "       --secret). Default: $DQUANT_SECRET if set. The file form keeps it out of ps.\n"           \
    "   --timeout MS\n"                                                                                \
    "       Connect timeout and longest wait without progress on a request (default 5000 / 60000).\n" \
    "   --help\n"                                                                                      \
    "       Print this manual page and exit.\n"

typedef struct cli_conn {
    const char *addr;
    char *secret;          /* owned */
    size_t secret_len;
    int timeout_ms;        /* 0: library defaults */
} cli_conn;

void cli_conn_init(cli_conn *cc);
void cli_conn_free(cli_conn *cc);
/* Handles one connection option; returns 1 if opt was one (0 on success in *rc), 0 if not. */
int cli_conn_option(cli_conn *cc, int opt, const char *arg, int *rc);
/* Connects and prints the reason on stderr on failure. */
int cli_connect(const cli_conn *cc, const char *prog, dqc_client **out);

/* Prints "dquant SUBCMD: message" to stderr and returns status. */
int cli_error(int status, const char *prog, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prints a failed call: "dquant SUBCMD: what: NAME: message". */
int cli_call_error(const char *prog, const char *what, dqc_client *c, int rc);

/* Strict number parsing (whole string, no sign for unsigned, range checked). 0 or -1. */
int cli_u64(const char *s, uint64_t *out);
int cli_u32(const char *s, uint32_t *out);
int cli_double(const char *s, double *out);
/* "4K", "1M", "2G" (powers of 1024), plain bytes otherwise. */
int cli_size(const char *s, uint64_t *out);
/* "f32", "f16", "bf16" (and their long names). */
int cli_dtype(const char *s, dq_dtype *out);
const char *cli_dtype_name(dq_dtype d);
size_t cli_dtype_size(dq_dtype d);

/* A sequence key from --key TEXT or --key-hex HEX; the buffer is owned by the caller. */
int cli_hex_decode(const char *hex, uint8_t **out, size_t *len);

/* Reads a whole file that must be exactly `expect` bytes (SIZE_MAX: any size; *len set). */
int cli_read_file(const char *path, size_t expect, void **out, size_t *len);
int cli_write_file(const char *path, const void *data, size_t len);

/* Fills count values of dtype with N(0, 1) draws (deterministic in *state). */
void cli_fill_normal(void *dst, dq_dtype dtype, size_t count, uint64_t *state);
/* Converts count values to f32. */
void cli_to_f32(const void *src, dq_dtype dtype, size_t count, float *dst);

/* Monotonic nanoseconds. */
uint64_t cli_now_ns(void);

#endif
