// Multi-head Latent Attention (DeepSeek-V2/V3) over a compressed KV cache.
//
// Per token the cache holds one row: the normalised latent c_kv
// (kv_lora_rank) followed by the roped shared key part k_pe
// (qk_rope_head_dim). Keys and values are never expanded: the key half of
// kv_b_proj (W_UK, per head [nope, kv_lora]) is absorbed into the query,
// q_lat = W_UK^T q_nope, so a head's score is q_lat . c_kv + q_pe . k_pe,
// exactly q_nope . (W_UK c_kv) + q_pe . k_pe; the attention output over the
// latent (V = c_kv, the row's first kv_lora_rank channels) is expanded by the
// value half (W_UV, per head [v, kv_lora]) before o_proj. The attention op
// thus runs as multi-query attention with one KV head of size
// kv_lora_rank + qk_rope_head_dim shared by every query head, for prefill,
// chunked prefill and decode alike.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/forward_inputs.h"

namespace deepinfer::layers {

struct MlaShape {
  int32_t n_heads = 0;
  int32_t q_lora_rank = 0;  // 0 = plain q projection
  int32_t kv_lora_rank = 0;
  int32_t nope_dim = 0;  // qk_nope_head_dim
  int32_t rope_dim = 0;  // qk_rope_head_dim
  int32_t v_dim = 0;     // v_head_dim
  float rms_eps = 1e-6f;

  int64_t q_dim() const { return int64_t{n_heads} * (nope_dim + rope_dim); }
  int64_t cache_row() const { return int64_t{kv_lora_rank} + rope_dim; }
};

struct MlaWeights {
  // Device backends stack the two projections of h (wq or wq_a, then wkv_a)
  // into one matrix, so a decode step reads them in one product; then the
  // separate matrices below are undefined. b_in: their biases (optional).
  Tensor w_in, b_in;
  Tensor wq;                        // [heads * (nope + rope), hidden] without q_lora
  Tensor wq_a, bq_a, q_a_norm, wq_b;  // [q_lora, hidden], f32[q_lora] (optional), f32[q_lora], [q dim, q_lora]
  Tensor wkv_a, bkv_a;              // [kv_lora + rope, hidden], optional f32 bias
  Tensor kv_a_norm;                 // f32[kv_lora]
  Tensor w_uk_t;                    // [heads, kv_lora, nope]: W_UK per head, transposed for linear
  Tensor wkv_b;                     // kv_b_proj [heads * (nope + v), kv_lora]; each head's v rows are W_UV
  Tensor wo, bo;                    // [hidden, heads * v], optional f32 bias
};

// Activation buffers for n tokens (views into the model's workspace).
struct MlaScratch {
  Tensor in;     // [n, q_in + kv_lora + rope]: q_a (or q) and kv_a are its column views
  Tensor q_a;    // [n, q_lora] (q_lora only)
  Tensor q;      // [n, q_dim]
  Tensor kv_a;   // [n, kv_lora + rope]: the cache row, built in place
  Tensor q_att;  // [n, heads * (kv_lora + rope)]: absorbed queries
  Tensor o_lat;  // [n, heads * kv_lora]
  Tensor o;      // [n, heads * v]
};

// The transposed key half of kv_b_proj [heads * (nope + v), kv_lora] as
// [heads, kv_lora, nope] in kv_b's float dtype (bytes of a host tensor).
std::vector<uint8_t> absorbed_key_weights(const Tensor& kv_b, const MlaShape& shape);

// out[n, hidden] = mla(h[n, hidden]); writes this step's rows into cache
// (a latent cache: v a view of k's first kv_lora_rank channels).
void mla_layer(Backend& backend, const MlaWeights& w, const MlaShape& shape, const RopeParams& rope,
               const AttentionParams& params, const Tensor& h, const ForwardInputs& inputs,
               const KvGroupInputs& kv_in, const KvCacheLayer& cache, const MlaScratch& scratch, Tensor out);

}  // namespace deepinfer::layers
