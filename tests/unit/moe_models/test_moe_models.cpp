// Mixture-of-experts checkpoints: what the reference data must show and how
// malformed configurations and checkpoints are rejected. The logits and greedy
// comparisons with transformers run in test_hf_models (the MoE cases there),
// on the data of scripts/gen_hf_moe_reference.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "../../support/checkpoint_copy.h"
#include "backend/backend.h"
#include "core/error.h"
#include "model/model_loader.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::load_error;
using testing::read_json;

const fs::path kData = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "hf_tiny";
const char* const kCases[] = {"mixtral", "mixtral_fused", "qwen2_moe", "qwen3_moe", "qwen3_moe_bf16_fused"};

// A copy of a case folder with config.json edited and, optionally, tensors
// renamed in model.safetensors (so the loader no longer finds them).
testing::CheckpointCopy broken(const std::string& name, const std::function<void(nlohmann::json&)>& edit_config,
                               const std::vector<std::string>& hide_tensors = {}) {
  nlohmann::json cfg = read_json(kData / name / "config.json");
  edit_config(cfg);
  testing::CheckpointCopy::HeaderEdit hide;
  if (!hide_tensors.empty()) {
    hide = [&](nlohmann::json& header) {
      for (const std::string& t : hide_tensors) {
        EXPECT_TRUE(header.contains(t)) << t;
        header[t + "_hidden"] = header[t];
        header.erase(t);
      }
    };
  }
  return testing::CheckpointCopy(kData / name, cfg, hide);
}

// The data can catch a wrong implementation: every expert is used, the
// routing decisions are not near float rounding, dropping a routing detail
// moves the logits far more than the comparison's tolerance (1e-4 x the largest
// |logit|, as in test_hf_models), and both expert layouts and weight dtypes appear.
TEST(MoeData, CoversEveryExpertAndBothLayouts) {
  std::set<std::string> layouts, archs, dtypes;
  int sensitivities = 0;
  for (const char* name : kCases) {
    const nlohmann::json ref = read_json(kData / name / "reference.json");
    layouts.insert(ref["expert_layout"].get<std::string>());
    archs.insert(ref["architecture"].get<std::string>());
    dtypes.insert(ref["weights_dtype"].get<std::string>());
    const int experts = ref["num_experts"].get<int>();
    ASSERT_FALSE(ref["expert_hits"].empty()) << name;
    for (const auto& layer : ref["expert_hits"]) {
      ASSERT_EQ(static_cast<int>(layer.size()), experts) << name;
      for (const auto& hits : layer) EXPECT_GT(hits.get<int>(), 0) << name;
    }
    EXPECT_GT(ref["min_router_margin"].get<double>(), 1e-5) << name;
    const double tol = 1e-4 * std::max(1.0, ref["prompts"].back()["max_abs_logit"].get<double>());
    for (const auto& [detail, change] : ref["sensitivity_max_abs_logit_change"].items()) {
      EXPECT_GT(change.get<double>(), 10 * tol) << name << ": " << detail;
      ++sensitivities;
    }
  }
  EXPECT_EQ(layouts, (std::set<std::string>{"per_expert", "stacked"}));
  EXPECT_EQ(archs, (std::set<std::string>{"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"}));
  EXPECT_EQ(dtypes, (std::set<std::string>{"float32", "bfloat16"}));
  EXPECT_GE(sensitivities, 4);
}

TEST(MoeModels, ConfigSummaryNamesTheExperts) {
  auto backend = create_backend(DeviceType::CPU);
  auto m = LoadedModel::open((kData / "qwen2_moe").string(), *backend);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, "qwen2moe");
  EXPECT_EQ(c.moe.n_experts, 8);
  EXPECT_EQ(c.moe.n_experts_used, 2);
  EXPECT_EQ(c.moe.shared_ffn_size, 48);
  EXPECT_TRUE(c.moe.shared_expert_gate);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.layer_moe, (std::vector<uint8_t>{1, 0, 1}));  // mlp_only_layers = [1]
  EXPECT_THAT(c.summary(), HasSubstr("2 MoE layers: 8 experts (top 2) of ffn 32, shared expert of ffn 48 (gated)"));
  auto q3 = LoadedModel::open((kData / "qwen3_moe").string(), *backend);
  EXPECT_EQ(q3->config().layer_moe, (std::vector<uint8_t>{0, 1, 0}));  // decoder_sparse_step = 2
  EXPECT_TRUE(q3->config().moe.norm_topk_prob);
  EXPECT_TRUE(q3->config().qk_norm);
}

TEST(MoeModels, RejectsMalformedConfigs) {
  const testing::CheckpointCopy top_k = broken("mixtral", [](nlohmann::json& c) { c["num_experts_per_tok"] = 9; });
  EXPECT_THAT(load_error(top_k.path()),
              HasSubstr("num_experts_per_tok 9 must be between 1 and the number of experts (8)"));
  const testing::CheckpointCopy zero_k = broken("qwen3_moe", [](nlohmann::json& c) { c["num_experts_per_tok"] = 0; });
  EXPECT_THAT(load_error(zero_k.path()), HasSubstr("num_experts_per_tok 0 must be between 1"));
  const testing::CheckpointCopy no_experts = broken("mixtral", [](nlohmann::json& c) { c.erase("num_local_experts"); });
  EXPECT_THAT(load_error(no_experts.path()), HasSubstr("missing field 'num_local_experts'"));
  const testing::CheckpointCopy bad_step = broken("qwen2_moe", [](nlohmann::json& c) { c["decoder_sparse_step"] = 0; });
  EXPECT_THAT(load_error(bad_step.path()), HasSubstr("decoder_sparse_step must be positive"));
  const testing::CheckpointCopy bad_layer = broken("qwen2_moe", [](nlohmann::json& c) { c["mlp_only_layers"] = {7}; });
  EXPECT_THAT(load_error(bad_layer.path()), HasSubstr("mlp_only_layers entry 7 is not a layer index below 3"));
  const testing::CheckpointCopy act = broken("qwen3_moe", [](nlohmann::json& c) { c["hidden_act"] = "gelu"; });
  EXPECT_THAT(load_error(act.path()), HasSubstr("hidden_act \"gelu\" is not supported"));
  const testing::CheckpointCopy window = broken("qwen3_moe", [](nlohmann::json& c) { c["use_sliding_window"] = true; });
  EXPECT_THAT(load_error(window.path()), HasSubstr("use_sliding_window is not supported"));
}

TEST(MoeModels, RejectsMissingOrMismatchedExperts) {
  const auto keep = [](nlohmann::json&) {};
  const testing::CheckpointCopy gap = broken("mixtral", keep, {"model.layers.1.block_sparse_moe.experts.3.w2.weight"});
  EXPECT_THAT(load_error(gap.path()), HasSubstr("model file lacks expert 3 of 'blk.1.ffn_down_exps.weight'"));
  const testing::CheckpointCopy last = broken("qwen2_moe", keep, {"model.layers.0.mlp.experts.7.up_proj.weight"});
  EXPECT_THAT(load_error(last.path()),
              HasSubstr("tensor 'blk.0.ffn_up_exps.weight' is f32[7, 32, 64] cpu: expected 8 experts (config)"));
  const testing::CheckpointCopy router = broken("qwen3_moe", keep, {"model.layers.1.mlp.gate.weight"});
  EXPECT_THAT(load_error(router.path()), HasSubstr("no tensor 'blk.1.ffn_gate_inp.weight'"));
  const testing::CheckpointCopy shared = broken("qwen2_moe", keep, {"model.layers.2.mlp.shared_expert_gate.weight"});
  EXPECT_THAT(load_error(shared.path()), HasSubstr("no tensor 'blk.2.ffn_gate_inp_shexp.weight'"));
  const testing::CheckpointCopy stack = broken("mixtral_fused", keep, {"model.layers.0.mlp.experts.gate_up_proj"});
  EXPECT_THAT(load_error(stack.path()), HasSubstr("no tensor 'blk.0.ffn_gate_exps.weight'"));
  const testing::CheckpointCopy count = broken("mixtral_fused", [](nlohmann::json& c) { c["num_local_experts"] = 5; });
  EXPECT_THAT(load_error(count.path()),
              HasSubstr("tensor 'blk.0.ffn_gate_inp.weight' is f32[4, 64] cpu, expected shape [5, 64]"));
}

// Until the CUDA MoE kernels exist, loading an MoE model there fails at once.
// MoE models load on CUDA since the CUDA MoE kernels exist (their logits
// against transformers are checked on the GPU machine by scripts/gpu_e2e.py).
TEST(MoeModels, LoadOnCuda) {
  std::unique_ptr<Backend> cuda;
  try {
    cuda = create_backend(DeviceType::CUDA);
  } catch (const Error&) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto model = LoadedModel::open((kData / "mixtral").string(), *cuda);
  EXPECT_EQ(model->config().moe.n_experts, 8);
}

}  // namespace
}  // namespace deepinfer
