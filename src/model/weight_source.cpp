#include "model/weight_source.h"

#include <cmath>
#include <cstring>
#include <regex>

#include "core/error.h"
#include "core/fp8.h"
#include "core/fp8_blocks.h"
#include "core/half.h"
#include "loader/gguf.h"
#include "loader/hf_checkpoint.h"
#include "model/fp8_weights.h"

namespace deepinfer {

Tensor WeightSource::get(std::string_view canonical_name) const {
  auto t = find(canonical_name);
  DI_CHECK(t.has_value(), "model file has no tensor '{}'", canonical_name);
  return *t;
}

Tensor WeightSource::get(std::string_view canonical_name, std::initializer_list<int64_t> shape) const {
  Tensor t = get(canonical_name);
  bool ok = t.ndim() == static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) ok = ok && t.size(i++) == s;
  std::string want;
  for (int64_t s : shape) want += fmt::format("{}{}", want.empty() ? "" : ", ", s);
  DI_CHECK(ok, "tensor '{}' is {}, expected shape [{}]", canonical_name, t.describe(), want);
  return t;
}

Tensor WeightSource::get_experts(std::string_view canonical_name, int64_t experts, int64_t rows, int64_t cols) const {
  Tensor t = get(canonical_name);
  DI_CHECK(t.ndim() == 3 && t.size(0) == experts, "tensor '{}' is {}: expected {} experts (config) of [{}, {}]",
           canonical_name, t.describe(), experts, rows, cols);
  return get(canonical_name, {experts, rows, cols});
}

std::optional<Tensor> GgufWeightSource::find(std::string_view canonical_name) const {
  const GgufTensorInfo* info = file_.find_tensor(canonical_name);
  if (!info) return std::nullopt;
  return file_.tensor(*info);
}

namespace {

// Per-layer names: Hugging Face suffix after "layers.N." -> canonical suffix after "blk.N.".
struct LayerName {
  const char* hf;
  const char* canonical;
};
constexpr LayerName kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    // Mixture of experts: router, Qwen2-MoE's shared expert and its gate.
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
    // DeepSeek-V2/V3: Multi-head Latent Attention (llama.cpp's deepseek2 names),
    // shared experts without a gate, V3's router correction bias.
    {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
    {"self_attn.q_a_proj.bias", "attn_q_a.bias"},
    {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
    {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
    {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
    {"self_attn.kv_a_proj_with_mqa.bias", "attn_kv_a_mqa.bias"},
    {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
    {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
    {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
    {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
    // DeepSeek-V3's multi-token-prediction layers (llama.cpp's nextn names).
    {"enorm.weight", "nextn.enorm.weight"},
    {"hnorm.weight", "nextn.hnorm.weight"},
    {"eh_proj.weight", "nextn.eh_proj.weight"},
    {"shared_head.norm.weight", "nextn.shared_head_norm.weight"},
    {"shared_head.head.weight", "nextn.shared_head_head.weight"},
    {"embed_tokens.weight", "nextn.embed_tokens.weight"},
    // gpt-oss: output projection bias, attention sinks, biased router.
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.sinks", "attn_sinks.weight"},
    {"mlp.router.weight", "ffn_gate_inp.weight"},
    {"mlp.router.bias", "ffn_gate_inp.bias"},
};

// Per-expert matrices: Hugging Face name after "experts.E." -> canonical stack.
constexpr LayerName kExpertNames[] = {
    {"w1.weight", "ffn_gate_exps.weight"},        {"w3.weight", "ffn_up_exps.weight"},
    {"w2.weight", "ffn_down_exps.weight"},        {"gate_proj.weight", "ffn_gate_exps.weight"},
    {"up_proj.weight", "ffn_up_exps.weight"},     {"down_proj.weight", "ffn_down_exps.weight"},
};

}  // namespace

HfWeightSource::HfWeightSource(const HfCheckpoint& checkpoint, bool post_attention_is_ffn_norm,
                               HfExpertLayout expert_layout)
    : checkpoint_(checkpoint) {
  // Multimodal wrappers nest the text model (e.g. "language_model.model.layers...").
  static const std::regex kLayer(R"(^(?:.*\.)?layers\.(\d+)\.(.+)$)");
  static const std::regex kExpert(R"(^(?:mlp|block_sparse_moe)\.experts\.(\d{1,6})\.(.+)$)");
  static const std::regex kStacked(R"(^(?:mlp|block_sparse_moe)\.experts\.(gate_up_proj|down_proj)$)");
  static const std::regex kStackedBias(R"(^mlp\.experts\.(gate_up_proj|down_proj)_bias$)");
  static const std::regex kMxfp4(R"(^mlp\.experts\.(gate_up_proj|down_proj)_(blocks|scales)$)");
  const bool interleaved = expert_layout == HfExpertLayout::InOutInterleaved;
  using Part = ExpertStack::Part;
  for (const std::string& hf : checkpoint.tensor_names()) {
    std::smatch m;
    if (std::regex_match(hf, m, kLayer)) {
      const std::string suffix = m[2];
      const std::string block = "blk." + std::string(m[1]) + ".";
      std::smatch e;
      if (std::regex_match(suffix, e, kExpert)) {
        for (const auto& n : kExpertNames) {
          if (e[2] == n.hf) expert_stacks_[block + n.canonical].per_expert[std::stoi(e[1])] = hf;
        }
        continue;
      }
      DI_CHECK(!std::regex_match(suffix, e, kMxfp4),
               "tensor '{}': MXFP4-quantised experts (as the published gpt-oss checkpoints store them) are not "
               "supported yet; use a bf16/f32 checkpoint",
               hf);
      if (std::regex_match(suffix, e, kStacked)) {
        if (e[1] == "gate_up_proj") {
          expert_stacks_[block + "ffn_gate_exps.weight"] = {{}, hf, interleaved ? Part::GateEven : Part::GateHalf,
                                                            interleaved};
          expert_stacks_[block + "ffn_up_exps.weight"] = {{}, hf, interleaved ? Part::UpOdd : Part::UpHalf,
                                                          interleaved};
        } else {
          expert_stacks_[block + "ffn_down_exps.weight"] = {{}, hf, Part::Whole, interleaved};
        }
        continue;
      }
      if (interleaved && std::regex_match(suffix, e, kStackedBias)) {
        if (e[1] == "gate_up_proj") {
          expert_stacks_[block + "ffn_gate_exps.bias"] = {{}, hf, Part::GateEven, false};
          expert_stacks_[block + "ffn_up_exps.bias"] = {{}, hf, Part::UpOdd, false};
        } else {
          expert_stacks_[block + "ffn_down_exps.bias"] = {{}, hf, Part::Whole, false};
        }
        continue;
      }
      std::string canonical;
      if (suffix == "post_attention_layernorm.weight") {
        canonical = post_attention_is_ffn_norm ? "ffn_norm.weight" : "post_attention_norm.weight";
      } else {
        for (const auto& n : kLayerNames) {
          if (suffix == n.hf) canonical = n.canonical;
        }
      }
      if (!canonical.empty()) canonical_to_hf_["blk." + std::string(m[1]) + "." + canonical] = hf;
      continue;
    }
    auto ends_with = [&](std::string_view s) {
      return hf.size() >= s.size() && hf.compare(hf.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with("embed_tokens.weight")) {
      canonical_to_hf_["token_embd.weight"] = hf;
    } else if (hf == "lm_head.weight" || ends_with(".lm_head.weight")) {
      canonical_to_hf_["output.weight"] = hf;
    } else if (ends_with("model.norm.weight") || hf == "norm.weight") {
      canonical_to_hf_["output_norm.weight"] = hf;
    }
  }
}

std::optional<Tensor> HfWeightSource::find(std::string_view canonical_name) const {
  const std::string name(canonical_name);
  if (auto it = canonical_to_hf_.find(name); it != canonical_to_hf_.end()) {
    return file_tensor(it->second, fp8_linear_weight(canonical_name) ? Fp8Form::Blocks : Fp8Form::Bf16);
  }
  auto stack = expert_stacks_.find(name);
  if (stack == expert_stacks_.end()) return std::nullopt;
  return stack_experts(name, stack->second);
}

Tensor HfWeightSource::file_tensor(const std::string& hf_name, Fp8Form form) const {
  Tensor t = checkpoint_.tensor(hf_name);
  if (t.dtype() != DType::F8E4M3) return t;
  DI_CHECK(t.ndim() == 2 && t.is_contiguous(), "FP8 tensor '{}' is {}: expected a contiguous matrix", hf_name,
           t.describe());
  // Converted before (find() is asked twice: has(), then get()).
  if (form == Fp8Form::Blocks) {
    if (auto it = owned_stacks_.find(hf_name + "#blocks"); it != owned_stacks_.end()) return it->second.view;
  }
  if (auto it = owned_stacks_.find(hf_name + "#dequantized"); it != owned_stacks_.end()) return it->second.view;
  const Fp8Scales scales = fp8_scales(hf_name, t);
  // Row blocks of 64 take the codes as they are when each lies inside one
  // of the checkpoint's scale blocks.
  const int64_t cols = t.size(1);
  if (form == Fp8Form::Blocks && cols % kF8BlockElems == 0 && scales.block_cols % kF8BlockElems == 0) {
    return fp8_blocks(hf_name, t, scales);
  }
  return dequantized_fp8(hf_name, t, scales);
}

HfWeightSource::Fp8Scales HfWeightSource::fp8_scales(const std::string& hf_name, const Tensor& w) const {
  const int64_t rows = w.size(0), cols = w.size(1);
  Fp8Scales scales;
  scales.block_rows = rows;
  scales.block_cols = cols;
  auto read_scale = [&](const std::string& name) {
    const Tensor s = checkpoint_.tensor(name);
    DI_CHECK(s.is_contiguous() && (s.dtype() == DType::F32 || s.dtype() == DType::BF16),
             "FP8 scale '{}' is {}: expected contiguous f32 or bf16", name, s.describe());
    scales.values.resize(static_cast<size_t>(s.numel()));
    for (int64_t i = 0; i < s.numel(); ++i) {
      scales.values[static_cast<size_t>(i)] = s.dtype() == DType::F32 ? s.data_as<const float>()[i]
                                                                      : bf16_to_f32(s.data_as<const uint16_t>()[i]);
    }
    return s;
  };
  if (checkpoint_.has_tensor(hf_name + "_scale_inv")) {
    scales.block_rows = scales.block_cols = 128;
    const nlohmann::json& q = checkpoint_.config().value("quantization_config", nlohmann::json::object());
    if (auto b = q.find("weight_block_size"); b != q.end()) {
      DI_CHECK(b->is_array() && b->size() == 2 && (*b)[0].is_number_integer() && (*b)[1].is_number_integer() &&
                   (*b)[0].get<int64_t>() > 0 && (*b)[1].get<int64_t>() > 0,
               "quantization_config.weight_block_size must be two positive integers, got {}", b->dump());
      scales.block_rows = (*b)[0].get<int64_t>();
      scales.block_cols = (*b)[1].get<int64_t>();
    }
    const Tensor s = read_scale(hf_name + "_scale_inv");
    const int64_t want_r = (rows + scales.block_rows - 1) / scales.block_rows;
    const int64_t want_c = (cols + scales.block_cols - 1) / scales.block_cols;
    DI_CHECK(s.ndim() == 2 && s.size(0) == want_r && s.size(1) == want_c,
             "FP8 scale '{}_scale_inv' is {}: {} x {} blocks of {} x {} need [{}, {}]", hf_name, s.describe(), rows,
             cols, scales.block_rows, scales.block_cols, want_r, want_c);
  } else {
    DI_CHECK(checkpoint_.has_tensor(hf_name + "_scale"),
             "FP8 tensor '{}' has no scale ('{}_scale_inv' per block or '{}_scale' per tensor or channel)", hf_name,
             hf_name, hf_name);
    read_scale(hf_name + "_scale");
    DI_CHECK(scales.values.size() == 1 || static_cast<int64_t>(scales.values.size()) == rows,
             "FP8 scale '{}_scale' holds {} values: one per tensor or one per each of the {} output rows", hf_name,
             scales.values.size(), rows);
    scales.block_rows = scales.values.size() == 1 ? rows : 1;
  }
  scales.scale_cols = (cols + scales.block_cols - 1) / scales.block_cols;
  return scales;
}

Tensor HfWeightSource::dequantized_fp8(const std::string& hf_name, const Tensor& w, const Fp8Scales& scales) const {
  const std::string key = hf_name + "#dequantized";
  if (auto it = owned_stacks_.find(key); it != owned_stacks_.end()) return it->second.view;
  const int64_t rows = w.size(0), cols = w.size(1);
  OwnedStack& owned = own(key, DType::BF16, {rows, cols});
  auto* dst = reinterpret_cast<uint16_t*>(owned.bytes.data());
  const auto* src = w.data_as<const uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = f8e4m3_to_f32(src[r * cols + c]) * scales.at(r, c);
      DI_CHECK(std::isfinite(v), "FP8 tensor '{}': element ({}, {}) is not finite after scaling", hf_name, r, c);
      dst[r * cols + c] = f32_to_bf16(v);
    }
  }
  return owned.view;
}

Tensor HfWeightSource::fp8_blocks(const std::string& hf_name, const Tensor& w, const Fp8Scales& scales) const {
  const std::string key = hf_name + "#blocks";
  if (auto it = owned_stacks_.find(key); it != owned_stacks_.end()) return it->second.view;
  const int64_t rows = w.size(0), cols = w.size(1), blocks_per_row = cols / kF8BlockElems;
  OwnedStack& owned = own(key, DType::F8E4M3_B64, {rows, cols});
  auto* dst = reinterpret_cast<F8Block*>(owned.bytes.data());
  const auto* src = w.data_as<const uint8_t>();
  std::vector<float> row_scales(static_cast<size_t>(blocks_per_row));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks_per_row; ++b) row_scales[static_cast<size_t>(b)] = scales.at(r, b * kF8BlockElems);
    const int64_t bad = pack_f8_blocks(src + r * cols, row_scales.data(), dst + r * blocks_per_row, cols);
    if (bad >= 0) fail("FP8 tensor '{}': element ({}, {}) is not finite (a NaN code)", hf_name, r, bad);
    if (bad <= -2) {
      fail("FP8 tensor '{}': the scale of element ({}, {}) is not finite", hf_name, r, (-2 - bad) * kF8BlockElems);
    }
  }
  return owned.view;
}

HfWeightSource::OwnedStack& HfWeightSource::own(const std::string& key, DType dtype,
                                                std::initializer_list<int64_t> shape) const {
  OwnedStack& owned = owned_stacks_[key];
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  owned.bytes.resize(row_bytes(dtype, n));
  owned.view = Tensor(owned.bytes.data(), dtype, shape);
  return owned;
}

// [E, in, out] from the file -> an owned [E, out, in] copy (linear's layout).
Tensor HfWeightSource::transposed_stack(const std::string& hf_name) const {
  const std::string key = hf_name + "#transposed";
  if (auto it = owned_stacks_.find(key); it != owned_stacks_.end()) return it->second.view;
  const Tensor t = file_tensor(hf_name);
  DI_CHECK(t.ndim() == 3 && t.is_contiguous(), "tensor '{}' is {}, expected a contiguous [experts, in, out]", hf_name,
           t.describe());
  DI_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16 || t.dtype() == DType::F16,
           "tensor '{}' is {}: expert stacks stored [in, out] must be f32, bf16 or f16", hf_name, t.describe());
  const int64_t experts = t.size(0), in = t.size(1), out = t.size(2);
  OwnedStack& owned = own(key, t.dtype(), {experts, out, in});
  const size_t es = row_bytes(t.dtype(), 1);
  const auto* src = static_cast<const uint8_t*>(t.data());
  uint8_t* dst = owned.bytes.data();
  for (int64_t e = 0; e < experts; ++e) {
    const size_t base = static_cast<size_t>(e * in * out) * es;
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t o = 0; o < out; ++o) {
        std::memcpy(dst + base + static_cast<size_t>(o * in + i) * es, src + base + static_cast<size_t>(i * out + o) * es,
                    es);
      }
    }
  }
  return owned.view;
}

// gpt-oss's interleaved gate/up: rows 2f / 2f+1 of the transposed matrix
// stack (strided views, no copy), columns 2f / 2f+1 of the bias stack (copied).
Tensor HfWeightSource::interleaved_part(const std::string& canonical, const ExpertStack& stack) const {
  const bool gate = stack.part == ExpertStack::Part::GateEven;
  if (stack.transposed) {
    const Tensor t = transposed_stack(stack.stacked);
    DI_CHECK(t.size(1) % 2 == 0, "tensor '{}' is [in, out] = {}: interleaved gate/up need an even output count",
             stack.stacked, t.describe());
    const int64_t hidden = t.size(2);
    return t.reshape({t.size(0), t.size(1) / 2, 2 * hidden}).narrow(2, gate ? 0 : hidden, hidden);
  }
  if (auto it = owned_stacks_.find(canonical); it != owned_stacks_.end()) return it->second.view;
  const Tensor t = file_tensor(stack.stacked);
  DI_CHECK(t.ndim() == 2 && t.size(1) % 2 == 0 && t.is_contiguous(),
           "tensor '{}' is {}, expected a contiguous [experts, 2 x ffn] bias stack", stack.stacked, t.describe());
  DI_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16 || t.dtype() == DType::F16,
           "tensor '{}' is {}: expected a float bias stack", stack.stacked, t.describe());
  const int64_t experts = t.size(0), ffn = t.size(1) / 2;
  OwnedStack& owned = own(canonical, t.dtype(), {experts, ffn});
  const size_t es = row_bytes(t.dtype(), 1);
  const auto* src = static_cast<const uint8_t*>(t.data());
  for (int64_t i = 0; i < experts * ffn; ++i) {
    std::memcpy(owned.bytes.data() + static_cast<size_t>(i) * es, src + static_cast<size_t>(2 * i + (gate ? 0 : 1)) * es,
                es);
  }
  return owned.view;
}

Tensor HfWeightSource::stack_experts(const std::string& canonical, const ExpertStack& stack) const {
  if (!stack.stacked.empty()) {
    if (stack.part == ExpertStack::Part::GateEven || stack.part == ExpertStack::Part::UpOdd) {
      return interleaved_part(canonical, stack);
    }
    if (stack.transposed) return transposed_stack(stack.stacked);
    Tensor t = file_tensor(stack.stacked);
    if (t.ndim() == 2 && stack.part == ExpertStack::Part::Whole) return t;  // a bias stack
    DI_CHECK(t.ndim() == 3, "tensor '{}' is {}, expected [experts, rows, cols]", stack.stacked, t.describe());
    if (stack.part == ExpertStack::Part::Whole) return t;
    const int64_t half = t.size(1) / 2;
    DI_CHECK(t.size(1) % 2 == 0, "tensor '{}' is {}: a gate_up stack needs an even row count", stack.stacked,
             t.describe());
    return t.narrow(1, stack.part == ExpertStack::Part::GateHalf ? 0 : half, half);
  }
  if (auto it = owned_stacks_.find(canonical); it != owned_stacks_.end()) return it->second.view;
  // Experts are numbered 0..E-1; a gap means a tensor is missing.
  const int n_experts = stack.per_expert.rbegin()->first + 1;
  const Tensor first = file_tensor(stack.per_expert.begin()->second, Fp8Form::Blocks);
  DI_CHECK(first.ndim() == 2, "tensor '{}' is {}, expected a matrix", stack.per_expert.begin()->second,
           first.describe());
  for (int e = 0; e < n_experts; ++e) {
    DI_CHECK(stack.per_expert.count(e), "model file lacks expert {} of '{}' (has {} of experts 0..{})", e, canonical,
             stack.per_expert.size(), n_experts - 1);
  }
  OwnedStack& owned = owned_stacks_[canonical];
  const size_t expert_bytes = first.nbytes();
  owned.bytes.resize(expert_bytes * static_cast<size_t>(n_experts));
  for (const auto& [e, hf] : stack.per_expert) {
    const Tensor t = file_tensor(hf, Fp8Form::Blocks);
    DI_CHECK(t.dtype() == first.dtype() && t.ndim() == 2 && t.size(0) == first.size(0) && t.size(1) == first.size(1),
             "tensor '{}' is {}, unlike the other experts' {}", hf, t.describe(), first.describe());
    DI_CHECK(t.is_contiguous(), "tensor '{}' is not contiguous", hf);
    std::memcpy(owned.bytes.data() + expert_bytes * static_cast<size_t>(e), t.data(), expert_bytes);
  }
  owned.view = Tensor(owned.bytes.data(), first.dtype(), {n_experts, first.size(0), first.size(1)});
  return owned.view;
}

}  // namespace deepinfer
