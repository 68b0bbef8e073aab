#include "model/weight_source.h"

#include <regex>

#include "core/error.h"
#include "loader/gguf.h"
#include "loader/hf_checkpoint.h"

namespace deepinfer {

Tensor WeightSource::get(std::string_view canonical_name) const {
  auto t = find(canonical_name);
  DI_CHECK(t.has_value(), "model file has no tensor '{}'", canonical_name);
  return *t;
}

std::optional<Tensor> GgufWeightSource::find(std::string_view canonical_name) const {
  const GgufTensorInfo* info = file_.find_tensor(canonical_name);
  if (!info) return std::nullopt;
  return file_.tensor(*info);
}

namespace {

// Per-layer names: Hugging Face suffix after "layers.N." -> canonical suffix after "blk.N.".
struct LayerName {
  const char* hf;
  const char* canonical;
};
constexpr LayerName kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

}  // namespace

HfWeightSource::HfWeightSource(const HfCheckpoint& checkpoint, bool post_attention_is_ffn_norm)
    : checkpoint_(checkpoint) {
  // Multimodal wrappers nest the text model (e.g. "language_model.model.layers...").
  static const std::regex kLayer(R"(^(?:.*\.)?layers\.(\d+)\.(.+)$)");
  for (const std::string& hf : checkpoint.tensor_names()) {
    std::smatch m;
    if (std::regex_match(hf, m, kLayer)) {
      const std::string suffix = m[2];
      std::string canonical;
      if (suffix == "post_attention_layernorm.weight") {
        canonical = post_attention_is_ffn_norm ? "ffn_norm.weight" : "post_attention_norm.weight";
      } else {
        for (const auto& n : kLayerNames) {
          if (suffix == n.hf) canonical = n.canonical;
        }
      }
      if (!canonical.empty()) canonical_to_hf_["blk." + std::string(m[1]) + "." + canonical] = hf;
      continue;
    }
    auto ends_with = [&](std::string_view s) {
      return hf.size() >= s.size() && hf.compare(hf.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with("embed_tokens.weight")) {
      canonical_to_hf_["token_embd.weight"] = hf;
    } else if (hf == "lm_head.weight" || ends_with(".lm_head.weight")) {
      canonical_to_hf_["output.weight"] = hf;
    } else if (ends_with("model.norm.weight") || hf == "norm.weight") {
      canonical_to_hf_["output_norm.weight"] = hf;
    }
  }
}

std::optional<Tensor> HfWeightSource::find(std::string_view canonical_name) const {
  auto it = canonical_to_hf_.find(std::string(canonical_name));
  if (it == canonical_to_hf_.end()) return std::nullopt;
  return checkpoint_.tensor(it->second);
}

}  // namespace deepinfer
