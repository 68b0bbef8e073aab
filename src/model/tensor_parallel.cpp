#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "dist/communicator.h"
#include "model/weight_store.h"
#include "ops/ops.h"

namespace deepinfer {

IndexRange split_range(int64_t n, int parts, int part, int64_t unit) {
  DI_CHECK(parts > 0 && part >= 0 && part < parts && unit > 0 && n >= 0 && n % unit == 0,
           "split_range({}, {}, {}, {}): bad arguments", n, parts, part, unit);
  const int64_t units = n / unit, base = units / parts, extra = units % parts;
  const int64_t begin = part * base + std::min<int64_t>(part, extra);
  const int64_t count = base + (part < extra ? 1 : 0);
  return {begin * unit, (begin + count) * unit};
}

HeadSizes HeadSizes::of(const ModelConfig& c) {
  if (c.mla.enabled()) {
    return {c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim, c.mla.qk_nope_head_dim + c.mla.v_head_dim,
            c.mla.v_head_dim};
  }
  return {c.head_dim, c.head_dim, c.head_dim};
}

TpShardPlan TpShardPlan::make(const ModelConfig& c, int rank, int size, int64_t ffn_unit, bool expert_parallel) {
  DI_CHECK(size >= 1 && rank >= 0 && rank < size, "tensor parallel rank {} of {} is out of range", rank, size);
  DI_CHECK(c.n_heads_q >= size,
           "--tensor-parallel-size {} exceeds the model's {} attention heads: every rank needs at least one", size,
           c.n_heads_q);
  DI_CHECK(c.n_heads_kv > 0 && c.n_heads_q % c.n_heads_kv == 0, "{}: {} query heads for {} KV heads", c.arch,
           c.n_heads_q, c.n_heads_kv);
  TpShardPlan p;
  p.rank = rank;
  p.size = size;
  const int64_t group = c.n_heads_q / c.n_heads_kv;
  // Whole KV groups per rank while there are at least as many KV heads as
  // ranks (no KV head is then replicated); otherwise query heads split evenly.
  p.q_heads = split_range(c.n_heads_q, size, rank, c.n_heads_kv >= size && !c.mla.enabled() ? group : 1);
  const int64_t a = p.q_heads.begin, b = p.q_heads.end;
  if (c.mla.enabled()) {
    // One latent row per token serves every head: every rank keeps it whole.
    for (int64_t h = a; h < b; ++h) p.kv_heads.push_back(static_cast<int32_t>(h));
  } else if (a % group == 0 && b % group == 0) {
    for (int64_t h = a / group; h < b / group; ++h) p.kv_heads.push_back(static_cast<int32_t>(h));
  } else if (a / group == (b - 1) / group) {
    p.kv_heads.push_back(static_cast<int32_t>(a / group));
  } else {
    for (int64_t h = a; h < b; ++h) p.kv_heads.push_back(static_cast<int32_t>(h / group));
  }
  auto width = [&](int64_t n, const char* what) {
    if (n == 0) return IndexRange{};
    DI_CHECK(n % ffn_unit == 0 && n / ffn_unit >= size,
             "--tensor-parallel-size {}: the {} width {} does not split into {} slices of whole {}-column blocks",
             size, what, n, size, ffn_unit);
    return split_range(n, size, rank, ffn_unit);
  };
  p.ffn = width(c.intermediate_size, "feed-forward");
  p.expert_parallel = expert_parallel;
  if (expert_parallel) {
    DI_CHECK(c.moe.n_experts % size == 0,
             "--enable-expert-parallel: {} experts do not spread evenly over {} ranks", c.moe.n_experts, size);
    p.expert_ffn = {0, c.moe.expert_ffn_size};
    p.shared_ffn = {0, c.moe.shared_ffn_size};
  } else {
    p.expert_ffn = width(c.moe.expert_ffn_size, "expert");
    p.shared_ffn = width(c.moe.shared_ffn_size, "shared-expert");
  }
  p.vocab_size = c.vocab_size;
  p.vocab = split_range(c.vocab_size, size, rank, 1);
  p.vocab_max = split_range(c.vocab_size, size, 0, 1).size();
  return p;
}

IndexRange TpShardPlan::vocab_of(int r) const { return split_range(vocab_size, size, r, 1); }

ModelConfig TpShardPlan::local_config(const ModelConfig& full) const {
  ModelConfig c = full;
  c.n_heads_q = static_cast<int32_t>(q_heads.size());
  c.n_heads_kv = static_cast<int32_t>(kv_heads.size());
  if (full.intermediate_size > 0) c.intermediate_size = static_cast<int32_t>(ffn.size());
  if (full.moe.expert_ffn_size > 0) c.moe.expert_ffn_size = static_cast<int32_t>(expert_ffn.size());
  if (full.moe.shared_ffn_size > 0) c.moe.shared_ffn_size = static_cast<int32_t>(shared_ffn.size());
  // The attention scale stays the full model's (it depends on head_dim only).
  return c;
}

namespace {

enum class Cut : uint8_t { Whole, QHeads, KvHeads, KvbHeads, QHeadCols, QHeadSinks, Ffn, FfnCols, ExpertFfn,
                           ExpertFfnCols, SharedFfn, SharedFfnCols, Vocab, RankZero };

struct CutRule {
  const char* suffix;
  Cut cut;
};

// Canonical per-layer names (after "blk.N.") and how each is cut.
constexpr CutRule kLayerRules[] = {
    {"attn_q.weight", Cut::QHeads},         {"attn_q.bias", Cut::QHeads},
    {"attn_q_b.weight", Cut::QHeads},       {"attn_kv_b.weight", Cut::KvbHeads},
    {"attn_k.weight", Cut::KvHeads},        {"attn_k.bias", Cut::KvHeads},
    {"attn_v.weight", Cut::KvHeads},        {"attn_v.bias", Cut::KvHeads},
    {"attn_output.weight", Cut::QHeadCols}, {"attn_output.bias", Cut::RankZero},
    {"attn_sinks.weight", Cut::QHeadSinks},
    {"ffn_gate.weight", Cut::Ffn},          {"ffn_up.weight", Cut::Ffn},
    {"ffn_down.weight", Cut::FfnCols},
    {"ffn_gate_exps.weight", Cut::ExpertFfn}, {"ffn_up_exps.weight", Cut::ExpertFfn},
    {"ffn_down_exps.weight", Cut::ExpertFfnCols},
    {"ffn_gate_exps.bias", Cut::ExpertFfn},   {"ffn_up_exps.bias", Cut::ExpertFfn},
    {"ffn_down_exps.bias", Cut::RankZero},
    {"ffn_gate_shexp.weight", Cut::SharedFfn}, {"ffn_up_shexp.weight", Cut::SharedFfn},
    {"ffn_down_shexp.weight", Cut::SharedFfnCols},
};

Cut cut_of(std::string_view name) {
  if (name == "token_embd.weight" || name == "output.weight") return Cut::Vocab;
  if (!name.starts_with("blk.")) return Cut::Whole;
  const size_t dot = name.find('.', 4);
  if (dot == std::string_view::npos) return Cut::Whole;
  const std::string_view suffix = name.substr(dot + 1);
  for (const CutRule& r : kLayerRules) {
    if (suffix == r.suffix) return r.cut;
  }
  return Cut::Whole;
}

}  // namespace

ShardedWeightSource::ShardedWeightSource(const WeightSource& inner, TpShardPlan plan, HeadSizes heads)
    : inner_(inner), plan_(std::move(plan)), heads_(heads) {}

std::vector<IndexRange> ShardedWeightSource::head_rows(const std::vector<int32_t>& heads, int64_t per_head) const {
  std::vector<IndexRange> out;
  for (int32_t h : heads) {
    const IndexRange r{h * per_head, (h + 1) * per_head};
    if (!out.empty() && out.back().end == r.begin) {
      out.back().end = r.end;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::optional<Tensor> ShardedWeightSource::find(std::string_view name) const {
  std::optional<Tensor> t = inner_.find(name);
  if (!t) return t;
  const Tensor& w = *t;
  const int last = w.ndim() - 1;
  std::vector<int32_t> q_heads(plan_.q_heads.size());
  std::iota(q_heads.begin(), q_heads.end(), static_cast<int32_t>(plan_.q_heads.begin));
  Cut cut = cut_of(name);
  if (plan_.expert_parallel && (cut == Cut::ExpertFfn || cut == Cut::ExpertFfnCols || cut == Cut::SharedFfn ||
                                cut == Cut::SharedFfnCols || name.ends_with("ffn_down_exps.bias"))) {
    cut = Cut::Whole;  // experts travel whole (expert_parallel.h)
  }
  switch (cut) {
    case Cut::Whole:
      return w;
    case Cut::QHeads:
      return slice(name, w, 0, head_rows(q_heads, heads_.q));
    case Cut::KvHeads:
      return slice(name, w, 0, head_rows(plan_.kv_heads, heads_.kv));
    case Cut::KvbHeads:
      return slice(name, w, 0, head_rows(q_heads, heads_.kv));
    case Cut::QHeadCols:
      return slice(name, w, last, head_rows(q_heads, heads_.out));
    case Cut::QHeadSinks:
      return slice(name, w, 0, {plan_.q_heads});
    case Cut::Ffn:
      return slice(name, w, 0, {plan_.ffn});
    case Cut::FfnCols:
      return slice(name, w, last, {plan_.ffn});
    case Cut::ExpertFfn:
      return slice(name, w, 1, {plan_.expert_ffn});
    case Cut::ExpertFfnCols:
      return slice(name, w, last, {plan_.expert_ffn});
    case Cut::SharedFfn:
      return slice(name, w, 0, {plan_.shared_ffn});
    case Cut::SharedFfnCols:
      return slice(name, w, last, {plan_.shared_ffn});
    case Cut::Vocab:
      return slice(name, w, 0, {plan_.vocab});
    case Cut::RankZero:
      return plan_.rank == 0 ? w : zeros_like(w);
  }
  return w;
}

Tensor ShardedWeightSource::zeros_like(const Tensor& t) const {
  DI_CHECK(!is_quantized(t.dtype()), "tensor parallelism: no zero copy of a quantised {}", t.describe());
  std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
  std::vector<uint8_t>& bytes = owned_.emplace_back(t.numel() * dtype_info(t.dtype()).block_bytes, 0);
  return Tensor(bytes.data(), t.dtype(), shape);
}

Tensor ShardedWeightSource::slice(std::string_view name, const Tensor& t, int dim,
                                  const std::vector<IndexRange>& ranges) const {
  DI_CHECK(dim >= 0 && dim < t.ndim(), "tensor parallelism: '{}' is {}, too few dimensions to cut", name,
           t.describe());
  int64_t total = 0;
  for (const IndexRange& r : ranges) {
    DI_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= t.size(dim),
             "tensor parallelism: '{}' is {}, its dimension {} has no elements [{}, {})", name, t.describe(), dim,
             r.begin, r.end);
    total += r.size();
  }
  if (dim == 0 && ranges.size() == 1) return t.narrow(0, ranges[0].begin, ranges[0].size());

  const int last = t.ndim() - 1;
  const DType dtype = t.dtype();
  const int64_t block = dtype_info(dtype).block_elems;
  // Byte ranges taken of each innermost row: all of it, or (cutting the
  // innermost dimension) the ranges, in whole blocks of a quantised dtype.
  struct Chunk {
    size_t offset, bytes;
  };
  std::vector<Chunk> chunks;
  if (dim == last && dtype == DType::F8E4M3_B64 && t.is_contiguous()) {
    // FP8 row blocks cut inside a block (a row-parallel width that is not a
    // multiple of 64, e.g. Qwen3-30B-A3B's 768-wide experts over 8 ranks):
    // this weight is cut from its values rounded to bf16, as an FP8
    // checkpoint's weights were before they stayed FP8.
    const bool whole_blocks = std::all_of(ranges.begin(), ranges.end(), [&](const IndexRange& r) {
      return r.begin % block == 0 && r.end % block == 0;
    });
    if (!whole_blocks) {
      const std::vector<char> bf16 = dequantize_rows(t, DType::BF16);
      std::vector<uint8_t>& held = owned_.emplace_back(bf16.begin(), bf16.end());
      return slice(name, Tensor(held.data(), DType::BF16, t.shape()), dim, ranges);
    }
  }
  if (dim == last) {
    for (const IndexRange& r : ranges) {
      DI_CHECK(r.begin % block == 0 && r.end % block == 0,
               "--tensor-parallel-size {}: '{}' ({}) would be cut inside a {}-element block of {}", plan_.size, name,
               t.describe(), block, dtype_name(dtype));
      chunks.push_back({row_bytes(dtype, r.begin), row_bytes(dtype, r.size())});
    }
  } else {
    chunks.push_back({0, row_bytes(dtype, t.size(last))});
  }
  size_t row_out = 0;
  for (const Chunk& c : chunks) row_out += c.bytes;
  // The source index along `dim` of each index of the slice.
  std::vector<int64_t> picked;
  if (dim < last) {
    for (const IndexRange& r : ranges) {
      for (int64_t i = r.begin; i < r.end; ++i) picked.push_back(i);
    }
  }
  // Innermost rows in the slice's row-major order; each read at its own
  // strided address (the source may be a strided view, e.g. the gate rows
  // of an interleaved gate-up stack).
  int64_t rows = 1;
  for (int d = 0; d < last; ++d) rows *= d == dim ? total : t.size(d);
  std::vector<uint8_t>& bytes = owned_.emplace_back(static_cast<size_t>(rows) * row_out);
  uint8_t* dst = bytes.data();
  for (int64_t row = 0; row < rows; ++row) {
    const char* src = static_cast<const char*>(t.data());
    int64_t rest = row;
    for (int d = last - 1; d >= 0; --d) {
      const int64_t extent = d == dim ? total : t.size(d);
      const int64_t i = rest % extent;
      rest /= extent;
      src += (d == dim ? picked[static_cast<size_t>(i)] : i) * t.stride_bytes(d);
    }
    for (const Chunk& c : chunks) {
      std::memcpy(dst, src + c.offset, c.bytes);
      dst += c.bytes;
    }
  }
  std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
  shape[dim] = total;
  return Tensor(bytes.data(), dtype, shape);
}

int64_t tp_ffn_unit(const WeightSource& source, const ModelConfig& c) {
  int64_t unit = 1;
  for (int i = 0; i < c.n_layers; ++i) {
    for (const char* suffix : {"ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight"}) {
      if (auto t = source.find("blk." + std::to_string(i) + "." + suffix)) {
        unit = std::max<int64_t>(unit, dtype_info(t->dtype()).block_elems);
      }
    }
  }
  return unit;
}

void TpForward::embed(Backend& backend, const Tensor& table, const Tensor& ids, int64_t vocab, Tensor out) const {
  if (!active()) {
    ops::embedding(backend, table, ids, out);
    return;
  }
  ops::embedding_slice(backend, table, ids, plan_.vocab.begin, vocab, out);
  reduce(out);
}

void TpForward::reduce(Tensor t) const {
  if (active()) tp_.comm->all_reduce(t);
}

size_t TpForward::logits_scratch_floats(int64_t rows) const {
  return static_cast<size_t>(rows) * static_cast<size_t>(plan_.vocab_max) * (1 + static_cast<size_t>(tp_.size));
}

void TpForward::logits(Backend& backend, const Tensor& h_rows, const Tensor& output, Tensor logits,
                       const Buffer& workspace, size_t offset) const {
  if (!active()) {
    ops::linear(backend, h_rows, output, Tensor(), logits);
    return;
  }
  const int64_t R = h_rows.size(0), V_max = plan_.vocab_max, vocab = logits.size(1);
  if (R == 0) return;
  float* scratch =
      workspace.view(DType::F32, {static_cast<int64_t>(logits_scratch_floats(R))}, offset).data_as<float>();
  DI_CHECK(logits.is_contiguous() && logits.dtype() == DType::F32 && vocab == plan_.vocab_size,
           "tensor-parallel logits must be a contiguous f32 [rows, vocab], got {}", logits.describe());
  // Every rank sends R x V_max floats (its R x V_r logits first): equal sizes
  // for the all-gather, whatever the slices.
  const Device dev = logits.device();
  const Tensor mine(scratch, DType::F32, {R * V_max}, dev);
  const Tensor all(scratch + R * V_max, DType::F32, {R * V_max * tp_.size}, dev);
  ops::linear(backend, h_rows, output, Tensor(), mine.narrow(0, 0, R * plan_.vocab.size()).reshape({R, plan_.vocab.size()}));
  tp_.comm->all_gather(mine, all);
  const size_t pitch = static_cast<size_t>(vocab) * sizeof(float);
  for (int r = 0; r < tp_.size; ++r) {
    const IndexRange v = plan_.vocab_of(r);
    const float* src = all.data_as<const float>() + static_cast<size_t>(r) * R * V_max;
    backend.copy_rows_async(logits.data_as<float>() + v.begin, pitch, src, v.size() * sizeof(float),
                            v.size() * sizeof(float), R);
  }
}

RankShard shard_for_rank(ModelConfig& config, const WeightSource& full, TensorParallel tp) {
  DI_CHECK(tp.active() && tp.comm != nullptr, "tensor parallelism without a communicator");
  RankShard shard;
  shard.forward = TpForward(tp, TpShardPlan::make(config, tp.rank, tp.size, tp_ffn_unit(full, config),
                                                  tp.expert_parallel()));
  shard.source = std::make_unique<ShardedWeightSource>(full, shard.forward.plan(), HeadSizes::of(config));
  config = shard.forward.plan().local_config(config);
  config.validate();
  return shard;
}

}  // namespace deepinfer
