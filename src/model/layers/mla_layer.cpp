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
               const AttentionParams& params, const Tensor& h, const ForwardInputs& inputs,
               const KvGroupInputs& kv_in, const KvCacheLayer& cache, const MlaScratch& scratch, Tensor out) {
  const int64_t heads = s.n_heads, lora = s.kv_lora_rank, nope = s.nope_dim, rot = s.rope_dim, vd = s.v_dim;
  const int64_t qk = nope + rot, row = lora + rot;
  const Tensor none;
  const bool q_lora = s.q_lora_rank > 0;
  if (w.w_in.defined()) {
    ops::linear(backend, h, w.w_in, w.b_in, scratch.in);
  } else {
    ops::linear(backend, h, q_lora ? w.wq_a : w.wq, q_lora ? w.bq_a : none, q_lora ? scratch.q_a : scratch.q);
    ops::linear(backend, h, w.wkv_a, w.bkv_a, scratch.kv_a);
  }
  if (q_lora) {
    ops::rms_norm(backend, scratch.q_a, w.q_a_norm, s.rms_eps, 0.0f, scratch.q_a);
    ops::linear(backend, scratch.q_a, w.wq_b, none, scratch.q);
  }

  // The rope halves: each head's q_pe is rotated into the tail of its
  // absorbed query, next to the token's shared k_pe; the normalised latent
  // and the rotated k_pe form the token's cache row.
  const Tensor q_att = scratch.q_att.reshape({scratch.q_att.size(0), heads, row});
  const Tensor k_row = scratch.kv_a.split_last(1, row);  // [n, 1, row]; rows may be strided (scratch.in)
  const Tensor q_heads = scratch.q.split_last(heads, qk);
  ops::mla_rope_store_kv(backend, q_heads.narrow(2, nope, rot), q_att.narrow(2, lora, rot), k_row, lora, w.kv_a_norm,
                         s.rms_eps, inputs.positions, rope, kv_in.slot_mapping, cache);
  ops::linear_batched(backend, q_heads.narrow(2, 0, nope), w.w_uk_t, q_att.narrow(2, 0, lora));
  const Tensor o_lat = scratch.o_lat.reshape({scratch.o_lat.size(0), heads, lora});
  ops::attention(backend, q_att, cache, kv_in.attention, params, o_lat);

  // W_UV of head i: rows [nope, nope + vd) of its block of kv_b_proj.
  ops::linear_batched(backend, o_lat, w.wkv_b.reshape({heads, nope + vd, lora}).narrow(1, nope, vd),
                      scratch.o.split_last(heads, vd));
  ops::linear(backend, scratch.o, w.wo, w.bo, out);
}

}  // namespace deepinfer::layers
