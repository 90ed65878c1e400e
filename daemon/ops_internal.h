/* dquantd operation handlers and what they share. Loop thread unless noted. */
#ifndef DQD_OPS_INTERNAL_H
#define DQD_OPS_INTERNAL_H

#include "registry.h"
#include "request.h"
#include "store.h"
#include "validate.h"

void dqd_op_put(dqd_req *req);
void dqd_op_get(dqd_req *req);
void dqd_op_attend(dqd_req *req);
void dqd_op_compress(dqd_req *req);
void dqd_op_decompress(dqd_req *req);

void dqd_model_info_of(const dqd_model *m, dqd_model_info *out);
void dqd_profile_info_of(const dqd_codec *c, dqd_profile_info *out);
/* The sequence a SeqRef names, referenced; NULL if there is none. */
dqd_seq *dqd_ops_lookup(dqd_req *req, const Dquant__SeqRef *ref);

#endif
