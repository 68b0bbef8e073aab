#include "model/arch_registry.h"

#include <cmath>
#include <limits>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_parse.h"
#include "loader/gguf.h"

namespace deepinfer {

extern const ArchSpec kLlamaArch;
extern const ArchSpec kGemma3Arch;
extern const ArchSpec kMoeArch;
extern const ArchSpec kDeepseekArch;
extern const ArchSpec kGptOssArch;

namespace {

const ArchSpec* const kArchs[] = {&kLlamaArch, &kGemma3Arch, &kMoeArch, &kGptOssArch, &kDeepseekArch};

std::string supported(bool gguf) {
  std::string s;
  for (const ArchSpec* a : kArchs) {
    for (auto n : gguf ? a->gguf_archs : a->hf_architectures) s += fmt::format("{}{}", s.empty() ? "" : ", ", n);
  }
  return s;
}

}  // namespace

const ArchSpec& find_arch_for_gguf(std::string_view gguf_arch) {
  for (const ArchSpec* a : kArchs) {
    for (auto n : a->gguf_archs) {
      if (n == gguf_arch) return *a;
    }
  }
  fail("unsupported GGUF architecture '{}' (supported: {})", gguf_arch, supported(true));
}

const ArchSpec& find_arch_for_hf(std::string_view hf_architecture) {
  for (const ArchSpec* a : kArchs) {
    for (auto n : a->hf_architectures) {
      if (n == hf_architecture) return *a;
    }
  }
  fail("unsupported architecture '{}' in config.json (supported: {})", hf_architecture,
       supported(false));
}

namespace arch_util {

namespace {
// GGUF stores counts as u32 or u64; the engine's sizes are int32, and a count
// above that is an error naming the key, never a wrapped value.
int32_t as_int32(const std::string& key, uint64_t v) {
  DI_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()), "GGUF: {} = {} is out of range (at most {})",
           key, v, std::numeric_limits<int32_t>::max());
  return static_cast<int32_t>(v);
}
}  // namespace

int32_t gguf_int(const GgufFile& f, std::string_view arch, std::string_view key) {
  const std::string full = fmt::format("{}.{}", arch, key);
  const std::optional<uint64_t> v = f.find_u64(full);
  DI_CHECK(v.has_value(), "GGUF: missing metadata key '{}'", full);
  return as_int32(full, *v);
}
std::optional<int32_t> gguf_find_int(const GgufFile& f, std::string_view arch, std::string_view key) {
  const std::string full = fmt::format("{}.{}", arch, key);
  const std::optional<uint64_t> v = f.find_u64(full);
  if (!v) return std::nullopt;
  return as_int32(full, *v);
}
std::optional<float> gguf_find_f32(const GgufFile& f, std::string_view arch, std::string_view key) {
  return f.find_f32(fmt::format("{}.{}", arch, key));
}

ModelConfig gguf_dense_base(const GgufFile& f, std::string_view arch) {
  ModelConfig c;
  c.name = std::string(f.find_string("general.name").value_or(""));
  c.n_layers = gguf_int(f, arch, "block_count");
  // Per-layer lists are sized by this count: check it against the file first
  // (every layer holds tensors) so a forged count cannot allocate gigabytes.
  DI_CHECK(c.n_layers > 0 && static_cast<size_t>(c.n_layers) <= f.tensors().size(),
           "GGUF: {}.block_count = {}, but the file holds {} tensors", arch, c.n_layers, f.tensors().size());
  DI_CHECK(c.n_layers <= ModelConfig::kMaxLayers, "GGUF: {}.block_count = {} exceeds {} layers", arch, c.n_layers,
           ModelConfig::kMaxLayers);
  c.hidden_size = gguf_int(f, arch, "embedding_length");
  c.intermediate_size = gguf_int(f, arch, "feed_forward_length");
  c.n_heads_q = gguf_int(f, arch, "attention.head_count");
  c.n_heads_kv = gguf_find_int(f, arch, "attention.head_count_kv").value_or(c.n_heads_q);
  DI_CHECK(c.n_heads_q > 0, "GGUF: attention.head_count must be positive");
  c.head_dim = gguf_find_int(f, arch, "attention.key_length").value_or(c.hidden_size / c.n_heads_q);
  c.rotary_dim = gguf_find_int(f, arch, "rope.dimension_count").value_or(0);
  if (c.rotary_dim == c.head_dim) c.rotary_dim = 0;
  c.rms_eps = gguf_find_f32(f, arch, "attention.layer_norm_rms_epsilon").value_or(1e-5f);
  c.rope_theta = gguf_find_f32(f, arch, "rope.freq_base").value_or(10000.0f);
  c.max_position = gguf_find_int(f, arch, "context_length").value_or(4096);
  if (auto type = f.find_string(fmt::format("{}.rope.scaling.type", arch))) {
    if (*type == "linear") {
      c.rope_scaling.type = RopeScalingType::Linear;
      c.rope_scaling.factor = gguf_find_f32(f, arch, "rope.scaling.factor").value_or(1.0f);
      DI_CHECK(c.rope_scaling.factor > 0, "GGUF: rope scaling factor must be positive");
    } else {
      DI_CHECK(*type == "none", "GGUF: unsupported rope scaling type '{}'", *type);
    }
  }
  if (const GgufTensorInfo* freqs = f.find_tensor("rope_freqs.weight")) {
    Tensor t = f.tensor(*freqs);
    DI_CHECK(t.dtype() == DType::F32, "GGUF: rope_freqs.weight must be f32, got {}", t.describe());
    const float* p = t.data_as<const float>();
    c.rope_freq_factors.assign(p, p + t.numel());
  }
  if (auto v = gguf_find_int(f, arch, "vocab_size")) {
    c.vocab_size = *v;
  } else if (const GgufTensorInfo* emb = f.find_tensor("token_embd.weight")) {
    c.vocab_size = static_cast<int32_t>(f.tensor(*emb).size(0));
  }
  // The token list is the vocabulary the ids mean: an embedding row without a
  // token could be sampled and then vanish from the output.
  if (f.has("tokenizer.ggml.tokens")) {
    const uint64_t tokens = f.get_array_size("tokenizer.ggml.tokens");
    DI_CHECK(tokens == static_cast<uint64_t>(c.vocab_size),
             "GGUF: tokenizer.ggml.tokens lists {} tokens, but the model's vocabulary (embedding rows) is {}", tokens,
             c.vocab_size);
  }
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.layer_window.assign(c.n_layers, 0);
  if (auto id = f.find_u64("tokenizer.ggml.bos_token_id")) c.bos_token_id = as_int32("tokenizer.ggml.bos_token_id", *id);
  if (auto id = f.find_u64("tokenizer.ggml.eos_token_id")) {
    c.eos_token_ids.push_back(as_int32("tokenizer.ggml.eos_token_id", *id));
  }
  return c;
}

namespace {

// Exact conversions: a count of 2^40 or 64.5 is an error that names the field,
// never a wrapped or truncated number.
template <typename T>
T convert(const nlohmann::json& v, const char* key) {
  if constexpr (std::is_same_v<T, bool>) {
    DI_CHECK(v.is_boolean(), "config.json: field '{}' must be true or false, got {}", key, json_excerpt(v));
    return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    DI_CHECK(v.is_number_integer(), "config.json: field '{}' must be an integer, got {}", key, json_excerpt(v));
    constexpr auto lo = static_cast<int64_t>(std::numeric_limits<T>::min());
    constexpr auto hi = static_cast<uint64_t>(std::numeric_limits<T>::max());
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      DI_CHECK(u <= hi, "config.json: field '{}' = {} is out of range (at most {})", key, u, hi);
      return static_cast<T>(u);
    }
    const auto i = v.get<int64_t>();
    DI_CHECK(i >= lo && static_cast<uint64_t>(std::max<int64_t>(i, 0)) <= hi,
             "config.json: field '{}' = {} is out of range [{}, {}]", key, i, lo, hi);
    return static_cast<T>(i);
  } else if constexpr (std::is_floating_point_v<T>) {
    DI_CHECK(v.is_number(), "config.json: field '{}' must be a number, got {}", key, json_excerpt(v));
    const auto x = static_cast<T>(v.get<double>());
    DI_CHECK(std::isfinite(x), "config.json: field '{}' = {} is not a finite number", key, json_excerpt(v));
    return x;
  } else {
    DI_CHECK(v.is_string(), "config.json: field '{}' must be a string, got {}", key, json_excerpt(v));
    return v.get<std::string>();
  }
}

template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return convert<T>(*it, key);
}

template <typename T>
T get_required(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  DI_CHECK(it != j.end() && !it->is_null(), "config.json: missing field '{}'", key);
  return convert<T>(*it, key);
}

}  // namespace

int32_t hf_int(const nlohmann::json& cfg, const char* key, int32_t fallback) {
  return get_or<int32_t>(cfg, key, fallback);
}
int32_t hf_required_int(const nlohmann::json& cfg, const char* key) { return get_required<int32_t>(cfg, key); }
int32_t hf_int_value(const nlohmann::json& value, const char* key) { return convert<int32_t>(value, key); }
float hf_float(const nlohmann::json& cfg, const char* key, float fallback) { return get_or<float>(cfg, key, fallback); }
std::string hf_string(const nlohmann::json& cfg, const char* key, const std::string& fallback) {
  return get_or<std::string>(cfg, key, fallback);
}
bool hf_bool(const nlohmann::json& cfg, const char* key, bool fallback) { return get_or<bool>(cfg, key, fallback); }

void read_rope_scaling(const nlohmann::json& rs, RopeScaling& out) {
  std::string type = get_or<std::string>(rs, "rope_type", get_or<std::string>(rs, "type", "default"));
  if (type == "llama3") {
    out.type = RopeScalingType::Llama3;
    out.factor = get_required<float>(rs, "factor");
    out.low_freq_factor = get_or<float>(rs, "low_freq_factor", 1.0f);
    out.high_freq_factor = get_or<float>(rs, "high_freq_factor", 4.0f);
    out.original_max_position = get_or<int32_t>(rs, "original_max_position_embeddings", 8192);
    DI_CHECK(out.factor > 0 && out.high_freq_factor > out.low_freq_factor && out.original_max_position > 0,
             "config.json: invalid llama3 rope scaling");
  } else if (type == "yarn") {
    out.type = RopeScalingType::Yarn;
    out.factor = get_required<float>(rs, "factor");
    // 0 = not given: hf_dense_base fills in max_position_embeddings, as transformers does.
    out.original_max_position = get_or<int32_t>(rs, "original_max_position_embeddings", 0);
    // transformers reads beta_fast / beta_slow with `or`: 0 means the default too.
    out.beta_fast = get_or<float>(rs, "beta_fast", 0.0f);
    out.beta_slow = get_or<float>(rs, "beta_slow", 0.0f);
    if (out.beta_fast == 0.0f) out.beta_fast = 32.0f;
    if (out.beta_slow == 0.0f) out.beta_slow = 1.0f;
    out.truncate = get_or<bool>(rs, "truncate", true);
    out.mscale = get_or<float>(rs, "mscale", 0.0f);
    out.mscale_all_dim = get_or<float>(rs, "mscale_all_dim", 0.0f);
    out.attention_factor = get_or<float>(rs, "attention_factor", 0.0f);
    DI_CHECK(out.factor > 0 && out.original_max_position >= 0 && out.beta_fast > 0 && out.beta_slow > 0 &&
                 out.attention_factor >= 0,
             "config.json: invalid yarn rope scaling (factor {}, original_max_position_embeddings {}, beta_fast {}, "
             "beta_slow {}, attention_factor {})",
             out.factor, out.original_max_position, out.beta_fast, out.beta_slow, out.attention_factor);
  } else if (type == "linear") {
    out.type = RopeScalingType::Linear;
    out.factor = get_required<float>(rs, "factor");
    DI_CHECK(out.factor > 0, "config.json: rope scaling factor must be positive");
  } else {
    DI_CHECK(type == "default", "config.json: unsupported rope scaling type '{}'", type);
  }
}

ModelConfig hf_dense_base(const nlohmann::json& cfg, std::string_view arch) {
  DI_CHECK(cfg.is_object(), "config.json must hold a JSON object");
  ModelConfig c;
  c.name = get_or<std::string>(cfg, "_name_or_path", "");
  c.vocab_size = get_required<int32_t>(cfg, "vocab_size");
  c.hidden_size = get_required<int32_t>(cfg, "hidden_size");
  c.n_layers = get_required<int32_t>(cfg, "num_hidden_layers");
  // Checked before the per-layer lists below are sized by it.
  DI_CHECK(c.n_layers > 0 && c.n_layers <= ModelConfig::kMaxLayers,
           "config.json: num_hidden_layers = {} is out of range [1, {}]", c.n_layers, ModelConfig::kMaxLayers);
  c.n_heads_q = get_required<int32_t>(cfg, "num_attention_heads");
  DI_CHECK(c.n_heads_q > 0, "config.json: num_attention_heads must be positive");
  c.n_heads_kv = get_or<int32_t>(cfg, "num_key_value_heads", c.n_heads_q);
  c.head_dim = get_or<int32_t>(cfg, "head_dim", c.hidden_size / c.n_heads_q);
  c.intermediate_size = get_required<int32_t>(cfg, "intermediate_size");
  c.rms_eps = get_or<float>(cfg, "rms_norm_eps", 1e-6f);
  c.rope_theta = get_or<float>(cfg, "rope_theta", 10000.0f);
  c.max_position = get_or<int32_t>(cfg, "max_position_embeddings", 4096);
  c.tied_embeddings = get_or<bool>(cfg, "tie_word_embeddings", false);
  c.rope_style = RopeStyle::Neox;
  if (double prf = get_or<double>(cfg, "partial_rotary_factor", 1.0); prf != 1.0) {
    c.rotary_dim = static_cast<int32_t>(c.head_dim * prf);
  }
  // transformers >= 5 writes rope settings (base and scaling) into
  // "rope_parameters"; older configs use top-level rope_theta / rope_scaling.
  // Models with per-layer-type rotary settings (Gemma 3) nest them by layer type.
  if (auto it = cfg.find("rope_parameters"); it != cfg.end() && it->is_object()) {
    const nlohmann::json& rp = it->contains("full_attention") ? (*it)["full_attention"] : *it;
    DI_CHECK(rp.is_object(), "config.json: rope_parameters.full_attention must be an object");
    c.rope_theta = get_or<float>(rp, "rope_theta", c.rope_theta);
    read_rope_scaling(rp, c.rope_scaling);
  } else if (auto rs = cfg.find("rope_scaling"); rs != cfg.end() && rs->is_object()) {
    read_rope_scaling(*rs, c.rope_scaling);
  }
  if (c.rope_scaling.type == RopeScalingType::Yarn && c.rope_scaling.original_max_position == 0) {
    c.rope_scaling.original_max_position = c.max_position;
  }
  c.layer_window.assign(std::max(c.n_layers, 0), 0);
  if (auto it = cfg.find("bos_token_id"); it != cfg.end() && it->is_number_integer()) {
    c.bos_token_id = convert<int32_t>(*it, "bos_token_id");
  }
  if (auto it = cfg.find("eos_token_id"); it != cfg.end()) {
    if (it->is_number_integer()) c.eos_token_ids.push_back(convert<int32_t>(*it, "eos_token_id"));
    if (it->is_array()) {
      for (const auto& e : *it) {
        if (e.is_number_integer()) c.eos_token_ids.push_back(convert<int32_t>(e, "eos_token_id"));
      }
    }
  }
  return c;
}

}  // namespace arch_util
}  // namespace deepinfer
