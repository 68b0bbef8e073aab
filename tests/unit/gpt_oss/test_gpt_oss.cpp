// gpt-oss (GptOssForCausalLM) from Hugging Face layout against transformers,
// on the tiny random model of scripts/gen_hf_gptoss_reference.py
// (tests/data/hf_tiny/gpt_oss: 3 layers alternating sliding window 8 / full,
// 8 experts top-2, YaRN, sinks, biases, interleaved [in, out] expert stacks),
// loaded with the config transformers 5 wrote and with the transformers-4
// spelling of the published checkpoints (rope_theta + rope_scaling).
//
// Tolerances: both sides compute in float32 on the same weights, so logits
// differ by summation order only (~1e-6 of the logit scale here); the test
// allows 2e-5 x the largest |logit|, and checks that dropping any one gpt-oss
// detail moves the logits far more than that. YaRN tables are compared with
// transformers' inv_freq to 2 ulp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/arch_registry.h"
#include "model/model_loader.h"
#include "../../support/checkpoint_copy.h"
#include "../../support/greedy_reference.h"
#include "../../support/prompt_logits.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::load_error;
using testing::read_json;

const fs::path kData = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "hf_tiny";
const fs::path kCase = kData / "gpt_oss";
constexpr double kRelTolerance = 2e-5;
constexpr double kNearTie = 0.01;

double tolerance(const nlohmann::json& prompt) {
  return kRelTolerance * std::max(1.0, prompt["max_abs_logit"].get<double>());
}

class GptOss : public ::testing::TestWithParam<std::string> {
 protected:
  // The case folder itself for "v5", a copy with config_legacy.json for "legacy".
  std::unique_ptr<testing::CheckpointCopy> copy_;
  std::string path() {
    if (GetParam() == "v5") return kCase.string();
    if (!copy_) copy_ = std::make_unique<testing::CheckpointCopy>(kCase, read_json(kCase / "config_legacy.json"));
    return copy_->path();
  }
};

TEST_P(GptOss, LastPositionLogitsMatchTransformers) {
  const nlohmann::json ref = read_json(kCase / "reference.json");
  auto backend = create_backend(DeviceType::CPU);
  auto loaded = LoadedModel::open(path(), *backend);
  const size_t vocab = ref["vocab_size"].get<size_t>();
  for (const auto& p : ref["prompts"]) {
    const auto expected = p["logits"].get<std::vector<float>>();
    const auto ours = deepinfer::testing::prompt_logits(*loaded, *backend, p["tokens"].get<std::vector<int32_t>>());
    ASSERT_EQ(ours.size(), vocab);
    double max_diff = 0;
    for (size_t i = 0; i < vocab; ++i) max_diff = std::max(max_diff, std::abs(double(ours[i]) - expected[i]));
    std::printf("[gpt_oss] %s config, %s: max-abs %.3g (tolerance %.3g, |logit| up to %.2f)\n", GetParam().c_str(),
                p["name"].get<std::string>().c_str(), max_diff, tolerance(p), p["max_abs_logit"].get<double>());
    EXPECT_LE(max_diff, tolerance(p)) << p["name"];
  }
}

TEST_P(GptOss, GreedyContinuationMatchesTransformers) {
  const nlohmann::json ref = read_json(kCase / "reference.json");
  EngineConfig c;
  c.model_path = path();
  c.tokenizer_path = (kData / "tokenizer.json").string();
  c.max_model_len = 128;
  c.kv_cache_tokens = 1024;
  Engine engine(c);
  testing::expect_greedy_matches(engine, ref["prompts"], kNearTie, "gpt_oss " + GetParam() + " config");
}

INSTANTIATE_TEST_SUITE_P(Configs, GptOss, ::testing::Values("v5", "legacy"));

// The data can catch a wrong implementation: every expert is used, routing is
// not decided by rounding, both clamps fire, the prompts exceed the window,
// and every dropped detail moves the logits by more than 10x the tolerance.
TEST(GptOssData, EveryDetailMatters) {
  const nlohmann::json ref = read_json(kCase / "reference.json");
  for (const auto& layer : ref["expert_hits"]) {
    for (const auto& hits : layer) EXPECT_GT(hits.get<int>(), 0);
  }
  EXPECT_GT(ref["min_router_margin"].get<double>(), 1e-5);
  EXPECT_GT(ref["clamp_hits"]["gate_above_limit"].get<int>(), 0);
  EXPECT_GT(ref["clamp_hits"]["up_outside_limit"].get<int>(), 0);
  EXPECT_GT(ref["prompts"].back()["tokens"].size(), 8u);
  const double tol = tolerance(ref["prompts"].back());
  for (const char* detail : {"no_sinks", "no_yarn", "yarn_attention_factor_1", "yarn_truncated", "no_sliding_window",
                             "no_clamp", "no_expert_bias", "no_router_bias", "no_o_proj_bias", "gate_up_halves"}) {
    EXPECT_GT(ref["sensitivity_max_abs_logit_change"][detail].get<double>(), 10 * tol) << detail;
  }
}

TEST(GptOssConfig, ReadsLayerTypesExpertsAndYarn) {
  auto backend = create_backend(DeviceType::CPU);
  auto m = LoadedModel::open(kCase.string(), *backend);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, "gpt-oss");
  EXPECT_EQ(c.layer_window, (std::vector<int32_t>{8, 0, 8}));
  EXPECT_EQ(c.layer_moe, (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(c.moe.n_experts, 8);
  EXPECT_EQ(c.moe.n_experts_used, 2);
  EXPECT_EQ(c.moe.expert_ffn_size, 32);
  EXPECT_TRUE(c.moe.norm_topk_prob && c.moe.router_bias && c.moe.expert_bias);
  EXPECT_TRUE(c.qkv_bias && c.output_bias && c.attn_sinks);
  EXPECT_EQ(c.activation, Activation::ClampedSwiglu);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::Yarn);
  EXPECT_FALSE(c.rope_scaling.truncate);
  EXPECT_EQ(c.rope_scaling.original_max_position, 64);
  EXPECT_THAT(c.summary(), HasSubstr("3 layers (2 sliding-window)"));
  EXPECT_THAT(c.summary(), HasSubstr("(yarn scaling x8)"));
}

// inv_freq and the cos/sin factor as transformers computes them, for the tiny
// model and for other YaRN settings (the published gpt-oss rope, truncation,
// DeepSeek's mscale / mscale_all_dim, an explicit attention_factor).
TEST(GptOssConfig, YarnTablesMatchTransformers) {
  const nlohmann::json ref = read_json(kCase / "reference.json");
  int tables = 0;
  for (const auto& [name, t] : ref["yarn_tables"].items()) {
    SCOPED_TRACE(name);
    ModelConfig c;
    c.head_dim = t["head_dim"].get<int32_t>();
    c.max_position = t["max_position_embeddings"].get<int32_t>();
    c.rope_theta = t["rope_parameters"]["rope_theta"].get<float>();
    arch_util::read_rope_scaling(t["rope_parameters"], c.rope_scaling);
    if (c.rope_scaling.original_max_position == 0) c.rope_scaling.original_max_position = c.max_position;
    const auto want = t["inv_freq"].get<std::vector<float>>();
    const std::vector<float> got = rope_inv_freq(c, false);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 2.5e-7 * std::abs(want[i])) << "inv_freq[" << i << "]";
    }
    EXPECT_FLOAT_EQ(rope_attention_factor(c, false), t["attention_factor"].get<float>());
    // Sliding-window layers without a base of their own share the table.
    EXPECT_EQ(rope_inv_freq(c, true), got);
    ++tables;
  }
  EXPECT_GE(tables, 5);
}

TEST(GptOssConfig, RejectsUnsupportedConfigs) {
  const nlohmann::json cfg = read_json(kCase / "config.json");
  auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = cfg;
    edit(c);
    return testing::CheckpointCopy(kCase, c);
  };
  {
    const testing::CheckpointCopy mxfp4 = edited([](nlohmann::json& c) { c["quantization_config"] = {{"quant_method", "mxfp4"}}; });
    EXPECT_THAT(load_error(mxfp4.path()), HasSubstr("quantised with 'mxfp4'"));
  }
  {
    const testing::CheckpointCopy limit = edited([](nlohmann::json& c) { c["swiglu_limit"] = 5.0; });
    EXPECT_THAT(load_error(limit.path()), HasSubstr("swiglu_limit 5 are not supported"));
  }
  {
    const testing::CheckpointCopy types = edited([](nlohmann::json& c) { c["layer_types"][1] = "chunked_attention"; });
    EXPECT_THAT(load_error(types.path()), HasSubstr("layer_types[1] is \"chunked_attention\""));
  }
  {
    const testing::CheckpointCopy top_k = edited([](nlohmann::json& c) { c["num_experts_per_tok"] = 9; });
    EXPECT_THAT(load_error(top_k.path()), HasSubstr("num_experts_per_tok 9 must be between 1"));
  }
  {
    const testing::CheckpointCopy yarn = edited([](nlohmann::json& c) { c["rope_parameters"].erase("factor"); });
    EXPECT_THAT(load_error(yarn.path()), HasSubstr("missing field 'factor'"));
  }
}

TEST(GptOssConfig, RejectsMxfp4AndMissingTensors) {
  const nlohmann::json cfg = read_json(kCase / "config.json");
  auto rename = [](const std::string& from, const std::string& to) {
    return [=](nlohmann::json& header) {
      ASSERT_TRUE(header.contains(from)) << from;
      header[to] = header[from];
      header.erase(from);
    };
  };
  const testing::CheckpointCopy blocks(kCase, cfg, rename("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.gate_up_proj_blocks"));
  EXPECT_THAT(load_error(blocks.path()), HasSubstr("MXFP4-quantised experts"));
  const testing::CheckpointCopy sinks(kCase, cfg, rename("model.layers.2.self_attn.sinks", "model.layers.2.self_attn.sinks_hidden"));
  EXPECT_THAT(load_error(sinks.path()), HasSubstr("no tensor 'blk.2.attn_sinks.weight'"));
  const testing::CheckpointCopy bias(kCase, cfg, rename("model.layers.1.mlp.experts.gate_up_proj_bias", "hidden"));
  EXPECT_THAT(load_error(bias.path()), HasSubstr("no tensor 'blk.1.ffn_gate_exps.bias'"));
  const testing::CheckpointCopy router(kCase, cfg, rename("model.layers.0.mlp.router.bias", "hidden"));
  EXPECT_THAT(load_error(router.path()), HasSubstr("no tensor 'blk.0.ffn_gate_inp.bias'"));
}

}  // namespace
}  // namespace deepinfer
