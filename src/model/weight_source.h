// WeightSource: where a model's tensors come from, addressed by canonical
// names (the GGUF naming: "blk.3.attn_q.weight", "token_embd.weight", ...).
// Hugging Face checkpoints translate their names to these on open, so the
// architectures see one naming whatever the file format.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

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
//
// MoE experts are exposed as GGUF-style stacks "blk.N.ffn_{gate,up,down}_exps.weight"
// ([experts, out, in]). transformers 5 can save them stacked (experts.gate_up_proj
// [E, 2F, H], gate rows first, and experts.down_proj [E, H, F]): those become
// views of the file. Per-expert tensors (experts.N.w1/w3/w2 in Mixtral,
// experts.N.gate_proj/up_proj/down_proj in Qwen-MoE; what published checkpoints
// and transformers' default save_pretrained write) are copied into one stack
// owned here, built on first request. Not thread-safe: one loader at a time.
class HfWeightSource final : public WeightSource {
 public:
  HfWeightSource(const HfCheckpoint& checkpoint, bool post_attention_is_ffn_norm);
  std::optional<Tensor> find(std::string_view canonical_name) const override;

 private:
  // A canonical expert stack: per-expert tensor names, or a stacked tensor
  // (of which the gate or up half when gate_up).
  struct ExpertStack {
    std::map<int, std::string> per_expert;
    std::string stacked;
    enum class Part : uint8_t { Whole, GateHalf, UpHalf } part = Part::Whole;
  };
  struct OwnedStack {
    std::vector<uint8_t> bytes;
    Tensor view;
  };
  Tensor stack_experts(const std::string& canonical, const ExpertStack& stack) const;

  const HfCheckpoint& checkpoint_;
  std::unordered_map<std::string, std::string> canonical_to_hf_;
  std::unordered_map<std::string, ExpertStack> expert_stacks_;
  mutable std::map<std::string, OwnedStack> owned_stacks_;
};

}  // namespace deepinfer
