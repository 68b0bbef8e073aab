#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace deepinfer {

void ModelConfig::validate() const {
  DI_CHECK(vocab_size > 0, "{}: vocab_size must be positive, got {}", arch, vocab_size);
  DI_CHECK(hidden_size > 0 && hidden_size <= (1 << 17), "{}: hidden_size {} out of range", arch,
           hidden_size);
  DI_CHECK(n_layers > 0 && n_layers <= kMaxLayers, "{}: n_layers {} out of range", arch, n_layers);
  DI_CHECK(n_heads_q > 0 && n_heads_kv > 0 && n_heads_q % n_heads_kv == 0,
           "{}: {} query heads is not a multiple of {} KV heads", arch, n_heads_q, n_heads_kv);
  DI_CHECK(head_dim > 0 && head_dim <= 1024 && head_dim % 2 == 0, "{}: head_dim {} out of range",
           arch, head_dim);
  DI_CHECK(intermediate_size > 0, "{}: intermediate_size must be positive", arch);
  DI_CHECK(rotary_dim >= 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0,
           "{}: rotary_dim {} invalid for head_dim {}", arch, rotary_dim, head_dim);
  DI_CHECK(rope_theta > 0, "{}: rope_theta must be positive", arch);
  DI_CHECK(max_position >= 2, "{}: the context length (max_position_embeddings / context_length) is {}; at least 2 is needed",
           arch, max_position);
  DI_CHECK(rms_eps > 0 && rms_eps < 1, "{}: rms_norm_eps {} out of range", arch, rms_eps);
  DI_CHECK(static_cast<int>(layer_window.size()) == n_layers,
           "{}: per-layer window list has {} entries for {} layers", arch, layer_window.size(),
           n_layers);
  DI_CHECK(layer_moe.empty() || static_cast<int>(layer_moe.size()) == n_layers,
           "{}: per-layer MoE list has {} entries for {} layers", arch, layer_moe.size(), n_layers);
  const bool any_moe = std::find(layer_moe.begin(), layer_moe.end(), 1) != layer_moe.end();
  if (any_moe || moe.n_experts > 0) {
    DI_CHECK(moe.n_experts > 0 && moe.n_experts <= 4096, "{}: number of experts {} out of range", arch,
             moe.n_experts);
    DI_CHECK(moe.n_experts_used > 0 && moe.n_experts_used <= moe.n_experts,
             "{}: experts per token ({}) must be between 1 and the number of experts ({})", arch,
             moe.n_experts_used, moe.n_experts);
    DI_CHECK(moe.expert_ffn_size > 0, "{}: expert intermediate size must be positive, got {}", arch,
             moe.expert_ffn_size);
    DI_CHECK(moe.shared_ffn_size >= 0, "{}: negative shared expert intermediate size", arch);
  }
  int32_t rot = rotary_dim ? rotary_dim : head_dim;
  DI_CHECK(rope_freq_factors.empty() || static_cast<int>(rope_freq_factors.size()) == rot / 2,
           "{}: rope frequency factors have {} entries, expected {}", arch,
           rope_freq_factors.size(), rot / 2);
}

std::string ModelConfig::summary() const {
  int sliding = 0;
  for (int32_t w : layer_window) sliding += w > 0;
  return fmt::format(
      "{} '{}': {} layers ({} sliding-window), hidden {}, heads {}/{} x {}, ffn {}, vocab {}, "
      "rope theta {}{}{}",
      arch, name, n_layers, sliding, hidden_size, n_heads_q, n_heads_kv, head_dim,
      intermediate_size, vocab_size, rope_theta,
      rope_scaling.type == RopeScalingType::Yarn     ? fmt::format(" (yarn scaling x{})", rope_scaling.factor)
      : rope_scaling.type == RopeScalingType::Llama3 ? " (llama3 scaling)"
      : rope_scaling.type == RopeScalingType::Linear ? " (linear scaling)"
                                                       : "",
      moe_summary());
}

std::string ModelConfig::moe_summary() const {
  const auto moe_layers = std::count(layer_moe.begin(), layer_moe.end(), 1);
  if (moe_layers == 0) return "";
  return fmt::format("; {} MoE layers: {} experts (top {}{}) of ffn {}{}", moe_layers, moe.n_experts,
                     moe.n_experts_used, moe.norm_topk_prob ? ", renormalised" : "", moe.expert_ffn_size,
                     moe.shared_ffn_size ? fmt::format(", shared expert of ffn {}{}", moe.shared_ffn_size,
                                                       moe.shared_expert_gate ? " (gated)" : "")
                                         : std::string());
}

namespace {

// Whether a layer uses the unscaled table of its own base (Gemma 3's local layers).
bool own_local_rope(const ModelConfig& config, bool local_layer) {
  return local_layer && config.rope_theta_local > 0;
}

// YaRN as transformers computes it (_compute_yarn_parameters), in float32
// where it does, so the table matches its inv_freq to the last bit or two:
// frequencies rotating fewer than beta_slow times over the original context
// are interpolated (divided by factor), those rotating more than beta_fast
// times are kept, with a linear ramp over the dimensions between.
std::vector<float> yarn_inv_freq(const RopeScaling& s, double theta, int rot) {
  auto correction_dim = [&](double rotations) {
    return rot * std::log(s.original_max_position / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(rot - 1));
  if (low == high) high += 0.001;  // as transformers does, against a zero-width ramp
  const auto base = static_cast<float>(theta), lo = static_cast<float>(low), span = static_cast<float>(high - low);
  std::vector<float> inv(rot / 2);
  for (int i = 0; i < rot / 2; ++i) {
    const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(rot));
    const float extrapolated = 1.0f / pos_freq, interpolated = 1.0f / (s.factor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
    const float keep = 1.0f - ramp;
    inv[i] = interpolated * (1.0f - keep) + extrapolated * keep;
  }
  return inv;
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& config, bool local_layer) {
  const int rot = config.rotary_dim ? config.rotary_dim : config.head_dim;
  const bool own_local = own_local_rope(config, local_layer);
  const double theta = own_local ? config.rope_theta_local : config.rope_theta;
  if (!own_local && config.rope_scaling.type == RopeScalingType::Yarn) {
    return yarn_inv_freq(config.rope_scaling, theta, rot);
  }
  std::vector<float> inv(rot / 2);
  for (int i = 0; i < rot / 2; ++i) {
    double f = 1.0 / std::pow(theta, (2.0 * i) / rot);
    if (!own_local) {
      const RopeScaling& s = config.rope_scaling;
      if (s.type == RopeScalingType::Linear) {
        f /= s.factor;
      } else if (s.type == RopeScalingType::Llama3) {
        // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept,
        // and the band between is interpolated smoothly.
        const double low_wavelen = s.original_max_position / s.low_freq_factor;
        const double high_wavelen = s.original_max_position / s.high_freq_factor;
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_wavelen) {
          f /= s.factor;
        } else if (wavelen >= high_wavelen) {
          double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                          (s.high_freq_factor - s.low_freq_factor);
          f = (1.0 - smooth) * f / s.factor + smooth * f;
        }
      }
      if (!config.rope_freq_factors.empty()) f /= config.rope_freq_factors[i];
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

float rope_attention_factor(const ModelConfig& config, bool local_layer) {
  const RopeScaling& s = config.rope_scaling;
  if (own_local_rope(config, local_layer) || s.type != RopeScalingType::Yarn) return 1.0f;
  if (s.attention_factor > 0) return s.attention_factor;
  auto mscale = [&](double m) { return s.factor <= 1 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0; };
  if (s.mscale != 0 && s.mscale_all_dim != 0) return static_cast<float>(mscale(s.mscale) / mscale(s.mscale_all_dim));
  return static_cast<float>(mscale(1.0));
}

}  // namespace deepinfer
