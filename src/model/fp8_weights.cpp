#include "model/fp8_weights.h"

#include <algorithm>
#include <array>
#include <thread>

#include "core/error.h"
#include "core/fp8_blocks.h"
#include "core/half.h"

namespace deepinfer {

namespace {

// Role names after "blk.N." (the canonical GGUF naming, weight_source.h).
constexpr std::array<std::string_view, 17> kLinearRoles = {
    "attn_q.weight",         "attn_k.weight",        "attn_v.weight",        "attn_qkv.weight",
    "attn_output.weight",    "attn_q_a.weight",      "attn_q_b.weight",      "attn_kv_a_mqa.weight",
    "ffn_gate.weight",       "ffn_up.weight",        "ffn_down.weight",      "ffn_gate_exps.weight",
    "ffn_up_exps.weight",    "ffn_down_exps.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
    "ffn_down_shexp.weight",
};

// Row r of a float tensor as f32.
void row_to_f32(const Tensor& t, int64_t r, int64_t cols, float* out) {
  const char* row = static_cast<const char*>(t.data()) + static_cast<size_t>(r) * row_bytes(t.dtype(), cols);
  switch (t.dtype()) {
    case DType::F32:
      for (int64_t i = 0; i < cols; ++i) out[i] = reinterpret_cast<const float*>(row)[i];
      break;
    case DType::F16:
      for (int64_t i = 0; i < cols; ++i) out[i] = f16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
      break;
    default:
      for (int64_t i = 0; i < cols; ++i) out[i] = bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
      break;
  }
}

}  // namespace

bool fp8_linear_weight(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return false;
  const size_t dot = name.find('.', 4);
  if (dot == std::string_view::npos) return false;
  const std::string_view role = name.substr(dot + 1);
  for (std::string_view r : kLinearRoles) {
    if (role == r) return true;
  }
  return false;
}

WeightQuantization parse_weight_quantization(std::string_view name) {
  if (name.empty() || name == "none") return WeightQuantization::None;
  if (name == "fp8") return WeightQuantization::Fp8;
  fail("--quantization '{}' is not supported: use fp8 (e4m3 weights, one scale per 64 elements of a row) or none",
       name);
}

std::optional<Tensor> Fp8QuantizingSource::find(std::string_view canonical_name) const {
  std::optional<Tensor> t = inner_->find(canonical_name);
  if (!t || !fp8_linear_weight(canonical_name)) return t;
  const std::string name(canonical_name);
  if (auto it = done_.find(name); it != done_.end()) return it->second;
  const DType d = t->dtype();
  const bool is_float = d == DType::F32 || d == DType::F16 || d == DType::BF16;
  const int64_t cols = t->ndim() >= 2 ? t->size(t->ndim() - 1) : 0;
  Tensor result = *t;
  if (is_float && t->is_contiguous() && cols > 0 && cols % kF8BlockElems == 0) {
    result = quantized(name, *t);
  } else {
    ++stats_.kept;
  }
  done_[name] = result;
  return result;
}

Tensor Fp8QuantizingSource::quantized(const std::string& name, const Tensor& t) const {
  const int64_t cols = t.size(t.ndim() - 1), rows = t.numel() / cols;
  std::vector<uint8_t>& bytes = owned_[name];
  bytes.resize(static_cast<size_t>(rows) * row_bytes(DType::F8E4M3_B64, cols));
  auto* blocks = reinterpret_cast<F8Block*>(bytes.data());
  const int64_t blocks_per_row = cols / kF8BlockElems;
  // Rows are independent: split them over the machine's cores (a 70B model
  // holds ~10^11 elements to round).
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(1, rows / 64));
  std::vector<int64_t> bad(static_cast<size_t>(threads), -1);
  auto work = [&](int64_t w) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = w; r < rows; r += threads) {
      row_to_f32(t, r, cols, row.data());
      const int64_t at = quantize_f8_blocks(row.data(), blocks + r * blocks_per_row, cols);
      if (at >= 0) {
        bad[static_cast<size_t>(w)] = r * cols + at;
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < threads; ++w) pool.emplace_back(work, w);
  work(0);
  for (std::thread& th : pool) th.join();
  for (int64_t at : bad) {
    DI_CHECK(at < 0, "--quantization fp8: weight '{}' holds a value that is not finite (element {} of row {})", name,
             at % cols, at / cols);
  }
  ++stats_.quantized;
  stats_.bytes_before += t.nbytes();
  stats_.bytes_after += bytes.size();
  return Tensor(bytes.data(), DType::F8E4M3_B64, t.shape());
}

}  // namespace deepinfer
