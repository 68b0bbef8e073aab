#include "model/layers/attention_layer.h"

#include "ops/ops.h"

namespace deepinfer::layers {

void attention_layer(Backend& backend, const AttentionWeights& w, const AttentionShape& shape,
                     const RopeParams& rope, const AttentionParams& params, const Tensor& h,
                     const ForwardInputs& inputs, const KvCacheLayer& cache,
                     const AttentionScratch& scratch, Tensor out) {
  const int64_t n = h.size(0);
  const int64_t d = shape.head_dim;
  ops::linear(backend, h, w.wq, w.bq, scratch.q);
  ops::linear(backend, h, w.wk, w.bk, scratch.k);
  ops::linear(backend, h, w.wv, w.bv, scratch.v);

  Tensor q = scratch.q.reshape({n, shape.n_heads_q, d});
  Tensor k = scratch.k.reshape({n, shape.n_heads_kv, d});
  Tensor v = scratch.v.reshape({n, shape.n_heads_kv, d});
  if (w.q_norm.defined()) {
    Tensor q_rows = scratch.q.reshape({n * shape.n_heads_q, d});
    Tensor k_rows = scratch.k.reshape({n * shape.n_heads_kv, d});
    ops::rms_norm(backend, q_rows, w.q_norm, shape.rms_eps, shape.norm_weight_offset, q_rows);
    ops::rms_norm(backend, k_rows, w.k_norm, shape.rms_eps, shape.norm_weight_offset, k_rows);
  }
  ops::rope(backend, q, k, inputs.positions, rope);
  ops::store_kv(backend, k, v, inputs.slot_mapping, cache);
  Tensor attn = scratch.out.reshape({n, shape.n_heads_q, d});
  ops::attention(backend, q, cache, inputs.attention, params, attn);
  ops::linear(backend, scratch.out, w.wo, w.bo, out);
}

}  // namespace deepinfer::layers
