/* dquantd operations: route a parsed request to its handler. Loop thread. */
#ifndef DQD_OPS_H
#define DQD_OPS_H

#include "request.h"

/* Checks authentication and the request's self-consistency, then runs it. The handler finishes
 * the request (now, or later from worker completions). */
void dqd_ops_dispatch(dqd_req *req);

#endif
