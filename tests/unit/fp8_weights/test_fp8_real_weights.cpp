// FP8 on real weights: SmolLM2-135M-Instruct's linear weights (the default
// model's Q4_1 blocks, dequantised to f32: the reference) against the same
// weights quantised to e4m3 row blocks as `--quantization fp8` does, and, for
// scale, rounded to bf16. Teacher-forced over a real text: at every position
// the next-token logits of each model; reported are the top-1 agreement with
// the reference and the largest logit difference. Random tiny weights say
// little about a real model's error; these do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/quants.h"
#include "core/half.h"
#include "kv/kv_storage.h"
#include "loader/gguf.h"
#include "model/arch_registry.h"
#include "model/decoder_model.h"
#include "model/fp8_weights.h"
#include "model/weight_source.h"
#include "runner/model_runner.h"
#include "tokenizer/tokenizer.h"
#include "../../support/prompt_logits.h"
#include "../../support/smollm2_model.h"

namespace deepinfer {
namespace {

// The GGUF's linear weights as f32 (or f32 rounded to bf16) copies; every
// other tensor as the file has it.
class DequantizedLinears final : public WeightSource {
 public:
  DequantizedLinears(const GgufFile& file, bool round_to_bf16) : inner_(file), bf16_(round_to_bf16) {}
  std::optional<Tensor> find(std::string_view name) const override {
    std::optional<Tensor> t = inner_.find(name);
    if (!t || !fp8_linear_weight(name) || !is_quantized(t->dtype())) return t;
    const std::string key(name);
    if (auto it = views_.find(key); it != views_.end()) return it->second;
    const int64_t cols = t->size(t->ndim() - 1), rows = t->numel() / cols;
    std::vector<float>& values = owned_[key];
    values.resize(static_cast<size_t>(rows * cols));
    const cpu::QuantKernels& k = cpu::quant_kernels(t->dtype());
    const size_t in_row = row_bytes(t->dtype(), cols);
    for (int64_t r = 0; r < rows; ++r) {
      float* out = values.data() + r * cols;
      k.dequantize_row(static_cast<const char*>(t->data()) + r * in_row, out, cols);
      if (bf16_) {
        for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_f32(f32_to_bf16(out[c]));
      }
    }
    return views_[key] = Tensor(values.data(), DType::F32, t->shape());
  }

 private:
  GgufWeightSource inner_;
  bool bf16_;
  mutable std::map<std::string, std::vector<float>> owned_;
  mutable std::map<std::string, Tensor> views_;
};

// Next-token logits after every prefix of `tokens` longer than `first`.
std::vector<std::vector<float>> logits_per_position(Model& model, Backend& backend, const std::vector<int32_t>& tokens,
                                                    size_t first) {
  std::vector<std::vector<float>> out;
  for (size_t n = first; n <= tokens.size(); ++n) {
    const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
    out.push_back(testing::prompt_logits(model, backend, prefix));
  }
  return out;
}

struct Agreement {
  int same_top1 = 0, positions = 0;
  double max_diff = 0, mean_diff = 0;
};

Agreement compare(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& ref) {
  Agreement g;
  double sum = 0;
  size_t count = 0;
  for (size_t p = 0; p < ref.size(); ++p) {
    const auto top = [](const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
    g.same_top1 += top(a[p]) == top(ref[p]) ? 1 : 0;
    ++g.positions;
    for (size_t i = 0; i < ref[p].size(); ++i) {
      const double d = std::fabs(static_cast<double>(a[p][i]) - ref[p][i]);
      g.max_diff = std::max(g.max_diff, d);
      sum += d;
      ++count;
    }
  }
  g.mean_diff = sum / static_cast<double>(count);
  return g;
}

TEST(Fp8RealWeights, SmolLM2TopOneAgreesWithTheF32Weights) {
  REQUIRE_SMOLLM2();
  const GgufFile file = GgufFile::open(testing::smollm2_path());
  const std::string arch(file.get_string("general.architecture"));
  const ModelConfig config = find_arch_for_gguf(arch).from_gguf(file, arch);
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(file);
  const std::vector<int32_t> tokens = tokenizer->encode(
      "The river rises in the hills north of the town, runs south through the old market, and meets the sea "
      "twelve miles below the bridge. In spring the snow melts and the water comes up fast; the mill at the "
      "bend has flooded three times since it was built.",
      false);
  ASSERT_GT(tokens.size(), 40u);
  auto backend = create_backend(DeviceType::CPU);
  auto run = [&](std::unique_ptr<WeightSource> source) {
    DecoderModel model(config, *source, *backend);
    std::printf("  weights read per step: %.1f MiB\n", model.weight_bytes() / 1048576.0);
    return logits_per_position(model, *backend, tokens, 8);
  };
  const auto f32 = run(std::make_unique<DequantizedLinears>(file, false));
  const auto bf16 = run(std::make_unique<DequantizedLinears>(file, true));
  auto fp8_source = std::make_unique<Fp8QuantizingSource>(std::make_unique<DequantizedLinears>(file, false));
  const Fp8QuantizingSource* fp8_stats = fp8_source.get();
  const auto fp8 = run(std::move(fp8_source));
  // SmolLM2's rows (576, 1536 wide) are whole 64-element blocks: every
  // linear weight of its 30 layers (7 each) is FP8.
  EXPECT_EQ(fp8_stats->stats().quantized, 7 * config.n_layers);
  EXPECT_EQ(fp8_stats->stats().kept, 0);

  const Agreement g8 = compare(fp8, f32), g16 = compare(bf16, f32);
  std::printf("SmolLM2-135M, %d positions: top-1 = f32's at %d (fp8) / %d (bf16); max |logit diff| %.3f / %.3f, "
              "mean %.4f / %.4f\n",
              g8.positions, g8.same_top1, g16.same_top1, g8.max_diff, g16.max_diff, g8.mean_diff, g16.mean_diff);
  // Measured 43 of 47 (AVX-512); other instruction sets round differently,
  // so the bound leaves a few positions of room.
  EXPECT_GE(g8.same_top1 * 20, g8.positions * 17);  // at least 85%
  EXPECT_GT(g8.mean_diff, g16.mean_diff);          // 3 mantissa bits cost more than bf16's 8
}

}  // namespace
}  // namespace deepinfer
