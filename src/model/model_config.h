// ModelConfig: the hyper-parameters of a decoder (dense or mixture-of-experts), filled from GGUF
// metadata or a Hugging Face config.json by the architecture's parser.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace deepinfer {

enum class RopeScalingType : uint8_t { None, Linear, Llama3, Yarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::None;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;   // Llama 3.1
  float high_freq_factor = 4.0f;  // Llama 3.1
  int original_max_position = 8192;
  // YaRN (gpt-oss, DeepSeek): the ramp between extrapolated and interpolated
  // frequencies, and the cos/sin scale (attention_factor; 0 = derived from
  // factor and, when both are set, mscale / mscale_all_dim, as transformers does).
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  bool truncate = true;
  float mscale = 0.0f;
  float mscale_all_dim = 0.0f;
  float attention_factor = 0.0f;
};

// Mixture-of-experts feed-forward layers (Mixtral, Qwen2-MoE, Qwen3-MoE).
struct MoeConfig {
  int32_t n_experts = 0;        // 0 = a dense model
  int32_t n_experts_used = 0;   // top-k experts per token
  int32_t expert_ffn_size = 0;  // intermediate size of one routed expert
  int32_t shared_ffn_size = 0;  // 0 = no shared expert
  bool shared_expert_gate = false;  // Qwen2-MoE: the shared expert is scaled by sigmoid(w . x)
  bool norm_topk_prob = false;      // renormalise the chosen experts' weights to sum to 1
  // DeepSeek routing: sigmoid scores with a correction bias, group-limited
  // top-k, weights times routed_scaling (see MoeRouteParams).
  MoeScoring scoring = MoeScoring::Softmax;
  MoeGroupScore group_score = MoeGroupScore::TopTwoSum;
  int32_t n_groups = 1;
  int32_t top_k_groups = 1;
  float routed_scaling = 1.0f;
  bool correction_bias = false;  // e_score_correction_bias (DeepSeek-V3)
  bool router_bias = false;         // gpt-oss: the router linear has a bias
  bool expert_bias = false;         // gpt-oss: biases on the experts' gate, up and down products
};

// Multi-head Latent Attention (DeepSeek-V2/V3); kv_lora_rank 0 = standard attention.
struct MlaConfig {
  int32_t q_lora_rank = 0;  // 0 = a plain q_proj
  int32_t kv_lora_rank = 0;
  int32_t qk_nope_head_dim = 0;
  int32_t qk_rope_head_dim = 0;
  int32_t v_head_dim = 0;
  bool attention_bias = false;  // biases on q_a_proj, kv_a_proj_with_mqa and o_proj
  bool enabled() const { return kv_lora_rank > 0; }
};

struct ModelConfig {
  std::string arch;  // registry key, e.g. "llama", "qwen3", "gemma3"
  std::string name;  // human-readable model name from the file, if any
  int32_t vocab_size = 0;
  int32_t hidden_size = 0;
  // Per-layer lists are sized by n_layers as soon as it is read, so readers
  // check it against this bound first (the deepest real models have ~130).
  static constexpr int32_t kMaxLayers = 1024;
  int32_t n_layers = 0;
  int32_t n_heads_q = 0;
  int32_t n_heads_kv = 0;
  int32_t head_dim = 0;
  int32_t intermediate_size = 0;
  int32_t max_position = 0;
  float rms_eps = 1e-6f;
  // Gemma stores norm weights as w with the scale applied as (1 + w); GGUF files
  // already contain 1 + w, Hugging Face checkpoints do not.
  float norm_weight_offset = 0.0f;
  float embedding_scale = 1.0f;  // Gemma multiplies embeddings by sqrt(hidden_size)
  float attention_scale = 0.0f;  // 0 = 1/sqrt(head_dim)
  Activation activation = Activation::Silu;
  bool tied_embeddings = false;
  bool qkv_bias = false;
  bool output_bias = false;  // attention output projection bias (gpt-oss)
  bool attn_sinks = false;   // per-head learned sink logits (gpt-oss)
  bool qk_norm = false;
  bool post_norms = false;  // Gemma's extra norms after attention and MLP

  // Rotary embedding: global layers use rope_theta (+ scaling); sliding-window
  // layers may have their own base (Gemma 3's local layers).
  RopeStyle rope_style = RopeStyle::Neox;
  float rope_theta = 10000.0f;
  float rope_theta_local = 0.0f;  // 0 = same as rope_theta
  int32_t rotary_dim = 0;         // 0 = head_dim
  RopeScaling rope_scaling;
  std::vector<float> rope_freq_factors;  // GGUF rope_freqs.weight (Llama 3.1 in GGUF)

  // Per-layer sliding window (0 = full attention).
  std::vector<int32_t> layer_window;

  MoeConfig moe;
  MlaConfig mla;
  // Per layer: whether its feed-forward block is MoE (else the dense MLP of
  // intermediate_size). Empty for dense models.
  std::vector<uint8_t> layer_moe;
  // Multi-token-prediction layers after the decoder's (DeepSeek-V3's
  // num_nextn_predict_layers, numbered from n_layers); the decoder never runs
  // them, speculative decoding's MTP method drafts with the first.
  int32_t mtp_layers = 0;

  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;

  bool is_sliding(int layer) const { return layer_window[layer] > 0; }
  bool is_moe(int layer) const { return !layer_moe.empty() && layer_moe[layer] != 0; }
  // Throws deepinfer::Error if a value is missing or inconsistent.
  void validate() const;
  std::string summary() const;
  std::string moe_summary() const;  // empty for dense models
};

// Inverse frequencies for one rotary table (rotary_dim/2 values) with scaling
// applied. Local (sliding-window) layers have their own unscaled table only
// when the model gives them their own base (rope_theta_local, Gemma 3);
// otherwise they share the global one.
std::vector<float> rope_inv_freq(const ModelConfig& config, bool local_layer);
// The factor multiplying cos and sin (YaRN's attention scaling; else 1).
float rope_attention_factor(const ModelConfig& config, bool local_layer);

}  // namespace deepinfer
