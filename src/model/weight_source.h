// WeightSource: where a model's tensors come from, addressed by canonical
// names (the GGUF naming: "blk.3.attn_q.weight", "token_embd.weight", ...).
// Hugging Face checkpoints translate their names to these on open, so the
// architectures see one naming whatever the file format.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/tensor.h"

namespace deepinfer {

class GgufFile;
class HfCheckpoint;

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // A CPU view of the tensor, or nullopt when the file has none of that name.
  virtual std::optional<Tensor> find(std::string_view canonical_name) const = 0;
  // Throws deepinfer::Error naming the tensor when it is missing.
  Tensor get(std::string_view canonical_name) const;
  bool has(std::string_view canonical_name) const { return find(canonical_name).has_value(); }
};

class GgufWeightSource final : public WeightSource {
 public:
  explicit GgufWeightSource(const GgufFile& file) : file_(file) {}
  std::optional<Tensor> find(std::string_view canonical_name) const override;

 private:
  const GgufFile& file_;
};

// Maps Hugging Face tensor names to canonical ones. `post_attention_is_ffn_norm`
// tells how to read "post_attention_layernorm": Llama-style models use it as the
// norm before the MLP, Gemma as a norm after attention.
class HfWeightSource final : public WeightSource {
 public:
  HfWeightSource(const HfCheckpoint& checkpoint, bool post_attention_is_ffn_norm);
  std::optional<Tensor> find(std::string_view canonical_name) const override;

 private:
  const HfCheckpoint& checkpoint_;
  std::unordered_map<std::string, std::string> canonical_to_hf_;
};

}  // namespace deepinfer
