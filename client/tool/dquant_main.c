/* dquant: the command-line tool of dquant. Dispatches `dquant SUBCOMMAND [OPTIONS]`. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "dquant/client.h"

typedef struct subcmd {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} subcmd;

static const subcmd subcmds[] = {
    {"register", dq_cmd_register, "register a model (shape and codec profile)"},
    {"unregister", dq_cmd_unregister, "remove a model no sequence uses"},
    {"put", dq_cmd_put, "append K/V tokens to a sequence"},
    {"get", dq_cmd_get, "read tokens back, decompressed or as raw containers"},
    {"attend", dq_cmd_attend, "decode attention on the compressed cache (batched)"},
    {"delete", dq_cmd_delete, "delete a sequence"},
    {"pin", dq_cmd_pin, "protect a sequence from eviction"},
    {"unpin", dq_cmd_unpin, "make a sequence evictable again"},
    {"stats", dq_cmd_stats, "print the daemon's counters and gauges"},
    {"ping", dq_cmd_ping, "check that the daemon answers; round-trip times"},
    {"lookup", dq_cmd_lookup, "leading chunks of a prompt the shared KV tier holds"},
    {"bench", dq_cmd_bench, "load generator: N connections x M requests, latency percentiles"},
    {"demo", dq_cmd_demo, "the main job: a real prefill and decode steps through the daemon"},
    {"codec", dq_cmd_codec, "run the codec locally (libdquant) on given data"},
    {"eval", dq_cmd_eval, "codec quality on given data"},
};

static void usage(FILE *out)
{
    fprintf(out,
            "NAME\n"
            "       dquant - client of the dquantd KV-cache compression daemon\n"
            "\n"
            "SYNOPSIS\n"
            "       dquant SUBCOMMAND [OPTIONS]\n"
            "       dquant SUBCOMMAND --help\n"
            "       dquant --help | --version\n"
            "\n"
            "DESCRIPTION\n"
            "       Talks to dquantd over its Unix socket or TCP with libdquant-client. Every subcommand\n"
            "       that reaches the daemon takes --connect ADDR (unix:/path or tcp://host:port; default\n"
            "       $DQUANT_CONNECT, else %s; the daemon's default TCP listener is\n"
            "       %s) and --secret / --secret-file for daemons that require one.\n"
            "\n"
            "SUBCOMMANDS\n",
            DQC_DEFAULT_ADDR, DQC_DEFAULT_TCP);
    for (size_t i = 0; i < sizeof subcmds / sizeof subcmds[0]; i++)
        fprintf(out, "   %-9s %s\n", subcmds[i].name, subcmds[i].summary);
    fprintf(out, "\n"
                 "ENVIRONMENT\n"
                 "   DQUANT_CONNECT   default daemon address\n"
                 "   DQUANT_SECRET    default shared secret\n"
                 "\n"
                 "EXIT STATUS\n"
                 "       0 on success, 1 when an operation failed, 2 on a usage error.\n"
                 "\n"
                 "EXAMPLES\n"
                 "       dquant ping\n"
                 "       dquant register --model m --layers 32 --q-heads 32 --kv-heads 8 --head-dim 128\n"
                 "       dquant put --model m --key req-1 --layers 32 --tokens 512 --random 1\n"
                 "       dquant attend --key req-1 --layer 0 --random 2\n"
                 "       dquant bench --connections 2 --requests 1000 --mix put=20,get=40,attend=40\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        if (argc > 2 && strcmp(cmd, "help") == 0) {
            for (size_t i = 0; i < sizeof subcmds / sizeof subcmds[0]; i++)
                if (strcmp(argv[2], subcmds[i].name) == 0) {
                    char *av[] = {argv[2], (char *)"--help", NULL};
                    return subcmds[i].fn(2, av);
                }
        }
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("dquant (libdquant-client %s)\n", dqc_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof subcmds / sizeof subcmds[0]; i++)
        if (strcmp(cmd, subcmds[i].name) == 0)
            return subcmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dquant: unknown subcommand '%s' (see dquant --help)\n", cmd);
    return 2;
}
