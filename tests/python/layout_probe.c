/* Prints sizeof and the field offsets of every C struct the Python binding mirrors with ctypes
 * (client/python/dquant/client.py, codec.py), one "name value" a line; test_package.py compares
 * them with the ctypes classes, so a field added in a header fails the Python tests instead of
 * corrupting memory. */
#include <stddef.h>
#include <stdio.h>

#include "dquant/attention.h"
#include "dquant/client.h"
#include "dquant/codec.h"
#include "dquant/profile.h"

#define SIZE(T) printf("%s %zu\n", #T, sizeof(T))
#define OFF(T, f) printf("%s.%s %zu\n", #T, #f, offsetof(T, f))

int main(void)
{
    SIZE(dqc_cluster_options);
    OFF(dqc_cluster_options, node);
    OFF(dqc_cluster_options, replicas);
    OFF(dqc_cluster_options, dns_server);
    OFF(dqc_cluster_options, repair);
    SIZE(dqc_cluster_member_info);
    OFF(dqc_cluster_member_info, up);
    OFF(dqc_cluster_member_info, requests);
    SIZE(dqc_cluster_stats);
    OFF(dqc_cluster_stats, member_changes);
    SIZE(dqc_options);
    OFF(dqc_options, client_name);
    OFF(dqc_options, secret_len);
    OFF(dqc_options, max_reply_payload);
    OFF(dqc_options, tls_ca);
    OFF(dqc_options, tls_server_name);
    SIZE(dqc_seq);
    OFF(dqc_seq, key_len);
    SIZE(dqc_server_info);
    OFF(dqc_server_info, max_batch_items);
    OFF(dqc_server_info, features);
    SIZE(dqc_model_spec);
    OFF(dqc_model_spec, profile_name);
    OFF(dqc_model_spec, profile_len);
    SIZE(dqc_model_info);
    OFF(dqc_model_info, profile);
    SIZE(dqc_put_args);
    OFF(dqc_put_args, model);
    OFF(dqc_put_args, tokens);
    OFF(dqc_put_args, dtype);
    OFF(dqc_put_args, v);
    SIZE(dqc_put_result);
    SIZE(dqc_get_args);
    OFF(dqc_get_args, start_token);
    OFF(dqc_get_args, dtype);
    SIZE(dqc_get_result);
    OFF(dqc_get_result, k);
    OFF(dqc_get_result, bytes);
    OFF(dqc_get_result, mem_cap_);
    SIZE(dqc_raw_layer);
    OFF(dqc_raw_layer, tokens);
    OFF(dqc_raw_layer, records);
    OFF(dqc_raw_layer, tail_tokens);
    OFF(dqc_raw_layer, tail_bytes);
    SIZE(dqc_raw_result);
    OFF(dqc_raw_result, nlayers);
    OFF(dqc_raw_result, layers);
    OFF(dqc_raw_result, layers_cap_);
    SIZE(dqc_put_raw_args);
    OFF(dqc_put_raw_args, start_token);
    OFF(dqc_put_raw_args, first_layer);
    OFF(dqc_put_raw_args, layers);
    OFF(dqc_put_raw_args, profile_len);
    SIZE(dqc_attend_item);
    OFF(dqc_attend_item, layer);
    OFF(dqc_attend_item, append_v);
    SIZE(dqc_attend_args);
    OFF(dqc_attend_args, q_heads);
    OFF(dqc_attend_args, scale);
    SIZE(dqc_counter);
    SIZE(dqc_gauge);
    SIZE(dqc_stats_result);
    OFF(dqc_stats_result, gauges);
    SIZE(dq_profile);
    OFF(dq_profile, freq);
    OFF(dq_profile, codec_type);
    OFF(dq_profile, rotate);
    SIZE(dq_profile_params);
    OFF(dq_profile_params, rotation_seed);
    OFF(dq_profile_params, name);
    SIZE(dq_encode_stats);
    OFF(dq_encode_stats, max_payload_bytes);
    OFF(dq_encode_stats, max_move);
    SIZE(dq_attn_item);
    OFF(dq_attn_item, lse);
#ifdef DQC_CHUNK_KEY_BYTES /* the shared KV tier's structs, where client.h has them */
    SIZE(dqc_put_chunks_args);
    OFF(dqc_put_chunks_args, parent);
    OFF(dqc_put_chunks_args, chunk_tokens);
    OFF(dqc_put_chunks_args, dtype);
    OFF(dqc_put_chunks_args, v);
    SIZE(dqc_put_chunks_result);
    SIZE(dqc_lookup_result);
    OFF(dqc_lookup_result, chunk_tokens);
#endif
    return 0;
}
