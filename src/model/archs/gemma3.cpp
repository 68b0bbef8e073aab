// Gemma 3 (text): sandwich norms with (1 + w) weights, q/k RMSNorm, GeGLU,
// embeddings scaled by sqrt(hidden), and sliding-window layers interleaved with
// global ones (5 local : 1 global), each kind with its own rope base.
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/gguf.h"
#include "model/arch_registry.h"

namespace deepinfer {

namespace {

constexpr int kDefaultPattern = 6;              // every 6th layer is global
constexpr float kLocalRopeTheta = 10000.0f;     // rope base of the sliding-window layers

void finish_gemma3(ModelConfig& c) {
  c.arch = "gemma3";
  c.activation = Activation::GeluTanh;
  c.qk_norm = true;
  c.post_norms = true;
  c.tied_embeddings = true;
  c.embedding_scale = std::sqrt(static_cast<float>(c.hidden_size));
  c.rope_style = RopeStyle::Neox;
}

ModelConfig gemma3_from_gguf(const GgufFile& f, std::string_view arch) {
  ModelConfig c = arch_util::gguf_dense_base(f, arch);
  finish_gemma3(c);
  // The GGUF converter stores the norm weights with Gemma's +1 already added.
  c.norm_weight_offset = 0.0f;
  c.rope_theta_local = kLocalRopeTheta;
  const int32_t window = arch_util::gguf_find_int(f, arch, "attention.sliding_window").value_or(0);
  const int32_t pattern = arch_util::gguf_find_int(f, arch, "attention.sliding_window_pattern").value_or(kDefaultPattern);
  DI_CHECK(pattern > 0, "GGUF: sliding_window_pattern must be positive");
  for (int i = 0; i < c.n_layers; ++i) {
    c.layer_window[i] = (i + 1) % pattern == 0 ? 0 : window;
  }
  // Gemma 3 scales queries by query_pre_attn_scalar^-1/2, which is head_dim
  // except for the 27B model (hidden / heads); GGUF does not store it.
  const float qpas = c.n_layers == 62 ? static_cast<float>(c.hidden_size) / c.n_heads_q
                                      : static_cast<float>(c.head_dim);
  c.attention_scale = 1.0f / std::sqrt(qpas);
  return c;
}

ModelConfig gemma3_from_hf(const nlohmann::json& full, std::string_view hf_arch) {
  // Gemma3ForConditionalGeneration nests the language model's config.
  const nlohmann::json& cfg = full.contains("text_config") ? full["text_config"] : full;
  ModelConfig c = arch_util::hf_dense_base(cfg, hf_arch);
  finish_gemma3(c);
  c.tied_embeddings = arch_util::hf_bool(cfg, "tie_word_embeddings", true);
  c.norm_weight_offset = 1.0f;
  c.rope_theta_local = arch_util::hf_float(cfg, "rope_local_base_freq", kLocalRopeTheta);
  // transformers >= 5: {"rope_parameters": {"sliding_attention": {"rope_theta": ...}, ...}}
  if (auto rp = cfg.find("rope_parameters"); rp != cfg.end() && rp->is_object() && rp->contains("sliding_attention")) {
    const nlohmann::json& local = (*rp)["sliding_attention"];
    DI_CHECK(local.is_object() && local.contains("rope_theta") && local["rope_theta"].is_number(),
             "config.json: rope_parameters.sliding_attention needs a numeric rope_theta");
    c.rope_theta_local = arch_util::hf_float(local, "rope_theta", 0.0f);
  }
  const int32_t window = arch_util::hf_int(cfg, "sliding_window", 4096);
  if (auto it = cfg.find("layer_types"); it != cfg.end() && it->is_array()) {
    DI_CHECK(static_cast<int>(it->size()) == c.n_layers,
             "config.json: layer_types has {} entries for {} layers", it->size(), c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) {
      const auto& t = (*it)[i];
      DI_CHECK(t.is_string(), "config.json: layer_types entries must be strings");
      c.layer_window[i] = t.get<std::string>() == "sliding_attention" ? window : 0;
    }
  } else {
    int pattern = arch_util::hf_int(cfg, "sliding_window_pattern", kDefaultPattern);
    DI_CHECK(pattern > 0, "config.json: sliding_window_pattern must be positive");
    for (int i = 0; i < c.n_layers; ++i) c.layer_window[i] = (i + 1) % pattern == 0 ? 0 : window;
  }
  const float qpas = arch_util::hf_float(cfg, "query_pre_attn_scalar", static_cast<float>(c.head_dim));
  DI_CHECK(qpas > 0, "config.json: query_pre_attn_scalar must be positive");
  c.attention_scale = 1.0f / std::sqrt(qpas);
  DI_CHECK(cfg.value("final_logit_softcapping", nlohmann::json()).is_null() &&
               cfg.value("attn_logit_softcapping", nlohmann::json()).is_null(),
           "config.json: logit soft-capping is not supported for Gemma 3");
  return c;
}

}  // namespace

extern const ArchSpec kGemma3Arch{
    "gemma3",
    {"gemma3"},
    {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"},
    gemma3_from_gguf,
    gemma3_from_hf,
    false,
};

}  // namespace deepinfer
