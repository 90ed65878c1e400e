/* Fuzz target: bytes from a client → frame parser → protobuf unpack → request validation.
 *
 * The input is read as a stream of frames (each one parsed, unpacked with the bounded allocator
 * the daemon unpacks every request header with (pbmem.h), validated, then checked against a fixed
 * model and profile the way the daemon does once it has looked them up); the whole input is also unpacked directly as a header message with an empty
 * payload, so mutations of the protobuf reach the validators without a valid frame around them.
 * Built with -fsanitize=fuzzer when the fuzzing option is on; tests/support/fuzz_replay.c runs the corpus in CI. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dquant.pb-c.h"
#include "frame.h"
#include "pbmem.h"
#include "validate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_request(const uint8_t *header, size_t header_len, const uint8_t *payload, uint64_t payload_len)
{
    dqd_pbmem b;
    dqd_pbmem_init(&b, dqd_pbmem_cap(header_len));
    Dquant__Request *req = dquant__request__unpack(&b.a, header_len, header);
    if (!req)
        return;

    dqd_limits lim;
    dqd_limits_default(&lim);
    lim.max_payload = 1u << 20;
    lim.max_batch_items = 64;
    char msg[256];
    dqd_op op = DQD_OP_UNKNOWN;
    /* An NCCL payload is checked by its announced length alone; its bytes never reach a parser. */
    const dqd_payload pl = {payload, payload_len, NULL, req->nccl_payload, false};
    /* the names as the daemon sees them first: on the wire */
    int rc = dqd_validate_strings(&dquant__request__descriptor, header, header_len, msg, sizeof msg);
    if (rc == 0)
        rc = dqd_request_validate(req, &pl, &lim, &op, msg, sizeof msg);

    /* What the daemon checks next, against a model and a profile it found. */
    const dqd_model_info model = {.layers = 4, .q_heads = 8, .kv_heads = 2, .head_dim = 64};
    const dqd_profile_info prof = {
        .kv_heads = 2, .head_dim = 64, .window = 128, .mean_bytes = 130, .record_bytes = {49, 36}};
    if (rc == 0) {
        dqd_tensor a, b2, c;
        uint32_t first, num;
        switch (op) {
        case DQD_OP_PUT:
            (void)dqd_validate_put(req->put, &pl, &model, &a, &b2, msg, sizeof msg);
            break;
        case DQD_OP_PUT_CHUNKS:
            /* chunk_tokens 4 keeps the corpus' chunks small */
            (void)dqd_validate_put_chunks(req->put_chunks, &pl, &model, 4, &a, &b2, msg, sizeof msg);
            break;
        case DQD_OP_PUT_RAW:
        case DQD_OP_PUT_CHUNKS_RAW: {
            const bool one = op == DQD_OP_PUT_RAW;
            Dquant__RawLayer *const *ls = one ? req->put_raw->layers : req->put_chunks_raw->layers;
            const size_t n = one ? req->put_raw->n_layers : req->put_chunks_raw->n_layers;
            dqd_raw_tensors *rt = malloc((n ? n : 1) * sizeof *rt);
            uint64_t tokens;
            if (rt)
                (void)dqd_validate_raw_layers(ls, n, one ? req->put_raw->first_layer : 0, &pl, &model, &prof, rt,
                                              &tokens, msg, sizeof msg);
            free(rt);
            break;
        }
        case DQD_OP_GET:
            (void)dqd_validate_get(req->get, &model, &first, &num, msg, sizeof msg);
            break;
        case DQD_OP_ATTEND:
            for (size_t i = 0; i < req->attend->n_items; i++)
                (void)dqd_validate_attend_item(req->attend->items[i], &pl, &model, &a, &b2, &c, msg, sizeof msg);
            break;
        case DQD_OP_COMPRESS:
            (void)dqd_validate_compress(req->compress, &pl, &prof, &a, msg, sizeof msg);
            break;
        case DQD_OP_DECOMPRESS:
            (void)dqd_validate_decompress(req->decompress, &pl, &prof, &a, &b2, msg, sizeof msg);
            break;
        default:
            break;
        }
    }
    dquant__request__free_unpacked(req, &b.a);
    if (b.used != 0)
        abort(); /* every byte protobuf-c allocated must come back */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const dq_frame_limits lim = {.max_header = 1u << 16, .max_payload = 1u << 20};
    size_t off = 0;
    while (off < size) {
        dq_frame f;
        size_t consumed = 0;
        int err = 0;
        dq_frame_status st = dq_frame_parse(data + off, size - off, &lim, &f, &consumed, &err);
        if (st != DQ_FRAME_OK)
            break;
        if (consumed == 0 || consumed > size - off)
            abort(); /* the parser must never claim bytes it was not given */
        check_request(f.header, f.hdr.header_len, f.payload, f.hdr.payload_len);
        off += consumed;
    }
    if (size <= (1u << 16))
        check_request(data, size, NULL, 0);
    return 0;
}
