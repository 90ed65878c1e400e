#include "amplify.h"

#include <stdlib.h>

#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/profile.h"
#include "wire.h"

uint8_t *amplify_decompress_frame(uint32_t kv_heads, uint64_t id, size_t *frame_len, size_t *reply_bytes,
                                  size_t *record_bytes)
{
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = kv_heads;
    pp.head_dim = 1024;
    pp.levels[0] = pp.levels[1] = 3;
    pp.alpha = 8.0f;
    dq_profile prof;
    int rc = DQ_CONTAINER_TOO_SMALL;
    for (uint32_t cb = 8; rc == DQ_CONTAINER_TOO_SMALL && cb < 65536; cb += 4) {
        pp.container_bytes[0] = pp.container_bytes[1] = cb;
        rc = dq_profile_make(&pp, &prof);
    }
    dq_codec *codec = NULL;
    dq_workspace *ws = NULL;
    if (rc < 0 || dq_codec_create(&prof, NULL, &codec) < 0 || dq_workspace_create(codec, &ws) < 0) {
        dq_codec_free(codec);
        return NULL;
    }
    const size_t n = dq_codec_stream_len(codec), rb = dq_codec_record_bytes(codec, DQ_KIND_V);
    float *x = calloc(n, sizeof *x);
    uint8_t *rec = calloc(1, rb), *f = NULL;
    uint8_t pbytes[DQ_PROFILE_SERIALIZED_MAX];
    size_t plen;
    if (x && rec && dq_tokens_encode(codec, ws, DQ_KIND_V, x, DQ_DTYPE_F32, 1, NULL, rec, rb, NULL) >= 0 &&
        dq_profile_serialize(&prof, pbytes, sizeof pbytes, &plen) >= 0) {
        wire_payload pl = {0};
        Dquant__Tensor tr;
        uint64_t shape[1] = {rb};
        wire_tensor(&pl, &tr, DQUANT__DTYPE__RAW, shape, 1, rec, rb);
        Dquant__Decompress dm = DQUANT__DECOMPRESS__INIT;
        dm.profile.data = pbytes;
        dm.profile.len = plen;
        dm.kind = 1;
        dm.tokens = 1;
        dm.records = &tr;
        dm.out_dtype = DQUANT__DTYPE__F32;
        Dquant__Request req = DQUANT__REQUEST__INIT;
        req.body_case = DQUANT__REQUEST__BODY_DECOMPRESS;
        req.decompress = &dm;
        f = wire_frame(&req, pl.p, pl.len, id, frame_len);
        wire_payload_free(&pl);
        *reply_bytes = n * sizeof(float);
        *record_bytes = rb;
    }
    free(x);
    free(rec);
    dq_workspace_free(ws);
    dq_codec_free(codec);
    return f;
}
