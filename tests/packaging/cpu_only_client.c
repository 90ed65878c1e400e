/* A CPU-only engine process linking libdquant-client through pkg-config: it must compile, link and
 * run with nothing of CUDA or NCCL around. Connecting to a socket that does not exist fails with
 * DQ_CONNECTION and no handle. */
#include <stdio.h>

#include <dquant/client.h>

int main(void)
{
    dqc_options o;
    dqc_options_default(&o);
    o.connect_timeout_ms = 1000;
    o.auto_reconnect = 0;
    dqc_client *c = NULL;
    char err[256];
    int rc = dqc_connect_ex("unix:/nonexistent/dquant-packaging-test.sock", &o, &c, err, sizeof err);
    printf("libdquant-client %s: dqc_connect_ex -> %s (%s)\n", dqc_version(), dqc_err_name(rc), err);
    if (rc != DQ_CONNECTION || c != NULL) {
        fprintf(stderr, "expected DQ_CONNECTION and no handle\n");
        dqc_free(c);
        return 1;
    }
    return 0;
}
