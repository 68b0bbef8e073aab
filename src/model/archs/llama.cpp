// The Llama family and its close relatives, which share one forward pass:
// Llama 2/3/3.1, Mistral, SmolLM2 (a Llama), Qwen2 (q/k/v biases) and Qwen3
// (RMSNorm on q and k per head).
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/gguf.h"
#include "model/arch_registry.h"

namespace deepinfer {

namespace {

ModelConfig llama_from_gguf(const GgufFile& f, std::string_view arch) {
  ModelConfig c = arch_util::gguf_dense_base(f, arch);
  c.arch = std::string(arch);
  // GGUF converters permute Llama's q/k rows so rotary pairs are adjacent;
  // the Qwen converters keep Hugging Face's half-split layout.
  c.rope_style = arch == "llama" ? RopeStyle::Interleaved : RopeStyle::Neox;
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = f.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  if (auto w = arch_util::gguf_find_int(f, arch, "attention.sliding_window"); w && *w > 0) {
    c.layer_window.assign(c.n_layers, *w);
  }
  return c;
}

ModelConfig llama_from_hf(const nlohmann::json& cfg, std::string_view hf_arch) {
  ModelConfig c = arch_util::hf_dense_base(cfg, hf_arch);
  if (hf_arch == "Qwen2ForCausalLM") {
    c.arch = "qwen2";
    c.qkv_bias = true;
  } else if (hf_arch == "Qwen3ForCausalLM") {
    c.arch = "qwen3";
    c.qk_norm = true;
    c.qkv_bias = arch_util::hf_bool(cfg, "attention_bias", false);
  } else {
    c.arch = hf_arch == "MistralForCausalLM" ? "mistral" : "llama";
    c.qkv_bias = arch_util::hf_bool(cfg, "attention_bias", false);
  }
  // Mistral always applies its window when set; Qwen2/3 only with use_sliding_window.
  bool use_window = hf_arch == "MistralForCausalLM" || arch_util::hf_bool(cfg, "use_sliding_window", false);
  if (auto it = cfg.find("sliding_window"); use_window && it != cfg.end() && it->is_number_integer()) {
    int32_t window = arch_util::hf_int_value(*it, "sliding_window");
    DI_CHECK(window > 0, "config.json: sliding_window must be positive");
    int32_t first = arch_util::hf_int(cfg, "max_window_layers", c.n_layers);  // Qwen2: layers below use full attention
    for (int i = 0; i < c.n_layers; ++i) {
      if (hf_arch == "MistralForCausalLM" || i >= first) c.layer_window[i] = window;
    }
  }
  return c;
}

}  // namespace

extern const ArchSpec kLlamaArch{
    "llama",
    {"llama", "qwen2", "qwen3"},
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"},
    llama_from_gguf,
    llama_from_hf,
    true,
};

}  // namespace deepinfer
