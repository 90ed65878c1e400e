/* dquantd without NCCL: the data path is not offered (see ncclpath.h). */
#include "ncclpath.h"

#include <stdlib.h>

#include "ctx.h"
#include "dquant/error.h"

bool dqd_nccl_offered(const dqd_ctx *ctx)
{
    (void)ctx;
    return false;
}

void dqd_op_nccl_setup(dqd_req *req)
{
    dqd_req_fail(req, DQ_UNSUPPORTED, "this dquantd was built without NCCL");
}

void dqd_nccl_admit(dqd_req *req, void (*run)(dqd_req *req))
{
    (void)run;
    dqd_req_fail(req, DQ_IO, "this dquantd was built without NCCL: no request can use it");
}

void dqd_nccl_release(dqd_req *req, void *buf, bool on_device, uint64_t len, dqd_seg *segs, size_t nseg)
{
    (void)req, (void)on_device, (void)len, (void)nseg;
    free(buf);
    free(segs);
}

void dqd_nccl_free_payload(dqd_ctx *ctx, void *dev)
{
    (void)ctx, (void)dev;
}

void dqd_nccl_break(dqd_session *c)
{
    (void)c;
}

void dqd_nccl_conn_closed(dqd_session *c)
{
    (void)c;
}
