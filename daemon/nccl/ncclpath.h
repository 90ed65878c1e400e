/* dquantd NCCL data path: one two-rank communicator per client connection that asked for it
 * (NCCL_SETUP), carrying the tensors of PUT / ATTEND requests and of GET / ATTEND replies between
 * the client's GPU and the daemon's (proto/dquant.proto, "NCCL data path").
 *
 * A channel belongs to its connection and runs a thread of its own: it joins the communicator
 * (rank 0, non-blocking, so that every wait can be bounded), then runs the transfers the loop
 * hands it, one at a time, polling each for completion, for an asynchronous NCCL error, for the
 * deadline (nccl_timeout_ms plus 1 s per GB) and for the connection going away. Any of those but
 * completion aborts the communicator (ncclCommAbort) and breaks the channel: the transfer's request
 * fails, later NCCL requests fail with DQ_IO until the client sets NCCL up again, and the socket
 * path is untouched.
 *
 * Requests that use the channel are admitted one at a time, in arrival order (the client issues
 * its sends and receives in that order): an admitted request first receives its NCCL payload into
 * device memory (or, for ATTEND, which works on host copies of its small tensors, into device
 * memory and then to the host), then runs its operation; a reply with NCCL tensors is sent after
 * the reply frame has been queued, and only then is the next request admitted.
 *
 * Everything here but the channel thread runs on the loop thread. Without NCCL at build time
 * (ncclpath_none.c) HELLO does not offer "nccl", NCCL_SETUP fails with DQ_UNSUPPORTED and no channel
 * ever exists. */
#ifndef DQD_NCCLPATH_H
#define DQD_NCCLPATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "request.h"
#include "validate.h"

typedef struct dqd_nchan dqd_nchan;
typedef struct dqd_ctx dqd_ctx;

/* Whether this daemon offers the NCCL data path (built with NCCL, cuda backend running). */
bool dqd_nccl_offered(const dqd_ctx *ctx);

/* NCCL_SETUP on req's connection: replaces any channel it had, replies with the unique id. */
void dqd_op_nccl_setup(dqd_req *req);

/* Admits a request that uses NCCL (nccl_payload or nccl_reply); once its NCCL payload (if any)
 * has arrived, run(req) runs the operation. Fails the request when the connection has no working
 * channel. */
void dqd_nccl_admit(dqd_req *req, void (*run)(dqd_req *req));

/* The reply of an admitted request is ready (the connection's req->on_done calls this with
 * req->nccl_reply, before it queues the reply frame): sends buf (len bytes, the tensors
 * tiling it, in offset order, one ncclSend each: segs) after it, taking ownership of buf (device
 * memory when on_device, else malloc'd host memory). NULL buf / 0 len: nothing to send. Then the
 * next request is admitted. */
void dqd_nccl_release(dqd_req *req, void *buf, bool on_device, uint64_t len, dqd_seg *segs, size_t nseg);

/* Frees a received NCCL payload (device memory) of a request. */
void dqd_nccl_free_payload(dqd_ctx *ctx, void *dev);

/* A request with an NCCL payload failed before its bytes were received: the client's sends are
 * pending, so the channel is out of step and is marked broken (the client aborts its side when it
 * sees the error). */
void dqd_nccl_break(dqd_session *c);

/* The connection is going away: aborts what is in flight, fails the requests still waiting, and
 * lets the channel free itself once its thread has stopped. */
void dqd_nccl_conn_closed(dqd_session *c);

#endif
