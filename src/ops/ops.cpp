#include "ops/ops.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>

#include "core/error.h"

namespace deepinfer::ops {

namespace {

bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.ndim() != b.ndim()) return false;
  for (int d = 0; d < a.ndim(); ++d) {
    if (a.size(d) != b.size(d)) return false;
  }
  return true;
}

void check_defined(const char* op, const char* name, const Tensor& t) {
  DI_CHECK(t.defined(), "{}: {} is undefined", op, name);
}

void check_device(const char* op, const char* name, const Tensor& t, const Backend& backend) {
  check_defined(op, name, t);
  DI_CHECK(t.device() == backend.device(), "{}: {} {} is not on the {} backend's device", op, name,
           t.describe(), backend.name());
}

void check_rank(const char* op, const char* name, const Tensor& t, int rank) {
  DI_CHECK(t.ndim() == rank, "{}: {} {} must have rank {}", op, name, t.describe(), rank);
}

void check_dtype(const char* op, const char* name, const Tensor& t, DType dtype) {
  DI_CHECK(t.dtype() == dtype, "{}: {} {} must be {}", op, name, t.describe(), dtype_name(dtype));
}

void check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                      const Tensor& b) {
  DI_CHECK(same_shape(a, b), "{}: {} {} and {} {} must have the same shape", op, a_name, a.describe(),
           b_name, b.describe());
}

void check_same_dtype(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                      const Tensor& b) {
  DI_CHECK(a.dtype() == b.dtype(), "{}: {} {} and {} {} must have the same dtype", op, a_name,
           a.describe(), b_name, b.describe());
}

// An activation tensor on the backend's device, in the backend's activation
// dtype (f32 is accepted everywhere: logits and reference paths use it).
void check_activation(const char* op, const char* name, const Tensor& t, const Backend& backend) {
  check_device(op, name, t, backend);
  DType act = backend.activation_dtype();
  DI_CHECK(t.dtype() == act || t.dtype() == DType::F32, "{}: {} {} must be {}{}", op, name, t.describe(),
           dtype_name(act), act == DType::F32 ? "" : " or f32");
}

void check_index_vector(const char* op, const char* name, const Tensor& t, const Backend& backend,
                        int64_t length) {
  check_device(op, name, t, backend);
  check_rank(op, name, t, 1);
  check_dtype(op, name, t, DType::I32);
  DI_CHECK(t.size(0) == length, "{}: {} {} must have {} entries", op, name, t.describe(), length);
}

void check_norm_weight(const char* op, const Tensor& x, const Tensor& weight, const Backend& backend) {
  check_device(op, "weight", weight, backend);
  check_rank(op, "weight", weight, 1);
  check_dtype(op, "weight", weight, DType::F32);
  DI_CHECK(weight.size(0) == x.size(-1), "{}: weight {} does not match x {} in the inner dimension", op,
           weight.describe(), x.describe());
}

void check_eps(const char* op, float eps) {
  DI_CHECK(std::isfinite(eps) && eps >= 0.0f, "{}: eps must be finite and non-negative, got {}", op, eps);
}

void check_gated_activation_kind(const char* op, Activation act) {
  DI_CHECK(act == Activation::Silu || act == Activation::GeluTanh || act == Activation::ClampedSwiglu,
           "{}: unknown activation {}", op, static_cast<int>(act));
}

}  // namespace

void copy(Backend& backend, Tensor dst, const Tensor& src) {
  check_defined("copy", "dst", dst);
  check_defined("copy", "src", src);
  for (const Tensor* t : {static_cast<const Tensor*>(&dst), &src}) {
    DI_CHECK(t->device() == backend.device() || t->device().type == DeviceType::CPU,
             "copy: {} is neither on the host nor on the {} backend's device", t->describe(), backend.name());
  }
  check_same_shape("copy", "dst", dst, "src", src);
  check_same_dtype("copy", "dst", dst, "src", src);
  backend.copy(dst, src);
}

void embedding(Backend& backend, const Tensor& table, const Tensor& ids, Tensor out) {
  embedding_slice(backend, table, ids, 0, table.defined() ? table.size(0) : 0, out);
}

void embedding_slice(Backend& backend, const Tensor& table, const Tensor& ids, int64_t first_id, int64_t vocab,
                     Tensor out) {
  const char* op = "embedding";
  check_device(op, "table", table, backend);
  check_rank(op, "table", table, 2);
  check_activation(op, "out", out, backend);
  check_rank(op, "out", out, 2);
  check_index_vector(op, "ids", ids, backend, out.size(0));
  DI_CHECK(out.size(1) == table.size(1), "{}: out {} does not match table {} in the hidden dimension", op,
           out.describe(), table.describe());
  DI_CHECK(first_id >= 0 && first_id + table.size(0) <= vocab, "{}: table {} at id {} exceeds the {} ids", op,
           table.describe(), first_id, vocab);
  backend.embedding(table, ids, first_id, vocab, out);
}

void rms_norm(Backend& backend, const Tensor& x, const Tensor& weight, float eps, float weight_offset,
              Tensor out) {
  const char* op = "rms_norm";
  check_activation(op, "x", x, backend);
  check_activation(op, "out", out, backend);
  check_same_shape(op, "x", x, "out", out);
  check_same_dtype(op, "x", x, "out", out);
  check_norm_weight(op, x, weight, backend);
  check_eps(op, eps);
  backend.rms_norm(x, weight, eps, weight_offset, out);
}

void add_rms_norm(Backend& backend, Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                  float weight_offset, Tensor out) {
  const char* op = "add_rms_norm";
  check_activation(op, "residual", residual, backend);
  check_activation(op, "x", x, backend);
  check_activation(op, "out", out, backend);
  check_same_shape(op, "residual", residual, "x", x);
  check_same_shape(op, "x", x, "out", out);
  check_same_dtype(op, "residual", residual, "x", x);
  check_same_dtype(op, "x", x, "out", out);
  check_norm_weight(op, x, weight, backend);
  check_eps(op, eps);
  backend.add_rms_norm(residual, x, weight, eps, weight_offset, out);
}

namespace {

// x and out: activations of `rank`; weight: a matrix (stack) of the same rank on the backend's device.
void check_product_operands(const char* op, const Tensor& x, const Tensor& weight, const Tensor& out, int rank,
                            const Backend& backend) {
  check_activation(op, "x", x, backend);
  check_rank(op, "x", x, rank);
  check_device(op, "weight", weight, backend);
  check_rank(op, "weight", weight, rank);
  check_activation(op, "out", out, backend);
  check_rank(op, "out", out, rank);
}

}  // namespace

void linear(Backend& backend, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out) {
  const char* op = "linear";
  check_product_operands(op, x, weight, out, 2, backend);
  DI_CHECK(x.size(1) == weight.size(1), "{}: x {} does not match weight {} in the inner dimension", op,
           x.describe(), weight.describe());
  DI_CHECK(out.size(0) == x.size(0) && out.size(1) == weight.size(0),
           "{}: out {} must be [{}, {}] for x {} and weight {}", op, out.describe(), x.size(0),
           weight.size(0), x.describe(), weight.describe());
  if (bias.defined()) {
    check_device(op, "bias", bias, backend);
    check_rank(op, "bias", bias, 1);
    check_dtype(op, "bias", bias, DType::F32);
    DI_CHECK(bias.size(0) == weight.size(0), "{}: bias {} does not match weight {} in the output dimension",
             op, bias.describe(), weight.describe());
  }
  backend.linear(x, weight, bias, out);
}

void linear_batched(Backend& backend, const Tensor& x, const Tensor& weight, Tensor out) {
  const char* op = "linear_batched";
  check_product_operands(op, x, weight, out, 3, backend);
  DI_CHECK(x.size(1) == weight.size(0) && x.size(2) == weight.size(2),
           "{}: x {} must be [n, {}, {}] for weight {}", op, x.describe(), weight.size(0), weight.size(2),
           weight.describe());
  DI_CHECK(out.size(0) == x.size(0) && out.size(1) == weight.size(0) && out.size(2) == weight.size(1),
           "{}: out {} must be [{}, {}, {}] for x {} and weight {}", op, out.describe(), x.size(0), weight.size(0),
           weight.size(1), x.describe(), weight.describe());
  backend.linear_batched(x, weight, out);
}

bool gated_linear(Backend& backend, const Tensor& x, const Tensor& w_gate_up, Activation act, Tensor out) {
  const char* op = "gated_linear";
  check_activation(op, "x", x, backend);
  check_rank(op, "x", x, 2);
  check_device(op, "w_gate_up", w_gate_up, backend);
  check_rank(op, "w_gate_up", w_gate_up, 2);
  check_activation(op, "out", out, backend);
  check_rank(op, "out", out, 2);
  check_same_dtype(op, "x", x, "out", out);
  DI_CHECK(x.size(1) == w_gate_up.size(1) && w_gate_up.size(0) % 2 == 0,
           "{}: x {} does not match the stacked gate-up weight {}", op, x.describe(), w_gate_up.describe());
  DI_CHECK(out.size(0) == x.size(0) && out.size(1) == w_gate_up.size(0) / 2,
           "{}: out {} must be [{}, {}] for x {} and weight {}", op, out.describe(), x.size(0),
           w_gate_up.size(0) / 2, x.describe(), w_gate_up.describe());
  return backend.gated_linear(x, w_gate_up, act, out);
}

namespace {

void check_rope(Tensor q, Tensor k, const Tensor& positions, const RopeParams& params, Backend& backend) {
  const char* op = "rope";
  check_activation(op, "q", q, backend);
  check_rank(op, "q", q, 3);
  int64_t head_dim = q.size(2);
  if (k.defined()) {
    check_activation(op, "k", k, backend);
    check_rank(op, "k", k, 3);
    check_same_dtype(op, "q", q, "k", k);
    DI_CHECK(k.size(0) == q.size(0) && k.size(2) == head_dim,
             "{}: k {} does not match q {} in tokens or head size", op, k.describe(), q.describe());
  }
  check_index_vector(op, "positions", positions, backend, q.size(0));
  DI_CHECK(params.rotary_dim > 0 && params.rotary_dim % 2 == 0 && params.rotary_dim <= head_dim,
           "{}: rotary_dim {} must be even and in (0, {}] for q {}", op, params.rotary_dim, head_dim,
           q.describe());
  check_device(op, "inv_freq", params.inv_freq, backend);
  check_rank(op, "inv_freq", params.inv_freq, 1);
  check_dtype(op, "inv_freq", params.inv_freq, DType::F32);
  DI_CHECK(params.inv_freq.size(0) == params.rotary_dim / 2,
           "{}: inv_freq {} must have rotary_dim / 2 = {} entries", op, params.inv_freq.describe(),
           params.rotary_dim / 2);
}

}  // namespace

void rope(Backend& backend, Tensor q, Tensor k, const Tensor& positions, const RopeParams& params) {
  check_rope(q, k, positions, params, backend);
  backend.rope(q, k, positions, params);
}

namespace {

void check_cache(const char* op, const KvCacheLayer& cache, const Backend& backend) {
  check_device(op, "cache.k", cache.k, backend);
  check_device(op, "cache.v", cache.v, backend);
  check_rank(op, "cache.k", cache.k, 4);
  check_rank(op, "cache.v", cache.v, 4);
  DI_CHECK(cache.v.size(0) == cache.k.size(0) && cache.v.size(1) == cache.k.size(1) &&
               cache.v.size(2) == cache.k.size(2) && cache.v.size(3) <= cache.k.size(3),
           "{}: cache.v {} must match cache.k {} in pages and heads, with a head size no larger", op,
           cache.v.describe(), cache.k.describe());
  check_same_dtype(op, "cache.k", cache.k, "cache.v", cache.v);
  DI_CHECK(cache.k.size(1) > 0, "{}: cache {} has an empty page size", op, cache.k.describe());
}

// The cache holds the activations' type, or a type the backend converts to
// on store and from on load (FP8 e4m3 everywhere, f16 on the CPU).
void check_cache_dtype(const char* op, const char* name, const Tensor& x, const KvCacheLayer& cache,
                       const Backend& backend) {
  DI_CHECK(cache.k.dtype() == x.dtype() || backend.supports_kv_dtype(cache.k.dtype()),
           "{}: cache {} must hold {}'s type ({}) or a KV type the {} backend converts to", op, cache.k.describe(),
           name, dtype_name(x.dtype()), backend.name());
}

}  // namespace

namespace {

void check_store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, const KvCacheLayer& cache,
                    Backend& backend) {
  const char* op = "store_kv";
  check_activation(op, "k", k, backend);
  check_activation(op, "v", v, backend);
  check_rank(op, "k", k, 3);
  check_rank(op, "v", v, 3);
  check_same_dtype(op, "k", k, "v", v);
  check_cache(op, cache, backend);
  check_cache_dtype(op, "k", k, cache, backend);
  DI_CHECK(k.size(1) == cache.k.size(2) && k.size(2) == cache.k.size(3),
           "{}: k {} does not match cache {} in heads or head size", op, k.describe(), cache.k.describe());
  DI_CHECK(v.size(0) == k.size(0) && v.size(1) == cache.v.size(2) && v.size(2) == cache.v.size(3),
           "{}: v {} does not match cache.v {} (and k {})", op, v.describe(), cache.v.describe(), k.describe());
  if (cache.v.data() == cache.k.data()) {
    DI_CHECK(v.data() == k.data(), "{}: with a latent cache (V a view of K), v must be the matching view of k",
             op);
  }
  check_index_vector(op, "slot_mapping", slot_mapping, backend, k.size(0));
}

}  // namespace

void store_kv(Backend& backend, const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
              const KvCacheLayer& cache) {
  check_store_kv(k, v, slot_mapping, cache, backend);
  backend.store_kv(k, v, slot_mapping, cache);
}

void rope_store_kv(Backend& backend, Tensor q, Tensor k, const Tensor& v, const Tensor& positions,
                   const RopeParams& params, const Tensor& slot_mapping, const KvCacheLayer& cache,
                   const QkNorm* norm) {
  DI_CHECK(k.defined(), "rope_store_kv: k is required");
  check_rope(q, k, positions, params, backend);
  check_store_kv(k, v, slot_mapping, cache, backend);
  if (norm) {  // the checks of the separate per-head rms_norm calls
    check_norm_weight("rope_store_kv(q_norm)", q, norm->q_weight, backend);
    check_norm_weight("rope_store_kv(k_norm)", k, norm->k_weight, backend);
    check_eps("rope_store_kv", norm->eps);
  }
  if (backend.rope_store_kv(q, k, v, positions, params, slot_mapping, cache, norm)) return;
  if (norm) {
    backend.rms_norm(q, norm->q_weight, norm->eps, norm->weight_offset, q);
    backend.rms_norm(k, norm->k_weight, norm->eps, norm->weight_offset, k);
  }
  backend.rope(q, k, positions, params);
  backend.store_kv(k, v, slot_mapping, cache);
}

void mla_rope_store_kv(Backend& backend, const Tensor& q_pe, Tensor q_rot, Tensor kv, int64_t lora,
                       const Tensor& kv_norm, float eps, const Tensor& positions, const RopeParams& params,
                       const Tensor& slot_mapping, const KvCacheLayer& cache) {
  const char* op = "mla_rope_store_kv";
  check_activation(op, "kv", kv, backend);
  check_rank(op, "kv", kv, 3);
  DI_CHECK(kv.size(1) == 1 && lora > 0 && lora < kv.size(2),
           "{}: kv {} must be [n, 1, lora + rot] with lora {} short of the row", op, kv.describe(), lora);
  const Tensor latent = kv.narrow(2, 0, lora), k_pe = kv.narrow(2, lora, kv.size(2) - lora);
  Tensor latent_rows = kv.select(1, 0).narrow(1, 0, lora);  // [n, lora], what rms_norm normalises
  // The checks of the separate ops this stands for.
  check_norm_weight(op, latent, kv_norm, backend);
  check_eps(op, eps);
  check_activation(op, "q_pe", q_pe, backend);
  check_same_shape(op, "q_rot", q_rot, "q_pe", q_pe);
  check_same_dtype(op, "q_rot", q_rot, "q_pe", q_pe);
  check_rope(q_rot, k_pe, positions, params, backend);
  check_store_kv(kv, latent, slot_mapping, cache, backend);
  DI_CHECK(cache.v.data() == cache.k.data(), "{}: the cache must be a latent cache (V a view of K)", op);
  if (backend.mla_rope_store_kv(q_pe, q_rot, kv, lora, kv_norm, eps, positions, params, slot_mapping, cache)) return;
  backend.rms_norm(latent_rows, kv_norm, eps, 0.0f, latent_rows);
  backend.copy(q_rot, q_pe);
  backend.rope(q_rot, k_pe, positions, params);
  backend.store_kv(kv, latent, slot_mapping, cache);
}

void attention(Backend& backend, const Tensor& q, const KvCacheLayer& cache,
               const AttentionMetadata& meta, const AttentionParams& params, Tensor out) {
  const char* op = "attention";
  check_activation(op, "q", q, backend);
  check_rank(op, "q", q, 3);
  check_activation(op, "out", out, backend);
  check_rank(op, "out", out, 3);
  check_same_dtype(op, "q", q, "out", out);
  check_cache(op, cache, backend);
  check_cache_dtype(op, "q", q, cache, backend);
  DI_CHECK(out.size(0) == q.size(0) && out.size(1) == q.size(1) && out.size(2) == cache.v.size(3),
           "{}: out {} must be [{}, {}, {}] (q tokens and heads, cache.v {} head size)", op, out.describe(),
           q.size(0), q.size(1), cache.v.size(3), cache.v.describe());
  int64_t heads_q = q.size(1), heads_kv = cache.k.size(2);
  DI_CHECK(cache.k.size(3) == q.size(2), "{}: q {} does not match cache {} in the head size", op,
           q.describe(), cache.k.describe());
  DI_CHECK(heads_kv > 0 && heads_q % heads_kv == 0,
           "{}: q heads ({}) must be a multiple of the cache's KV heads ({})", op, heads_q, heads_kv);
  DI_CHECK(meta.num_seqs >= 0, "{}: negative num_seqs {}", op, meta.num_seqs);
  check_index_vector(op, "q_indptr", meta.q_indptr, backend, meta.num_seqs + 1);
  check_index_vector(op, "kv_indptr", meta.kv_indptr, backend, meta.num_seqs + 1);
  check_device(op, "kv_page_indices", meta.kv_page_indices, backend);
  check_rank(op, "kv_page_indices", meta.kv_page_indices, 1);
  check_dtype(op, "kv_page_indices", meta.kv_page_indices, DType::I32);
  check_index_vector(op, "kv_last_page_len", meta.kv_last_page_len, backend, meta.num_seqs);
  if (meta.kv_start_pos.defined()) {
    check_index_vector(op, "kv_start_pos", meta.kv_start_pos, backend, meta.num_seqs);
  }
  DI_CHECK(std::isfinite(params.scale), "{}: scale must be finite, got {}", op, params.scale);
  DI_CHECK(params.sliding_window >= 0, "{}: negative sliding_window {}", op, params.sliding_window);
  DI_CHECK(std::isfinite(params.logit_softcap) && params.logit_softcap >= 0.0f,
           "{}: logit_softcap must be finite and non-negative, got {}", op, params.logit_softcap);
  if (params.sinks.defined()) {
    check_device(op, "sinks", params.sinks, backend);
    check_rank(op, "sinks", params.sinks, 1);
    check_dtype(op, "sinks", params.sinks, DType::F32);
    DI_CHECK(params.sinks.size(0) == heads_q, "{}: sinks {} must have one entry per q head ({})", op,
             params.sinks.describe(), heads_q);
  }
  backend.attention(q, cache, meta, params, out);
}

void gated_activation(Backend& backend, const Tensor& gate, const Tensor& up, Activation act,
                      Tensor out) {
  const char* op = "gated_activation";
  check_activation(op, "gate", gate, backend);
  check_activation(op, "up", up, backend);
  check_activation(op, "out", out, backend);
  check_same_shape(op, "gate", gate, "up", up);
  check_same_shape(op, "gate", gate, "out", out);
  check_same_dtype(op, "gate", gate, "up", up);
  check_same_dtype(op, "gate", gate, "out", out);
  check_gated_activation_kind(op, act);
  backend.gated_activation(gate, up, act, out);
}

void add(Backend& backend, const Tensor& a, const Tensor& b, Tensor out) {
  const char* op = "add";
  check_activation(op, "a", a, backend);
  check_activation(op, "b", b, backend);
  check_activation(op, "out", out, backend);
  check_same_shape(op, "a", a, "b", b);
  check_same_shape(op, "a", a, "out", out);
  check_same_dtype(op, "a", a, "b", b);
  check_same_dtype(op, "a", a, "out", out);
  backend.add(a, b, out);
}

void scale(Backend& backend, const Tensor& x, float factor, Tensor out) {
  const char* op = "scale";
  check_activation(op, "x", x, backend);
  check_activation(op, "out", out, backend);
  check_same_shape(op, "x", x, "out", out);
  check_same_dtype(op, "x", x, "out", out);
  backend.scale(x, factor, out);
}

void gather_rows(Backend& backend, const Tensor& x, const Tensor& rows, Tensor out) {
  const char* op = "gather_rows";
  check_device(op, "x", x, backend);
  check_device(op, "out", out, backend);
  DI_CHECK(x.ndim() >= 2, "{}: x {} must have rank >= 2", op, x.describe());
  check_same_dtype(op, "x", x, "out", out);
  bool rows_match = out.ndim() == x.ndim();
  for (int d = 1; rows_match && d < x.ndim(); ++d) rows_match = out.size(d) == x.size(d);
  DI_CHECK(rows_match, "{}: out {} must have rows shaped like those of x {}", op, out.describe(),
           x.describe());
  check_index_vector(op, "rows", rows, backend, out.size(0));
  backend.gather_rows(x, rows, out);
}

void sanitize_ids(Backend& backend, Tensor ids, int64_t limit) {
  const char* op = "sanitize_ids";
  check_index_vector(op, "ids", ids, backend, ids.size(0));
  DI_CHECK(ids.is_contiguous(), "{}: ids {} must be contiguous", op, ids.describe());
  DI_CHECK(limit > 0 && limit <= std::numeric_limits<int32_t>::max(), "{}: limit {} out of range", op, limit);
  backend.sanitize_ids(ids, limit);
}

void zero_rows_at_position(Backend& backend, Tensor x, const Tensor& positions, int32_t position) {
  const char* op = "zero_rows_at_position";
  check_activation(op, "x", x, backend);
  check_rank(op, "x", x, 2);
  check_index_vector(op, "positions", positions, backend, x.size(0));
  backend.zero_rows_at_position(x, positions, position);
}

namespace {

// f32[rows, vocab] logits on the backend, with token ids of the vocabulary fitting in i32.
void check_logits(const char* op, const Tensor& logits, const Backend& backend) {
  check_device(op, "logits", logits, backend);
  check_rank(op, "logits", logits, 2);
  check_dtype(op, "logits", logits, DType::F32);
  DI_CHECK(logits.size(1) > 0 && logits.size(1) <= INT32_MAX, "{}: logits {} must have between 1 and {} columns", op,
           logits.describe(), INT32_MAX);
}

}  // namespace

void token_probs(Backend& backend, const Tensor& logits, const Tensor& tokens, Tensor out) {
  const char* op = "token_probs";
  check_logits(op, logits, backend);
  DI_CHECK(logits.stride_bytes(1) == 4 && logits.stride_bytes(0) % 4 == 0, "{}: logits {} must have contiguous rows", op, logits.describe());
  check_index_vector(op, "tokens", tokens, backend, logits.size(0));
  check_device(op, "out", out, backend);
  check_rank(op, "out", out, 1);
  check_dtype(op, "out", out, DType::F32);
  DI_CHECK(out.size(0) == logits.size(0) && out.is_contiguous() && tokens.is_contiguous(),
           "{}: out {} and tokens {} must be contiguous with one entry per row of logits {}", op, out.describe(),
           tokens.describe(), logits.describe());
  backend.token_probs(logits, tokens, out);
}

void sample(Backend& backend, const Tensor& logits, const Tensor& params, Tensor tokens) {
  const char* op = "sample";
  check_logits(op, logits, backend);
  const int64_t rows = logits.size(0);
  check_device(op, "params", params, backend);
  check_rank(op, "params", params, 2);
  check_dtype(op, "params", params, DType::U8);
  constexpr auto kRowBytes = static_cast<int64_t>(sizeof(SamplingRowParams));
  DI_CHECK(params.size(0) == rows && params.size(1) == kRowBytes && params.is_contiguous(),
           "{}: params {} must be a contiguous u8[{}, {}] (one SamplingRowParams per row of logits)", op,
           params.describe(), rows, kRowBytes);
  DI_CHECK(reinterpret_cast<uintptr_t>(params.data()) % alignof(SamplingRowParams) == 0,
           "{}: params must be {}-byte aligned", op, alignof(SamplingRowParams));
  check_index_vector(op, "tokens", tokens, backend, rows);
  if (rows == 0) return;
  backend.sample(logits, params, tokens);
}

void apply_penalties(Backend& backend, Tensor logits, const Tensor& params, const Tensor& entries,
                     const Tensor& pending_tokens) {
  const char* op = "apply_penalties";
  check_logits(op, logits, backend);
  const int64_t rows = logits.size(0);
  // Arrays of plain structs: contiguous, 4-byte aligned rows of their exact size.
  auto check_records = [&](const char* name, const Tensor& t, int64_t record_bytes, const char* record) {
    check_device(op, name, t, backend);
    check_rank(op, name, t, 2);
    check_dtype(op, name, t, DType::U8);
    DI_CHECK(t.size(1) == record_bytes && t.is_contiguous(), "{}: {} {} must be a contiguous u8[n, {}] (one {} per row)",
             op, name, t.describe(), record_bytes, record);
    DI_CHECK(reinterpret_cast<uintptr_t>(t.data()) % 4 == 0, "{}: {} must be 4-byte aligned", op, name);
  };
  check_records("params", params, sizeof(PenaltyRowParams), "PenaltyRowParams");
  DI_CHECK(params.size(0) == rows, "{}: params {} must have one row per row of logits {}", op, params.describe(),
           logits.describe());
  check_records("entries", entries, sizeof(PenaltyEntry), "PenaltyEntry");
  DI_CHECK(entries.size(0) <= INT32_MAX, "{}: entries {} exceed {} rows", op, entries.describe(), INT32_MAX);
  if (pending_tokens.defined()) {
    check_device(op, "pending_tokens", pending_tokens, backend);
    check_rank(op, "pending_tokens", pending_tokens, 1);
    check_dtype(op, "pending_tokens", pending_tokens, DType::I32);
    DI_CHECK(pending_tokens.is_contiguous() && pending_tokens.size(0) <= INT32_MAX,
             "{}: pending_tokens {} must be a contiguous i32[m]", op, pending_tokens.describe());
  }
  if (rows == 0) return;
  backend.apply_penalties(logits, params, entries, pending_tokens);
}

void apply_token_bitmask(Backend& backend, Tensor logits, const Tensor& bitmask, const Tensor& rows) {
  const char* op = "apply_token_bitmask";
  check_logits(op, logits, backend);
  check_device(op, "bitmask", bitmask, backend);
  check_rank(op, "bitmask", bitmask, 2);
  check_dtype(op, "bitmask", bitmask, DType::I32);
  // Words past the vocabulary are ignored and a vocabulary past the words is
  // masked (a padded model vocabulary), so any positive word count is valid.
  DI_CHECK(bitmask.size(1) > 0 && bitmask.is_contiguous(),
           "{}: bitmask {} must be a contiguous i32[m, words] with at least one word per row", op, bitmask.describe());
  const int64_t m = bitmask.size(0);
  check_index_vector(op, "rows", rows, backend, m);
  if (m == 0) return;
  backend.apply_token_bitmask(logits, bitmask, rows);
}

namespace {

// Shapes shared by moe_workspace_bytes and moe_experts: E experts of ffn F over hidden H.
void check_expert_weights(const char* op, const MoeExpertWeights& w, const Backend& backend) {
  check_device(op, "w.gate", w.gate, backend);
  check_device(op, "w.up", w.up, backend);
  check_device(op, "w.down", w.down, backend);
  check_rank(op, "w.gate", w.gate, 3);
  check_rank(op, "w.up", w.up, 3);
  check_rank(op, "w.down", w.down, 3);
  check_same_shape(op, "w.gate", w.gate, "w.up", w.up);
  check_same_dtype(op, "w.gate", w.gate, "w.up", w.up);
  // down may be stored differently (a GGUF Q4_K_M file's Q6_K down under
  // Q4_K gate/up; an FP8 checkpoint whose down rows are not whole blocks):
  // backends whose kernels take one weight dtype check it themselves.
  DI_CHECK(w.gate.size(0) > 0 && w.down.size(0) == w.gate.size(0) && w.down.size(1) == w.gate.size(2) &&
               w.down.size(2) == w.gate.size(1),
           "{}: w.down {} must be [experts, hidden, ffn] for w.gate {}", op, w.down.describe(), w.gate.describe());
  if (!w.gate_bias.defined() && !w.up_bias.defined() && !w.down_bias.defined()) return;
  DI_CHECK(w.gate_bias.defined() && w.up_bias.defined() && w.down_bias.defined(),
           "{}: expert biases come all three (gate, up, down) or not at all", op);
  const int64_t experts = w.gate.size(0), ffn = w.gate.size(1), hidden = w.gate.size(2);
  for (auto [name, b, cols] : {std::tuple{"w.gate_bias", &w.gate_bias, ffn}, std::tuple{"w.up_bias", &w.up_bias, ffn},
                               std::tuple{"w.down_bias", &w.down_bias, hidden}}) {
    check_device(op, name, *b, backend);
    check_rank(op, name, *b, 2);
    DI_CHECK(b->dtype() == DType::F32 || b->dtype() == backend.activation_dtype(),
             "{}: {} {} must be f32 or the activation dtype ({})", op, name, b->describe(),
             dtype_name(backend.activation_dtype()));
    DI_CHECK(b->size(0) == experts && b->size(1) == cols && b->is_contiguous(),
             "{}: {} {} must be a contiguous [{}, {}]", op, name, b->describe(), experts, cols);
  }
  check_same_dtype(op, "w.gate_bias", w.gate_bias, "w.up_bias", w.up_bias);
  check_same_dtype(op, "w.gate_bias", w.gate_bias, "w.down_bias", w.down_bias);
}

void check_top_k(const char* op, int top_k, int64_t n_experts) {
  DI_CHECK(top_k > 0 && top_k <= n_experts, "{}: top_k {} must be in [1, {}] (the number of experts)", op, top_k,
           n_experts);
}

}  // namespace

void moe_route(Backend& backend, const Tensor& logits, const MoeRouteParams& params, Tensor expert_ids,
               Tensor expert_weights) {
  const char* op = "moe_route";
  check_activation(op, "logits", logits, backend);
  check_rank(op, "logits", logits, 2);
  const int64_t n = logits.size(0), n_experts = logits.size(1);
  check_top_k(op, params.top_k, n_experts);
  for (auto [name, t, dtype] : {std::tuple{"expert_ids", &expert_ids, DType::I32},
                                std::tuple{"expert_weights", &expert_weights, DType::F32}}) {
    check_device(op, name, *t, backend);
    check_rank(op, name, *t, 2);
    check_dtype(op, name, *t, dtype);
    DI_CHECK(t->size(0) == n && t->size(1) == params.top_k, "{}: {} {} must be [{}, {}]", op, name, t->describe(), n,
             params.top_k);
  }
  DI_CHECK(params.scoring == MoeScoring::Softmax || params.scoring == MoeScoring::Sigmoid,
           "{}: unknown scoring {}", op, static_cast<int>(params.scoring));
  DI_CHECK(std::isfinite(params.scaling), "{}: scaling must be finite, got {}", op, params.scaling);
  if (params.correction_bias.defined()) {
    check_device(op, "correction_bias", params.correction_bias, backend);
    check_rank(op, "correction_bias", params.correction_bias, 1);
    check_dtype(op, "correction_bias", params.correction_bias, DType::F32);
    DI_CHECK(params.correction_bias.size(0) == n_experts, "{}: correction_bias {} must have {} entries", op,
             params.correction_bias.describe(), n_experts);
  }
  DI_CHECK(params.n_groups >= 1 && n_experts % params.n_groups == 0,
           "{}: n_groups {} must divide the {} experts", op, params.n_groups, n_experts);
  if (params.n_groups > 1) {
    const int64_t group = n_experts / params.n_groups;
    DI_CHECK(params.group_score == MoeGroupScore::TopTwoSum || params.group_score == MoeGroupScore::Max,
             "{}: unknown group score {}", op, static_cast<int>(params.group_score));
    DI_CHECK(group >= 2 || params.group_score == MoeGroupScore::Max,
             "{}: groups ranked by their two best experts need at least 2 experts ({} experts in {} groups)", op,
             n_experts, params.n_groups);
    DI_CHECK(params.top_k_groups >= 1 && params.top_k_groups <= params.n_groups &&
                 params.top_k <= params.top_k_groups * group,
             "{}: top_k_groups {} must be in [1, {}] and hold top_k {} experts", op, params.top_k_groups,
             params.n_groups, params.top_k);
  }
  backend.moe_route(logits, params, expert_ids, expert_weights);
}

size_t moe_workspace_bytes(Backend& backend, int64_t n_tokens, int top_k, const MoeExpertWeights& w) {
  const char* op = "moe_workspace_bytes";
  check_expert_weights(op, w, backend);
  DI_CHECK(n_tokens >= 0, "{}: negative token count {}", op, n_tokens);
  check_top_k(op, top_k, w.gate.size(0));
  return backend.moe_workspace_bytes(n_tokens, top_k, w);
}

void moe_experts(Backend& backend, const Tensor& x, const Tensor& expert_ids, const Tensor& expert_weights,
                 const MoeExpertWeights& w, Activation act, bool accumulate, Tensor workspace, Tensor out) {
  const char* op = "moe_experts";
  check_activation(op, "x", x, backend);
  check_rank(op, "x", x, 2);
  check_activation(op, "out", out, backend);
  check_same_shape(op, "x", x, "out", out);
  check_same_dtype(op, "x", x, "out", out);
  check_expert_weights(op, w, backend);
  DI_CHECK(x.size(1) == w.gate.size(2), "{}: x {} does not match w.gate {} in the hidden dimension", op,
           x.describe(), w.gate.describe());
  check_device(op, "expert_ids", expert_ids, backend);
  check_rank(op, "expert_ids", expert_ids, 2);
  check_dtype(op, "expert_ids", expert_ids, DType::I32);
  check_device(op, "expert_weights", expert_weights, backend);
  check_dtype(op, "expert_weights", expert_weights, DType::F32);
  check_same_shape(op, "expert_ids", expert_ids, "expert_weights", expert_weights);
  DI_CHECK(expert_ids.size(0) == x.size(0), "{}: expert_ids {} must have a row per token of x {}", op,
           expert_ids.describe(), x.describe());
  const int top_k = static_cast<int>(expert_ids.size(1));
  check_top_k(op, top_k, w.gate.size(0));
  check_gated_activation_kind(op, act);
  check_device(op, "workspace", workspace, backend);
  check_dtype(op, "workspace", workspace, DType::U8);
  const size_t need = backend.moe_workspace_bytes(x.size(0), top_k, w);
  DI_CHECK(workspace.is_contiguous() && workspace.nbytes() >= need,
           "{}: workspace {} is smaller than the {} bytes needed", op, workspace.describe(), need);
  backend.moe_experts(x, expert_ids, expert_weights, w, act, accumulate, workspace, out);
}

void count_experts(Backend& backend, const Tensor& expert_ids, const Tensor& token_slots, Tensor counts) {
  const char* op = "count_experts";
  check_device(op, "expert_ids", expert_ids, backend);
  check_rank(op, "expert_ids", expert_ids, 2);
  check_dtype(op, "expert_ids", expert_ids, DType::I32);
  DI_CHECK(expert_ids.size(1) >= 1, "{}: expert_ids {} must have at least one choice per token", op,
           expert_ids.describe());
  if (token_slots.defined()) check_index_vector(op, "token_slots", token_slots, backend, expert_ids.size(0));
  check_device(op, "counts", counts, backend);
  check_rank(op, "counts", counts, 1);
  check_dtype(op, "counts", counts, DType::I32);
  DI_CHECK(counts.size(0) >= 1 && counts.size(0) <= INT32_MAX && counts.is_contiguous(),
           "{}: counts {} must be a contiguous i32[n_experts]", op, counts.describe());
  backend.count_experts(expert_ids, token_slots, counts);
}

}  // namespace deepinfer::ops
