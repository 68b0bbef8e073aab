// gpt-oss (GptOssForCausalLM): every layer a mixture of experts behind
// attention with biased q/k/v/o projections and a learned per-head sink logit;
// layers alternate sliding-window and full attention (layer_types); YaRN rope.
// The router is a biased linear whose top-k logits are softmaxed (equal to a
// softmax over all experts renormalised over the chosen k); the experts have
// biases and a clamped SwiGLU over interleaved gate/up rows (HfWeightSource
// turns transformers' [in, out] expert stacks into linear's layout).
//
// Published checkpoints store the experts as MXFP4 blocks; only bf16/f32
// checkpoints (as save_pretrained writes a from_config model) are read.
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/arch_registry.h"

namespace deepinfer {

namespace {

constexpr float kDefaultRopeTheta = 150000.0f;  // GptOssConfig.default_theta

using arch_util::hf_int;
using arch_util::hf_required_int;

bool has_rope_theta(const nlohmann::json& cfg) {
  if (cfg.contains("rope_theta")) return true;
  auto rp = cfg.find("rope_parameters");
  return rp != cfg.end() && rp->is_object() && rp->contains("rope_theta");
}

ModelConfig gpt_oss_from_hf(const nlohmann::json& cfg, std::string_view hf_arch) {
  if (auto q = cfg.find("quantization_config"); q != cfg.end() && q->is_object()) {
    const std::string method = q->value("quant_method", std::string("?"));
    fail("config.json: {} checkpoints quantised with '{}' (the published gpt-oss MXFP4 experts) are not supported "
         "yet; use a bf16/f32 checkpoint (e.g. dequantised with transformers and saved with save_pretrained)",
         hf_arch, method);
  }
  ModelConfig c = arch_util::hf_dense_base(cfg, hf_arch);
  c.arch = "gpt-oss";
  if (!has_rope_theta(cfg)) c.rope_theta = kDefaultRopeTheta;
  c.qkv_bias = arch_util::hf_bool(cfg, "attention_bias", true);
  c.output_bias = c.qkv_bias;
  c.attn_sinks = true;
  c.activation = Activation::ClampedSwiglu;
  c.layer_moe.assign(c.n_layers, 1);
  c.moe.n_experts = hf_required_int(cfg, "num_local_experts");
  c.moe.n_experts_used = hf_int(cfg, "num_experts_per_tok", hf_int(cfg, "experts_per_token", 0));
  c.moe.expert_ffn_size = c.intermediate_size;
  c.moe.norm_topk_prob = true;
  c.moe.router_bias = true;
  c.moe.expert_bias = true;
  DI_CHECK(c.moe.n_experts > 0, "config.json: {} needs a positive number of experts, got {}", hf_arch,
           c.moe.n_experts);
  DI_CHECK(c.moe.n_experts_used > 0 && c.moe.n_experts_used <= c.moe.n_experts,
           "config.json: num_experts_per_tok {} must be between 1 and the number of experts ({})",
           c.moe.n_experts_used, c.moe.n_experts);
  // The backends implement the activation with the published constants.
  const float alpha = arch_util::hf_float(cfg, "swiglu_alpha", kClampedSwigluAlpha);
  const float limit = arch_util::hf_float(cfg, "swiglu_limit", kClampedSwigluLimit);
  DI_CHECK(alpha == kClampedSwigluAlpha && limit == kClampedSwigluLimit,
           "config.json: swiglu_alpha {} / swiglu_limit {} are not supported (only {} / {})", alpha, limit,
           kClampedSwigluAlpha, kClampedSwigluLimit);

  const int32_t window = hf_int(cfg, "sliding_window", 0);
  auto types = cfg.find("layer_types");
  if (types == cfg.end() || types->is_null()) {
    // GptOssConfig's default: even layers slide, odd layers see everything.
    DI_CHECK(window > 0, "config.json: sliding_window must be positive, got {}", window);
    for (int i = 0; i < c.n_layers; ++i) c.layer_window[i] = i % 2 == 0 ? window : 0;
  } else {
    DI_CHECK(types->is_array() && static_cast<int>(types->size()) == c.n_layers,
             "config.json: layer_types must list one entry per layer ({})", c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) {
      const auto& t = (*types)[i];
      const std::string type = t.is_string() ? t.get<std::string>() : "";
      DI_CHECK(type == "sliding_attention" || type == "full_attention",
               "config.json: layer_types[{}] is {}, expected \"sliding_attention\" or \"full_attention\"", i, t.dump());
      if (type == "sliding_attention") {
        DI_CHECK(window > 0, "config.json: sliding_window must be positive for sliding layers, got {}", window);
        c.layer_window[i] = window;
      }
    }
  }
  const auto act = cfg.find("hidden_act");
  DI_CHECK(act == cfg.end() || act->is_null() || (act->is_string() && act->get<std::string>() == "silu"),
           "config.json: hidden_act {} is not supported for {} (only \"silu\")", act->dump(), hf_arch);
  return c;
}

}  // namespace

extern const ArchSpec kGptOssArch{
    "gpt-oss",
    {},
    {"GptOssForCausalLM"},
    nullptr,
    gpt_oss_from_hf,
    true,
    HfExpertLayout::InOutInterleaved,
};

}  // namespace deepinfer
