#include "model/layers/attention_layer.h"

#include "ops/ops.h"

namespace deepinfer::layers {

void attention_layer(Backend& backend, const AttentionWeights& w, const AttentionShape& shape,
                     const RopeParams& rope, const AttentionParams& params, const Tensor& h,
                     const ForwardInputs& inputs, const KvGroupInputs& kv_in, const KvCacheLayer& cache,
                     const AttentionScratch& scratch, Tensor out) {
  const int64_t d = shape.head_dim;
  const int64_t q_dim = shape.n_heads_q * d, kv_dim = shape.n_heads_kv * d;
  Tensor q, k, v;
  if (w.wqkv.defined()) {
    ops::linear(backend, h, w.wqkv, w.bqkv, scratch.qkv);
    q = scratch.qkv.narrow(1, 0, q_dim).split_last(shape.n_heads_q, d);
    k = scratch.qkv.narrow(1, q_dim, kv_dim).split_last(shape.n_heads_kv, d);
    v = scratch.qkv.narrow(1, q_dim + kv_dim, kv_dim).split_last(shape.n_heads_kv, d);
  } else {
    ops::linear(backend, h, w.wq, w.bq, scratch.q);
    ops::linear(backend, h, w.wk, w.bk, scratch.k);
    ops::linear(backend, h, w.wv, w.bv, scratch.v);
    q = scratch.q.split_last(shape.n_heads_q, d);
    k = scratch.k.split_last(shape.n_heads_kv, d);
    v = scratch.v.split_last(shape.n_heads_kv, d);
  }
  // Per-head q/k norms (over [n, heads, head_dim] views) go with RoPE.
  const QkNorm qk_norm{w.q_norm, w.k_norm, shape.rms_eps, shape.norm_weight_offset};
  ops::rope_store_kv(backend, q, k, v, inputs.positions, rope, kv_in.slot_mapping, cache,
                     w.q_norm.defined() ? &qk_norm : nullptr);
  Tensor attn = scratch.out.split_last(shape.n_heads_q, d);
  ops::attention(backend, q, cache, kv_in.attention, params, attn);
  ops::linear(backend, scratch.out, w.wo, w.bo, out);
}

}  // namespace deepinfer::layers
