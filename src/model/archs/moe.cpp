// Mixture-of-experts decoders with dense attention: Mixtral (every layer MoE,
// top-k weights renormalised), Qwen2-MoE (q/k/v biases, a shared expert scaled
// by a sigmoid gate) and Qwen3-MoE (q/k RMSNorm). The Qwen models may keep
// dense MLP layers (mlp_only_layers, decoder_sparse_step).
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/arch_registry.h"

namespace deepinfer {

namespace {

using arch_util::hf_bool;
using arch_util::hf_int;
using arch_util::hf_required_int;

// Which layers are MoE, by the rule transformers applies to Qwen-MoE configs.
void qwen_sparse_layers(const nlohmann::json& cfg, ModelConfig& c) {
  const int32_t step = hf_int(cfg, "decoder_sparse_step", 1);
  DI_CHECK(step > 0, "config.json: decoder_sparse_step must be positive, got {}", step);
  std::vector<uint8_t> dense_only(c.n_layers, 0);
  if (auto it = cfg.find("mlp_only_layers"); it != cfg.end() && !it->is_null()) {
    DI_CHECK(it->is_array(), "config.json: mlp_only_layers must be a list of layer indices");
    for (const auto& v : *it) {
      DI_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c.n_layers,
               "config.json: mlp_only_layers entry {} is not a layer index below {}", v.is_number() ? v.dump() : v.type_name(), c.n_layers);
      dense_only[v.get<int32_t>()] = 1;
    }
  }
  for (int i = 0; i < c.n_layers; ++i) c.layer_moe[i] = !dense_only[i] && (i + 1) % step == 0;
}

ModelConfig moe_from_hf(const nlohmann::json& cfg, std::string_view hf_arch) {
  ModelConfig c = arch_util::hf_dense_base(cfg, hf_arch);
  c.layer_moe.assign(c.n_layers, 1);
  c.moe.n_experts_used = hf_required_int(cfg, "num_experts_per_tok");
  if (hf_arch == "MixtralForCausalLM") {
    c.arch = "mixtral";
    c.moe.n_experts = hf_required_int(cfg, "num_local_experts");
    c.moe.expert_ffn_size = c.intermediate_size;
    c.moe.norm_topk_prob = true;
    c.qkv_bias = false;
    if (auto it = cfg.find("sliding_window"); it != cfg.end() && it->is_number_integer()) {
      const int32_t window = arch_util::hf_int_value(*it, "sliding_window");
      DI_CHECK(window > 0, "config.json: sliding_window must be positive");
      c.layer_window.assign(c.n_layers, window);
    }
  } else {
    const bool qwen2 = hf_arch == "Qwen2MoeForCausalLM";
    c.arch = qwen2 ? "qwen2moe" : "qwen3moe";
    // transformers 5 writes Qwen3-MoE's expert count as num_local_experts.
    c.moe.n_experts = cfg.contains("num_experts") ? hf_required_int(cfg, "num_experts")
                                                  : hf_required_int(cfg, "num_local_experts");
    c.moe.expert_ffn_size = hf_required_int(cfg, "moe_intermediate_size");
    c.moe.norm_topk_prob = hf_bool(cfg, "norm_topk_prob", false);
    if (qwen2) {
      c.qkv_bias = hf_bool(cfg, "qkv_bias", true);
      c.moe.shared_ffn_size = hf_int(cfg, "shared_expert_intermediate_size", 0);
      c.moe.shared_expert_gate = c.moe.shared_ffn_size > 0;
    } else {
      c.qk_norm = true;
      c.qkv_bias = hf_bool(cfg, "attention_bias", false);
    }
    DI_CHECK(!hf_bool(cfg, "use_sliding_window", false),
             "config.json: use_sliding_window is not supported for {}", hf_arch);
    qwen_sparse_layers(cfg, c);
  }
  DI_CHECK(c.moe.n_experts > 0, "config.json: {} needs a positive number of experts, got {}", hf_arch,
           c.moe.n_experts);
  DI_CHECK(c.moe.n_experts_used > 0 && c.moe.n_experts_used <= c.moe.n_experts,
           "config.json: num_experts_per_tok {} must be between 1 and the number of experts ({})",
           c.moe.n_experts_used, c.moe.n_experts);
  const auto act = cfg.find("hidden_act");
  DI_CHECK(act == cfg.end() || (act->is_string() && act->get<std::string>() == "silu"),
           "config.json: hidden_act {} is not supported for {} (only \"silu\")", act->dump(), hf_arch);
  return c;
}

}  // namespace

extern const ArchSpec kMoeArch{
    "moe",
    {},
    {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"},
    nullptr,
    moe_from_hf,
    true,
};

}  // namespace deepinfer
