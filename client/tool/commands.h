/* dquant command-line tool: one entry point per subcommand.
 *
 * Each takes the arguments after the program name (argv[0] is the subcommand's name), parses its
 * own options (--help prints its manual page to stdout) and returns the process exit status:
 * 0 success, 1 the operation failed (connection, server error), 2 usage error. */
#ifndef DQUANT_COMMANDS_H
#define DQUANT_COMMANDS_H

/* client/tool/cmd_ops.c */
int dq_cmd_register(int argc, char **argv);
int dq_cmd_unregister(int argc, char **argv);
int dq_cmd_put(int argc, char **argv);
int dq_cmd_get(int argc, char **argv);
int dq_cmd_attend(int argc, char **argv);
int dq_cmd_delete(int argc, char **argv);
int dq_cmd_pin(int argc, char **argv);
int dq_cmd_unpin(int argc, char **argv);
int dq_cmd_stats(int argc, char **argv);
int dq_cmd_ping(int argc, char **argv);
int dq_cmd_lookup(int argc, char **argv);

/* client/tool/cmd_demo.c: the main job (prefill + decode steps through a running daemon) */
int dq_cmd_demo(int argc, char **argv);

/* client/tool/cmd_bench.c */
int dq_cmd_bench(int argc, char **argv);

/* client/tool/cmd_codec.c: `dquant codec` */
int dq_cmd_codec(int argc, char **argv);
/* client/tool/cmd_eval.c: `dquant eval` */
int dq_cmd_eval(int argc, char **argv);

#endif
