#include "model/layers/mla_layer.h"

#include <cstring>

#include "core/error.h"
#include "ops/ops.h"

namespace deepinfer::layers {

std::vector<uint8_t> absorbed_key_weights(const Tensor& kv_b, const MlaShape& s) {
  const int64_t rows_per_head = int64_t{s.nope_dim} + s.v_dim, lora = s.kv_lora_rank;
  DI_CHECK(kv_b.ndim() == 2 && kv_b.size(0) == s.n_heads * rows_per_head && kv_b.size(1) == lora &&
               kv_b.is_contiguous(),
           "kv_b_proj {} must be a contiguous [{}, {}]", kv_b.describe(), s.n_heads * rows_per_head, lora);
  DI_CHECK(kv_b.dtype() == DType::F32 || kv_b.dtype() == DType::F16 || kv_b.dtype() == DType::BF16,
           "kv_b_proj {}: only float weights can be absorbed", kv_b.describe());
  const size_t es = row_bytes(kv_b.dtype(), 1);
  std::vector<uint8_t> out(static_cast<size_t>(s.n_heads) * lora * s.nope_dim * es);
  const auto* src = static_cast<const uint8_t*>(kv_b.data());
  for (int64_t h = 0; h < s.n_heads; ++h) {
    for (int64_t i = 0; i < s.nope_dim; ++i) {
      const uint8_t* row = src + ((h * rows_per_head + i) * lora) * es;
      for (int64_t j = 0; j < lora; ++j) {
        std::memcpy(out.data() + ((h * lora + j) * s.nope_dim + i) * es, row + j * es, es);
      }
    }
  }
  return out;
}

void mla_layer(Backend& backend, const MlaWeights& w, const MlaShape& s, const RopeParams& rope,
               const AttentionParams& params, const Tensor& h, const ForwardInputs& inputs, const KvCacheLayer& cache,
               const MlaScratch& scratch, Tensor out) {
  const int64_t heads = s.n_heads, lora = s.kv_lora_rank, nope = s.nope_dim, rot = s.rope_dim, vd = s.v_dim;
  const int64_t qk = nope + rot, row = lora + rot;
  const Tensor none;
  if (w.wq_a.defined()) {
    ops::linear(backend, h, w.wq_a, w.bq_a, scratch.q_a);
    ops::rms_norm(backend, scratch.q_a, w.q_a_norm, s.rms_eps, 0.0f, scratch.q_a);
    ops::linear(backend, scratch.q_a, w.wq_b, none, scratch.q);
  } else {
    ops::linear(backend, h, w.wq, none, scratch.q);
  }
  ops::linear(backend, h, w.wkv_a, w.bkv_a, scratch.kv_a);
  const Tensor latent = scratch.kv_a.narrow(1, 0, lora);
  ops::rms_norm(backend, latent, w.kv_a_norm, s.rms_eps, 0.0f, latent);

  // The rope halves: each head's q_pe moves to the tail of its absorbed query
  // and is rotated there together with the token's shared k_pe.
  const Tensor q_att = scratch.q_att.reshape({scratch.q_att.size(0), heads, row});
  const Tensor k_row = scratch.kv_a.reshape({scratch.kv_a.size(0), 1, row});
  // As [tokens * heads] rows: one strided 2-D copy on device backends.
  const int64_t n_rows = scratch.q.size(0) * heads;
  ops::copy(backend, scratch.q_att.reshape({n_rows, row}).narrow(1, lora, rot),
            scratch.q.reshape({n_rows, qk}).narrow(1, nope, rot));
  ops::rope(backend, q_att.narrow(2, lora, rot), k_row.narrow(2, lora, rot), inputs.positions, rope);
  ops::linear_batched(backend, scratch.q.split_last(heads, qk).narrow(2, 0, nope), w.w_uk_t,
                      q_att.narrow(2, 0, lora));

  ops::store_kv(backend, k_row, k_row.narrow(2, 0, lora), inputs.slot_mapping, cache);
  const Tensor o_lat = scratch.o_lat.reshape({scratch.o_lat.size(0), heads, lora});
  ops::attention(backend, q_att, cache, inputs.attention, params, o_lat);

  // W_UV of head i: rows [nope, nope + vd) of its block of kv_b_proj.
  ops::linear_batched(backend, o_lat, w.wkv_b.reshape({heads, nope + vd, lora}).narrow(1, nope, vd),
                      scratch.o.split_last(heads, vd));
  ops::linear(backend, scratch.o, w.wo, w.bo, out);
}

}  // namespace deepinfer::layers
