/* dquant command-line tool: what the subcommands share — the connection options, option tables,
 * number and size parsing, sequence keys, tensor files and random tensors. */
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
    CLI_OPT_CLIENT_NAME,
    CLI_OPT_HELP,
    CLI_OPT_FIRST_OWN, /* subcommands number their own long-only options from here */
};

/* a braced list inside a macro, one option a line */
// clang-format off
#define CLI_CONN_LONGOPTS                                           \
    {"connect", required_argument, NULL, CLI_OPT_CONNECT},          \
    {"secret", required_argument, NULL, CLI_OPT_SECRET},            \
    {"secret-file", required_argument, NULL, CLI_OPT_SECRET_FILE},  \
    {"timeout", required_argument, NULL, CLI_OPT_TIMEOUT},          \
    {"client-name", required_argument, NULL, CLI_OPT_CLIENT_NAME},  \
    {"help", no_argument, NULL, CLI_OPT_HELP}
// clang-format on

/* The manual text of the connection options, for the subcommands' --help. */
#define CLI_CONN_HELP                                                                                 \
    "   --connect ADDR\n"                                                                             \
    "       Daemon address: unix:/path/to/socket or tcp://host:port. Default: $DQUANT_CONNECT if\n"   \
    "       set, else " DQC_DEFAULT_ADDR " (dquantd's default Unix socket; its default TCP\n"         \
    "       listener is " DQC_DEFAULT_TCP ").\n"                                                      \
    "   --secret SECRET, --secret-file FILE\n"                                                        \
    "       Shared secret sent in HELLO (required by TCP listeners of a daemon started with\n"        \
    "       --secret). Default: $DQUANT_SECRET if set. The file form keeps it out of ps.\n"           \
    "   --timeout MS\n"                                                                               \
    "       Connect timeout and longest wait without progress on a request (default 5000 / 60000).\n" \
    "   --client-name NAME\n"                                                                         \
    "       Name sent in HELLO (default: dquant); dquantd counts models per client name.\n"           \
    "   --help\n"                                                                                     \
    "       Print this manual page and exit.\n"

typedef struct cli_conn {
    const char *addr;
    char *secret; /* owned */
    size_t secret_len;
    int timeout_ms;          /* 0: library defaults */
    const char *client_name; /* HELLO's; NULL: "dquant" */
} cli_conn;

void cli_conn_init(cli_conn *cc);
void cli_conn_free(cli_conn *cc);
/* Handles one connection option; returns 1 if opt was one (0 on success in *rc), 0 if not. */
int cli_conn_option(cli_conn *cc, int opt, const char *arg, int *rc);
/* Connects and prints the reason on stderr on failure. */
int cli_connect(const cli_conn *cc, const char *prog, dqc_client **out);

/* ---- option tables ----
 *
 * A subcommand lists its own options in a table (ended by CLI_OPT_END) and cli_parse (or
 * cli_parse_local) reads argv with getopt_long against the table, each option in the order given:
 *
 *     const cli_opt opts[] = {
 *         CLI_STR("model", &spec.name),
 *         CLI_U32("layers", &spec.layers, 1),
 *         CLI_OPT_END,
 *     };
 *     int status = cli_parse(argc, argv, "register", register_help, opts, &cc);
 *     if (status != CLI_CONTINUE)
 *         return status; */

/* How an option's value is read into *dst. */
typedef enum cli_arg {
    CLI_ARG_FLAG,  /* no value: int, set to 1 */
    CLI_ARG_STR,   /* const char *: the value itself */
    CLI_ARG_U32,   /* uint32_t: a whole number in [min, max] (cli_u32) */
    CLI_ARG_U64,   /* uint64_t: a whole number in [min, max] (cli_u64) */
    CLI_ARG_SIZE,  /* uint64_t: bytes with an optional K/M/G/T suffix, in [min, max] (cli_size) */
    CLI_ARG_DTYPE, /* dq_dtype: a name dq_dtype_parse knows (f32, f16, bf16, ...) */
    CLI_ARG_FN,    /* fn(dst, value) */
} cli_arg;

typedef struct cli_opt {
    const char *name; /* long name without the dashes; NULL ends a table */
    cli_arg arg;
    void *dst;
    uint64_t min, max; /* the numbers' accepted range */
    /* CLI_ARG_FN: 0 when stored; 1 for a bad value (cli_parse says so); -1 when it said why itself. */
    int (*fn)(void *dst, const char *value);
    int *given; /* optional: set to 1 when the option is given */
} cli_opt;

/* dst as a void pointer, after the compiler has checked that it points to a T. */
#define CLI_DST(T, p) ((void *)(1 ? (p) : (T *)0))

/* Table entries: NAME is the long name, P where the value goes, LO/HI the least/greatest number. */
#define CLI_FLAG(name_, p)                                           \
    {                                                                \
        .name = (name_), .arg = CLI_ARG_FLAG, .dst = CLI_DST(int, p) \
    }
#define CLI_STR(name_, p)                                                    \
    {                                                                        \
        .name = (name_), .arg = CLI_ARG_STR, .dst = CLI_DST(const char *, p) \
    }
#define CLI_U32(name_, p, lo)                                                                            \
    {                                                                                                    \
        .name = (name_), .arg = CLI_ARG_U32, .dst = CLI_DST(uint32_t, p), .min = (lo), .max = UINT32_MAX \
    }
#define CLI_U64(name_, p, lo)                                                                            \
    {                                                                                                    \
        .name = (name_), .arg = CLI_ARG_U64, .dst = CLI_DST(uint64_t, p), .min = (lo), .max = UINT64_MAX \
    }
/* A whole number that also sets *given_ when it appears (a seed whose presence matters). */
#define CLI_U64_GIVEN(name_, p, given_)                                                                        \
    {                                                                                                          \
        .name = (name_), .arg = CLI_ARG_U64, .dst = CLI_DST(uint64_t, p), .max = UINT64_MAX, .given = (given_) \
    }
#define CLI_SIZE(name_, p, hi)                                                         \
    {                                                                                  \
        .name = (name_), .arg = CLI_ARG_SIZE, .dst = CLI_DST(uint64_t, p), .max = (hi) \
    }
#define CLI_DTYPE(name_, p)                                                \
    {                                                                      \
        .name = (name_), .arg = CLI_ARG_DTYPE, .dst = CLI_DST(dq_dtype, p) \
    }
#define CLI_DTYPE_GIVEN(name_, p, given_)                                                     \
    {                                                                                         \
        .name = (name_), .arg = CLI_ARG_DTYPE, .dst = CLI_DST(dq_dtype, p), .given = (given_) \
    }
#define CLI_FN(name_, fn_, p)                                       \
    {                                                               \
        .name = (name_), .arg = CLI_ARG_FN, .dst = (p), .fn = (fn_) \
    }
#define CLI_OPT_END  \
    {                \
        .name = NULL \
    }

/* cli_parse's "every option is stored, go on". */
#define CLI_CONTINUE (-1)

/* The daemon subcommands: parses argv (argv[0] the subcommand's name) against opts, the connection
 * options (into cc, required) and --help. Returns CLI_CONTINUE when every option was stored and no argument
 * is left over; otherwise the exit status to return now: CLI_OK after printing help to stdout,
 * CLI_USAGE after saying what was wrong on stderr (getopt's words for an unknown option, "dquant
 * PROG: --NAME: bad value 'V' (see --help)" for a bad value). On CLI_USAGE some values may already
 * be stored. */
int cli_parse(int argc, char **argv, const char *prog, const char *help, const cli_opt *opts, cli_conn *cc);
/* The in-process subcommands (`dquant codec ...`, `dquant eval`): the same against opts and --help
 * only, in their own words ("dquant PROG: unknown or incomplete option '--X' (see dquant PROG
 * --help)", "dquant PROG: bad --NAME 'V'", with the accepted names of a dtype or the least number
 * when above 1). Arguments left over are the caller's: they start at optind. */
int cli_parse_local(int argc, char **argv, const char *prog, const char *help, const cli_opt *opts);

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

/* A sequence key from --key TEXT or --key-hex HEX; the buffer is owned by the caller. */
int cli_hex_decode(const char *hex, uint8_t **out, size_t *len);

/* Reads a whole file that must be exactly `expect` bytes (SIZE_MAX: any size; *len set), saying
 * what went wrong on stderr. 0 or -1; *out is the caller's to free. */
int cli_read_file(const char *path, size_t expect, void **out, size_t *len);
/* Reads a whole file of any size and says nothing: 0, or a negative errno (fopen's, -ENOMEM,
 * -EIO). On success *buf (the caller's to free) holds *len bytes. */
int cli_slurp(const char *path, void **buf, size_t *len);
int cli_write_file(const char *path, const void *data, size_t len);

/* Fills count values of dtype with N(0, 1) draws (deterministic in *state). */
void cli_fill_normal(void *dst, dq_dtype dtype, size_t count, uint64_t *state);
/* Converts count values to f32. */
void cli_to_f32(const void *src, dq_dtype dtype, size_t count, float *dst);

/* Monotonic nanoseconds. */
uint64_t cli_now_ns(void);
/* Seconds since t0_ns (a cli_now_ns reading). */
double cli_seconds_since(uint64_t t0_ns);

#endif
