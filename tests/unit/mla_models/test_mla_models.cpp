// DeepSeek-V2 / V3 (Multi-head Latent Attention + DeepSeek MoE) from Hugging
// Face checkpoints against transformers, on the tiny random models of
// scripts/gen_hf_mla_reference.py (tests/data/hf_tiny/deepseek_*): last-position
// logits (f32 compute on both sides; tolerance 1e-4 x the largest |logit| as in
// test_hf_models, which each recorded routing/rope detail exceeds tenfold),
// greedy continuations through the Engine, the latent KV cache layout,
// chunked prefill + decode against one-shot prefill, and malformed configs.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "../../support/checkpoint_copy.h"
#include "../../support/greedy_reference.h"
#include "../../support/prompt_logits.h"
#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "kv/kv_storage.h"
#include "model/model_loader.h"
#include "runner/model_runner.h"
#include "sched/request.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using testing::load_error;
using testing::read_json;
using ::testing::HasSubstr;

const fs::path kData = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "hf_tiny";
const char* const kCases[] = {"deepseek_v2_lite", "deepseek_v2", "deepseek_v3"};
constexpr double kRelTolerance = 1e-4;
constexpr double kNearTie = 0.01;

double tolerance(const nlohmann::json& prompt) {
  return kRelTolerance * std::max(1.0, prompt["max_abs_logit"].get<double>());
}

// A copy of a case folder with config_file (edited) as its config.json.
testing::CheckpointCopy case_copy(const std::string& name, const std::string& config_file,
                                  const std::function<void(nlohmann::json&)>& edit = {}) {
  nlohmann::json cfg = read_json(kData / name / config_file);
  if (edit) edit(cfg);
  return testing::CheckpointCopy(kData / name, cfg);
}

using Param = std::tuple<std::string, std::string>;  // case, config flavour ("v5" or "legacy")

class MlaModel : public ::testing::TestWithParam<Param> {
 protected:
  std::string path() {
    const auto& [name, flavour] = GetParam();
    if (flavour == "v5") return (kData / name).string();
    legacy_ = std::make_unique<testing::CheckpointCopy>(kData / name, read_json(kData / name / "config_legacy.json"));
    return legacy_->path();
  }

 private:
  std::unique_ptr<testing::CheckpointCopy> legacy_;
};

TEST_P(MlaModel, LastPositionLogitsMatchTransformers) {
  const auto& [name, flavour] = GetParam();
  const nlohmann::json ref = read_json(kData / name / "reference.json");
  const size_t vocab = ref["vocab_size"].get<size_t>();
  auto backend = create_backend(DeviceType::CPU);
  auto loaded = LoadedModel::open(path(), *backend);
  for (const auto& p : ref["prompts"]) {
    const auto expected = p["logits"].get<std::vector<float>>();
    const auto ours = testing::prompt_logits(*loaded, *backend, p["tokens"].get<std::vector<int32_t>>());
    ASSERT_EQ(ours.size(), vocab);
    double max_diff = 0;
    for (size_t i = 0; i < vocab; ++i) max_diff = std::max(max_diff, std::abs(double(ours[i]) - expected[i]));
    std::printf("[mla] %s (%s config) %s: max-abs %.3g (tolerance %.3g, |logit| up to %.2f)\n", name.c_str(),
                flavour.c_str(), p["name"].get<std::string>().c_str(), max_diff, tolerance(p),
                p["max_abs_logit"].get<double>());
    EXPECT_LE(max_diff, tolerance(p)) << name << "/" << p["name"];
  }
}

TEST_P(MlaModel, GreedyContinuationMatchesTransformers) {
  const auto& [name, flavour] = GetParam();
  const nlohmann::json ref = read_json(kData / name / "reference.json");
  EngineConfig c;
  c.model_path = path();
  c.tokenizer_path = (kData / "tokenizer.json").string();
  c.max_model_len = 128;
  c.kv_cache_tokens = 1024;
  Engine engine(c);
  testing::expect_greedy_matches(engine, ref["prompts"], kNearTie, "mla " + name + " (" + flavour + " config)");
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param);
}

INSTANTIATE_TEST_SUITE_P(DeepSeek, MlaModel,
                         ::testing::Combine(::testing::Values("deepseek_v2_lite", "deepseek_v2", "deepseek_v3"),
                                            ::testing::Values("v5", "legacy")),
                         param_name);

// The data can catch a wrong implementation: every expert is used, routing
// decisions are not near float rounding, each recorded detail (rope scaling,
// mscale, interleaving, group routing, renormalisation, scaling) moves the
// logits far more than the tolerance, and both expert layouts appear.
TEST(MlaData, DetailsMatterAndEveryExpertIsUsed) {
  int sensitivities = 0;
  std::set<std::string> layouts;
  for (const char* name : kCases) {
    const nlohmann::json ref = read_json(kData / name / "reference.json");
    layouts.insert(ref["expert_layout"].get<std::string>());
    for (const auto& layer : ref["expert_hits"]) {
      for (const auto& hits : layer) EXPECT_GT(hits.get<int>(), 0) << name;
    }
    EXPECT_GT(ref["min_router_margin"].get<double>(), 1e-4) << name;
    const double tol = tolerance(ref["prompts"].back());
    for (const auto& [detail, change] : ref["sensitivity_max_abs_logit_change"].items()) {
      EXPECT_GT(change.get<double>(), 10 * tol) << name << ": " << detail;
      ++sensitivities;
    }
  }
  EXPECT_GE(sensitivities, 9);
  EXPECT_EQ(layouts, (std::set<std::string>{"per_expert", "stacked"}));
}

// The cache holds only the latent and the roped key part per token and layer.
TEST(MlaModels, KvCacheStoresOnlyTheLatentRow) {
  auto backend = create_backend(DeviceType::CPU);
  for (const char* name : kCases) {
    const nlohmann::json cfg = read_json(kData / name / "config.json");
    const int32_t row = cfg["kv_lora_rank"].get<int32_t>() + cfg["qk_rope_head_dim"].get<int32_t>();
    ASSERT_EQ(row, read_json(kData / name / "reference.json")["kv_cache_row"].get<int32_t>());
    auto m = LoadedModel::open((kData / name).string(), *backend);
    const KvCacheSpec spec = m->model().kv_spec(16, DType::F32);
    EXPECT_EQ(spec.n_heads_kv, 1) << name;
    EXPECT_EQ(spec.head_dim, row) << name;
    EXPECT_EQ(spec.latent_v_dim, cfg["kv_lora_rank"].get<int32_t>()) << name;
    EXPECT_EQ(spec.bytes_per_page(), size_t(m->config().n_layers) * 16 * row * sizeof(float)) << name;
    KvStorage kv(*backend, spec, 4);
    const KvCacheLayer layer = kv.layer(1);
    EXPECT_EQ(layer.v.data(), layer.k.data()) << name;
    EXPECT_EQ(layer.v.size(3), spec.latent_v_dim) << name;
    EXPECT_EQ(kv.bytes(), spec.bytes_per_page() * 5) << name;  // 4 pages and the padding page
  }
}

// Chunks of a prompt, then one decode step, through ModelRunner: the last
// step's logits equal a one-shot prefill's (the chunks attend to the latent
// rows the earlier ones stored).
TEST(MlaModels, ChunkedPrefillAndDecodeMatchOneShot) {
  auto backend = create_backend(DeviceType::CPU);
  for (const char* name : kCases) {
    auto loaded = LoadedModel::open((kData / name).string(), *backend);
    const nlohmann::json ref = read_json(kData / name / "reference.json");
    const auto tokens = ref["prompts"].back()["tokens"].get<std::vector<int32_t>>();
    const auto one_shot = testing::prompt_logits(*loaded, *backend, tokens);
    const int32_t page = 16, pages = static_cast<int32_t>(tokens.size()) / page + 1;
    KvStorage kv(*backend, loaded->model().kv_spec(page, DType::F32), pages);
    ModelRunner runner(loaded->model(), *backend, kv, {16, 1});
    const int32_t n = static_cast<int32_t>(tokens.size());
    std::vector<float> last;
    for (int32_t start = 0; start < n;) {
      // Chunks of 16 and 7, then the last token alone as a decode step.
      const int32_t len = start + 1 == n ? 1 : std::min(start == 32 ? 7 : 16, n - 1 - start);
      const bool sample = start + len == n;
      const StepPlan plan = testing::single_sequence_plan(tokens, start, len, page, sample);
      const StepResults res = runner.wait(runner.launch(plan));
      if (sample) last.assign(res.logits.begin(), res.logits.end());
      start += len;
    }
    ASSERT_EQ(last.size(), one_shot.size());
    double max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < last.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(double(last[i]) - one_shot[i]));
      max_abs = std::max(max_abs, std::abs(double(one_shot[i])));
    }
    std::printf("[mla] %s: chunked prefill + decode vs one-shot max-abs %.3g\n", name, max_diff);
    EXPECT_LE(max_diff, 1e-5 * std::max(1.0, max_abs)) << name;
  }
}

TEST(MlaModels, RejectsMalformedConfigs) {
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    const char* message;
  };
  const Case cases[] = {
      {"deepseek_v3", [](nlohmann::json& c) { c["kv_lora_rank"] = 0; }, "kv_lora_rank 0 must be in [1, 4096]"},
      {"deepseek_v3", [](nlohmann::json& c) { c.erase("kv_lora_rank"); }, "missing field 'kv_lora_rank'"},
      {"deepseek_v2_lite", [](nlohmann::json& c) { c.erase("q_lora_rank"); }, "missing field 'q_lora_rank'"},
      {"deepseek_v3", [](nlohmann::json& c) { c["qk_rope_head_dim"] = 7; }, "qk_rope_head_dim 7 must be even"},
      {"deepseek_v2", [](nlohmann::json& c) { c["topk_method"] = "noaux_tc"; },
       "topk_method 'noaux_tc' is not supported for DeepSeek-V2"},
      {"deepseek_v3", [](nlohmann::json& c) { c["topk_method"] = "greedy"; },
       "topk_method 'greedy' is not supported for DeepSeek-V3"},
      {"deepseek_v3", [](nlohmann::json& c) { c["scoring_func"] = "softmax"; },
       "scoring_func 'softmax' is not supported for DeepSeek-V3"},
      {"deepseek_v3", [](nlohmann::json& c) { c["n_group"] = 3; }, "n_group 3 must divide the 16 routed experts"},
      {"deepseek_v2", [](nlohmann::json& c) { c["topk_group"] = 5; }, "topk_group 5 must be in [1, n_group 4]"},
      {"deepseek_v2", [](nlohmann::json& c) { c["norm_topk_prob"] = true; },
       "norm_topk_prob=true is not supported for DeepSeek-V2"},
      {"deepseek_v2_lite", [](nlohmann::json& c) { c["moe_layer_freq"] = 2; }, "moe_layer_freq 2 is not supported"},
      {"deepseek_v2_lite", [](nlohmann::json& c) { c["first_k_dense_replace"] = 9; },
       "first_k_dense_replace 9 must be in [0, num_hidden_layers 3]"},
      {"deepseek_v3", [](nlohmann::json& c) { c["num_experts_per_tok"] = 17; },
       "num_experts_per_tok 17 must be between 1 and the number of experts (16)"},
      {"deepseek_v3", [](nlohmann::json& c) { c.erase("n_shared_experts"); }, "missing field 'n_shared_experts'"},
      {"deepseek_v3", [](nlohmann::json& c) { c["routed_scaling_factor"] = -1.0; },
       "routed_scaling_factor must be positive"},
      {"deepseek_v2", [](nlohmann::json& c) { c["hidden_act"] = "gelu"; }, "hidden_act \"gelu\" is not supported"},
      {"deepseek_v3", [](nlohmann::json& c) { c["rope_parameters"]["rope_type"] = "llama3"; },
       "supports default or yarn rope scaling only"},
      // Shapes the checkpoint contradicts.
      {"deepseek_v3", [](nlohmann::json& c) { c["kv_lora_rank"] = 16; },
       "tensor 'blk.0.attn_kv_a_mqa.weight' is f32[40, 64] cpu, expected shape [24, 64]"},
      {"deepseek_v2_lite", [](nlohmann::json& c) { c["q_lora_rank"] = 48; }, "no tensor 'blk.0.attn_q_a.weight'"},
      {"deepseek_v3", [](nlohmann::json& c) { c["v_head_dim"] = 16; },
       "tensor 'blk.0.attn_kv_b.weight' is f32[160, 32] cpu, expected shape [128, 32]"},
  };
  for (const Case& c : cases) {
    const testing::CheckpointCopy copy = case_copy(c.name, "config.json", c.edit);
    EXPECT_THAT(load_error(copy.path()), HasSubstr(c.message)) << c.name;
  }
}

}  // namespace
}  // namespace deepinfer
