// Architecture registry: maps the architecture named by a checkpoint (GGUF
// "general.architecture" or a config.json "architectures" entry) to the code
// that reads its configuration. Each archs/<name>.cpp defines one ArchSpec.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "model/model_config.h"
#include "model/weight_source.h"

namespace deepinfer {

class GgufFile;

struct ArchSpec {
  std::string_view name;
  std::vector<std::string_view> gguf_archs;         // e.g. "llama", "qwen2"
  std::vector<std::string_view> hf_architectures;   // e.g. "LlamaForCausalLM"
  ModelConfig (*from_gguf)(const GgufFile& file, std::string_view gguf_arch);
  ModelConfig (*from_hf)(const nlohmann::json& config, std::string_view hf_arch);
  // How to read Hugging Face's "post_attention_layernorm" (see HfWeightSource).
  bool hf_post_attention_is_ffn_norm = true;
  // How stacked expert tensors (experts.gate_up_proj / down_proj) are laid out.
  HfExpertLayout hf_expert_layout = HfExpertLayout::OutInGateFirst;
};

// Throws deepinfer::Error listing the supported names when none matches.
const ArchSpec& find_arch_for_gguf(std::string_view gguf_arch);
const ArchSpec& find_arch_for_hf(std::string_view hf_architecture);

// Helpers shared by the architectures' config readers.
namespace arch_util {
// Reads "<arch>.<key>" from GGUF metadata.
// Integer keys as exact int32: a value above INT32_MAX is an error naming the key.
int32_t gguf_int(const GgufFile& f, std::string_view arch, std::string_view key);
std::optional<int32_t> gguf_find_int(const GgufFile& f, std::string_view arch, std::string_view key);
std::optional<float> gguf_find_f32(const GgufFile& f, std::string_view arch, std::string_view key);
// Common dense-decoder fields from GGUF: sizes, heads, eps, rope base/scaling, vocab.
ModelConfig gguf_dense_base(const GgufFile& f, std::string_view arch);
// Rope scaling from a rope_scaling / rope_parameters object.
void read_rope_scaling(const nlohmann::json& rs, RopeScaling& out);
// Common dense-decoder fields from a config.json object.
ModelConfig hf_dense_base(const nlohmann::json& cfg, std::string_view arch);
// Typed config.json fields; a field of the wrong type is a deepinfer::Error.
int32_t hf_int(const nlohmann::json& cfg, const char* key, int32_t fallback);
int32_t hf_required_int(const nlohmann::json& cfg, const char* key);
bool hf_bool(const nlohmann::json& cfg, const char* key, bool fallback);
float hf_float(const nlohmann::json& cfg, const char* key, float fallback);
std::string hf_string(const nlohmann::json& cfg, const char* key, const std::string& fallback);
// One value (a list entry) of the field named `key`, as an exact int32.
int32_t hf_int_value(const nlohmann::json& value, const char* key);
}  // namespace arch_util

}  // namespace deepinfer
