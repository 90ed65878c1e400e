/* dquant eval: a float32 Llama forward for the small real models of ../shared/data, with a KV cache
 * the evaluation can overwrite — the perplexity/KL protocol (eval_ppl.h) replaces the cached keys
 * and values with a codec's reconstruction, as an engine holding a compressed cache would see them.
 *
 * A model folder in Hugging Face layout: config.json (LlamaForCausalLM: hidden_size,
 * intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim
 * (default hidden / heads), rms_norm_eps, rope_theta or rope_parameters.rope_theta (default
 * rope_type only), tie_word_embeddings, vocab_size) and model.safetensors (BF16, F16 or F32
 * tensors, converted to float32 at load). Architecture: token embedding; per layer RMSNorm →
 * q/k/v projections (no bias) → RoPE (rotate-half pairs (i, i + d/2), inv_freq θ^(−2i/d)) on q and
 * k → causal GQA attention (query head h reads KV head h / (heads / kv_heads)) → o projection →
 * residual; RMSNorm → SwiGLU MLP down(silu(gate(x)) · up(x)) → residual; final RMSNorm → lm_head
 * (the embedding when tied). All arithmetic in float32, except that a model whose config.json says
 * dtype (torch_dtype) bfloat16 gets its RoPE inverse frequencies rounded to bfloat16, as
 * `LlamaForCausalLM.from_pretrained(dir)` in the saved dtype holds that buffer: the captured K/V of
 * ../shared/data match that (to fp16 rounding), not float32 frequencies.
 *
 * Research code on libdquant's public API only; not thread-safe per cache (a model may be shared). */
#ifndef DQUANT_EVAL_MODEL_H
#define DQUANT_EVAL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/codec.h"

typedef struct eval_model_config {
    uint32_t layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, max_positions;
    float rms_eps, rope_theta;
    int tied;      /* lm_head is the embedding */
    int rope_bf16; /* RoPE inv_freq rounded to bfloat16: config dtype bfloat16 (see eval_model_load) */
} eval_model_config;

typedef struct eval_model eval_model;

/* Loads dir/config.json and dir/model.safetensors. Returns 0, DQ_NOT_FOUND (a file absent), DQ_IO,
 * DQ_NOMEM, DQ_CORRUPT (malformed JSON or safetensors header: offsets out of the file, sizes that
 * disagree with the shape), DQ_SHAPE (a tensor missing or of the wrong shape for the config),
 * DQ_DTYPE (a tensor dtype other than BF16/F16/F32), DQ_UNSUPPORTED (a config this forward does not
 * implement: rope scaling, biases, another activation); err says which. */
int eval_model_load(const char *dir, eval_model **out, char *err, size_t errlen);
void eval_model_free(eval_model *m);
const eval_model_config *eval_model_cfg(const eval_model *m);
/* Parameters counted once (a tied lm_head not twice). */
uint64_t eval_model_params(const eval_model *m);

/* The KV cache: keys after RoPE and values, float32, [layers][capacity][kv_heads · head_dim];
 * positions 0..len−1 are filled. Callers may overwrite any filled entry (the codec hook): the next
 * forward attends over whatever the arrays hold. */
typedef struct eval_kv_cache {
    uint32_t layers, capacity, len;
    size_t n; /* kv_heads · head_dim */
    float *k, *v;
    /* Certified value skipping (libdquant dquant/vskip.h) in the forward's attention: with
     * 0 < value_mass < 1, positions below `sealed` are the compressed part (the live tokens at and
     * past it always count, as a BF16 tail does), and for each new token and layer the values of a
     * sealed position are summed only when it is in the union over all query heads of each head's
     * smallest set holding value_mass of its softmax mass (dq_vskip_select; no renormalization).
     * vskip_kept / vskip_sealed count the (token, layer, position) pairs kept and sealed. 0: off
     * (init sets it). vskip_codec lends dq_vskip_select its allocator (any codec). */
    double value_mass;
    uint32_t sealed;
    const dq_codec *vskip_codec;
    uint64_t vskip_kept, vskip_sealed;
} eval_kv_cache;

/* Returns 0, DQ_INVALID_ARGUMENT (capacity 0 or above the model's max_positions), DQ_NOMEM. */
int eval_kv_cache_init(const eval_model *m, uint32_t capacity, eval_kv_cache *c);
void eval_kv_cache_free(eval_kv_cache *c);
/* [capacity][n] of one layer. */
float *eval_kv_cache_layer(const eval_kv_cache *c, int values, uint32_t layer);

/* Runs ntok tokens at positions c->len .. c->len + ntok − 1 (teacher-forced, causal: each attends to
 * the cache and to the new tokens before it), appends their K/V to the cache and writes, when not
 * NULL, logits [ntok][vocab] and the post-RoPE queries [layers][ntok][heads · head_dim].
 * Returns 0, DQ_INVALID_ARGUMENT (a token outside the vocabulary, ntok 0), DQ_OUT_OF_BOUNDS (the
 * cache is full), DQ_NOMEM. Deterministic: the same inputs and cache give bit-identical outputs. */
int eval_model_forward(const eval_model *m, eval_kv_cache *c, const int32_t *tokens, uint32_t ntok, float *logits,
                       float *q_out);

#endif
