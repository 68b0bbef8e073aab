// Self-attention sub-layer of a dense decoder: projections, optional q/k
// RMSNorm, rotary embedding, KV-cache write, paged attention, output projection.
#pragma once

#include "backend/backend.h"
#include "model/forward_inputs.h"

namespace deepinfer::layers {

struct AttentionWeights {
  Tensor wq, wk, wv, wo;  // [out, in]
  Tensor bq, bk, bv;      // optional f32 biases (Qwen2)
  Tensor bo;              // optional f32 output projection bias (gpt-oss)
  // Optional: wq, wk and wv stacked into one matrix (and their biases), so a
  // decode step streams them in one product; used instead of the three.
  Tensor wqkv, bqkv;
  Tensor q_norm, k_norm;  // optional f32[head_dim] (Qwen3, Gemma 3)
};

struct AttentionShape {
  int32_t n_heads_q = 0;
  int32_t n_heads_kv = 0;
  int32_t head_dim = 0;
  float rms_eps = 1e-6f;
  float norm_weight_offset = 0.0f;
};

// Activation buffers sized for the step's token count (views into the model's workspace).
struct AttentionScratch {
  Tensor q;    // [n, n_heads_q * head_dim]
  Tensor k;    // [n, n_heads_kv * head_dim]
  Tensor v;    // [n, n_heads_kv * head_dim]
  Tensor out;  // [n, n_heads_q * head_dim]
  // With fused weights: [n, (n_heads_q + 2 n_heads_kv) * head_dim]; q, k and
  // v are then column ranges of it.
  Tensor qkv;
};

// out[n, hidden] = attention(h[n, hidden]).
void attention_layer(Backend& backend, const AttentionWeights& w, const AttentionShape& shape,
                     const RopeParams& rope, const AttentionParams& params, const Tensor& h,
                     const ForwardInputs& inputs, const KvGroupInputs& kv_in, const KvCacheLayer& cache,
                     const AttentionScratch& scratch, Tensor out);

}  // namespace deepinfer::layers
