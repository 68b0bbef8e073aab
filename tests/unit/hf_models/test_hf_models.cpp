// Hugging Face checkpoints (config.json + safetensors) against transformers, on
// tiny random models of every dense architecture the engine claims. Data:
// tests/data/hf_tiny/<case>/, produced by scripts/gen_hf_tiny_reference.py
// (transformers, eager attention, float32 compute).
//
// Each case is loaded twice: with the config.json transformers >= 5 wrote
// (rotary settings under "rope_parameters") and with config_legacy.json, the
// same configuration spelled as older transformers wrote it (top-level
// "rope_theta", "rope_scaling", "rope_local_base_freq"), which most Hub
// checkpoints still use.
//
// Tolerances. Both sides compute in float32 on the same weights (the bf16
// case's reference is computed in f32 from the bf16-rounded weights), so the
// only difference is summation order: for these sizes (hidden 64, 2-3 layers)
// that is ~1e-6 relative to the logit scale. The tolerance, 1e-4 x the
// largest |logit|, leaves room for other kernels (SIMD, blocked GEMM) and is
// still at least 10x below the change that dropping any single architectural
// detail causes (the reference's "sensitivity" entries; checked below), so a
// missing rope scaling, window or bias cannot pass.
// Greedy continuations must agree token for token up to the first reference
// step whose top-1/top-2 margin is below kNearTie (the reference records the
// margins; near-ties are reported).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "backend/backend.h"
#include "engine/engine.h"
#include "kv/kv_storage.h"
#include "model/model_loader.h"
#include "runner/model_runner.h"
#include "sched/request.h"
#include "../../support/greedy_reference.h"
#include "../../support/prompt_logits.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

const fs::path kData = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "hf_tiny";
constexpr double kRelTolerance = 1e-4;
constexpr double kNearTie = 0.01;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  EXPECT_TRUE(f.good()) << p;
  return nlohmann::json::parse(f);
}

// A checkpoint folder whose config.json is the requested flavour: the case's
// own folder for "v5", a temporary copy with config_legacy.json for "legacy".
class CheckpointDir {
 public:
  CheckpointDir(const std::string& name, const std::string& flavour) {
    const fs::path src = kData / name;
    if (flavour == "v5") {
      path_ = src;
      return;
    }
    path_ = fs::temp_directory_path() / fmt::format("deepinfer_hf_tiny_{}_{}", getpid(), name);
    fs::remove_all(path_);
    fs::create_directories(path_);
    for (const auto& e : fs::directory_iterator(src)) {
      const std::string f = e.path().filename().string();
      if (e.path().extension() == ".safetensors" || f == "model.safetensors.index.json") {
        fs::copy_file(e.path(), path_ / f);
      }
    }
    fs::copy_file(src / "config_legacy.json", path_ / "config.json");
    temporary_ = true;
  }
  ~CheckpointDir() {
    std::error_code ec;
    if (temporary_) fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
  bool temporary_ = false;
};

using deepinfer::testing::prompt_logits;

double tolerance(const nlohmann::json& prompt) {
  return kRelTolerance * std::max(1.0, prompt["max_abs_logit"].get<double>());
}

using Param = std::tuple<std::string, std::string>;  // case, config flavour

class HfTinyModel : public ::testing::TestWithParam<Param> {};

TEST_P(HfTinyModel, LastPositionLogitsMatchTransformers) {
  const auto& [name, flavour] = GetParam();
  const nlohmann::json ref = read_json(kData / name / "reference.json");
  const size_t vocab = ref["vocab_size"].get<size_t>();
  CheckpointDir dir(name, flavour);
  auto backend = create_backend(DeviceType::CPU);
  auto loaded = LoadedModel::open(dir.path(), *backend);
  ASSERT_EQ(loaded->format(), CheckpointFormat::HuggingFace);
  ASSERT_EQ(static_cast<size_t>(loaded->config().vocab_size), vocab);
  for (const auto& p : ref["prompts"]) {
    const auto expected = p["logits"].get<std::vector<float>>();
    ASSERT_EQ(expected.size(), vocab);
    const auto ours = prompt_logits(*loaded, *backend, p["tokens"].get<std::vector<int32_t>>());
    ASSERT_EQ(ours.size(), vocab);
    double max_diff = 0;
    for (size_t i = 0; i < vocab; ++i) max_diff = std::max(max_diff, std::abs(double(ours[i]) - expected[i]));
    const double tol = tolerance(p);
    std::printf("[hf_tiny] %s (%s config) %s: max-abs %.3g (tolerance %.3g, |logit| up to %.2f)\n", name.c_str(),
                flavour.c_str(), p["name"].get<std::string>().c_str(), max_diff, tol,
                p["max_abs_logit"].get<double>());
    EXPECT_LE(max_diff, tol) << name << "/" << p["name"];
  }
}

TEST_P(HfTinyModel, GreedyContinuationMatchesTransformers) {
  const auto& [name, flavour] = GetParam();
  const nlohmann::json ref = read_json(kData / name / "reference.json");
  CheckpointDir dir(name, flavour);
  EngineConfig c;
  c.model_path = dir.path();
  c.tokenizer_path = (kData / "tokenizer.json").string();
  c.max_model_len = 128;
  c.kv_cache_tokens = 1024;
  Engine engine(c);
  testing::expect_greedy_matches(engine, ref["prompts"], kNearTie, "hf_tiny " + name + " (" + flavour + " config)");
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param);
}

INSTANTIATE_TEST_SUITE_P(Legacy, HfTinyModel,
                         ::testing::Combine(::testing::Values("llama", "llama31_untied", "mistral_window8", "qwen2_bias",
                                                              "qwen3_qknorm", "gemma3", "llama_sharded", "qwen2_bf16"),
                                            ::testing::Values("legacy")),
                         param_name);

INSTANTIATE_TEST_SUITE_P(V5, HfTinyModel,
                         ::testing::Combine(::testing::Values("llama", "llama_sharded"), ::testing::Values("v5")),
                         param_name);

// transformers-5 configs whose rope settings live only in "rope_parameters"
// (rope base other than 10000, Llama 3.1 scaling, Gemma's per-layer-type bases).
INSTANTIATE_TEST_SUITE_P(V5RopeParameters, HfTinyModel,
                         ::testing::Combine(::testing::Values("llama31_untied", "mistral_window8", "qwen2_bias",
                                                              "qwen3_qknorm", "gemma3", "qwen2_bf16"),
                                            ::testing::Values("v5")),
                         param_name);

// Mixture-of-experts models (scripts/gen_hf_moe_reference.py): Mixtral, Qwen2-MoE
// (shared expert, a dense layer) and Qwen3-MoE, with per-expert and stacked
// expert tensors, f32 and bf16. Their data checks are in test_moe_models.
INSTANTIATE_TEST_SUITE_P(Moe, HfTinyModel,
                         ::testing::Combine(::testing::Values("mixtral", "mixtral_fused", "qwen2_moe", "qwen3_moe",
                                                              "qwen3_moe_bf16_fused"),
                                            ::testing::Values("legacy", "v5")),
                         param_name);

// The data must be able to catch a wrong implementation: every recorded
// "sensitivity" (logit change when one detail is dropped) must exceed the
// tolerance tenfold, and the cases must cover what the file claims.
TEST(HfTinyData, ToleranceIsFarBelowEachDetailsEffect) {
  int checked = 0;
  for (const char* name : {"llama31_untied", "mistral_window8", "gemma3"}) {
    const nlohmann::json ref = read_json(kData / name / "reference.json");
    const double tol = tolerance(ref["prompts"].back());
    ASSERT_FALSE(ref["sensitivity_max_abs_logit_change"].empty()) << name;
    for (const auto& [detail, change] : ref["sensitivity_max_abs_logit_change"].items()) {
      EXPECT_GT(change.get<double>(), 10 * tol) << name << ": " << detail;
      ++checked;
    }
  }
  EXPECT_GE(checked, 5);
  EXPECT_TRUE(read_json(kData / "llama_sharded" / "reference.json")["sharded"].get<bool>());
  EXPECT_GT(read_json(kData / "llama_sharded" / "reference.json")["safetensors_files"].size(), 1u);
  EXPECT_EQ(read_json(kData / "qwen2_bf16" / "reference.json")["weights_dtype"], "bfloat16");
  EXPECT_FALSE(read_json(kData / "llama31_untied" / "reference.json")["tie_word_embeddings"].get<bool>());
}

}  // namespace
}  // namespace deepinfer
