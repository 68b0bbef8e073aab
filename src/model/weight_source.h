// WeightSource: where a model's tensors come from, addressed by canonical
// names (the GGUF naming: "blk.3.attn_q.weight", "token_embd.weight", ...).
// Hugging Face checkpoints translate their names to these on open, so the
// architectures see one naming whatever the file format.
#pragma once

#include <cstdint>
#include <initializer_list>
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

// Layout of the stacked expert tensors of a Hugging Face checkpoint.
enum class HfExpertLayout : uint8_t {
  // experts.gate_up_proj [E, 2F, H] (all gate rows, then all up rows),
  // experts.down_proj [E, H, F]: linear's [out, in] (Mixtral, Qwen-MoE).
  OutInGateFirst,
  // gpt-oss: experts.gate_up_proj [E, H, 2F] with gate and up interleaved
  // along the output (gate = [..., ::2], up = [..., 1::2]), down_proj
  // [E, F, H], both [in, out]; biases gate_up_proj_bias [E, 2F] (interleaved
  // the same way) and down_proj_bias [E, H].
  InOutInterleaved,
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // A CPU view of the tensor, or nullopt when the file has none of that name.
  virtual std::optional<Tensor> find(std::string_view canonical_name) const = 0;
  // Throws deepinfer::Error naming the tensor when it is missing.
  Tensor get(std::string_view canonical_name) const;
  // The same, and the tensor must have exactly this shape.
  Tensor get(std::string_view canonical_name, std::initializer_list<int64_t> shape) const;
  // A stack of `experts` expert matrices [experts, rows, cols].
  Tensor get_experts(std::string_view canonical_name, int64_t experts, int64_t rows, int64_t cols) const;
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
//
// InOutInterleaved stacks are transposed once into owned [E, 2F, H] / [E, H, F]
// copies; gate and up are then strided views of the first (rows 2f and 2f+1:
// the copy seen as [E, F, 2H], columns [0, H) and [H, 2H)), and their biases
// "blk.N.ffn_{gate,up,down}_exps.bias" owned, de-interleaved [E, F] copies
// (down's a view of the file). MXFP4 expert blocks are rejected.
//
// FP8 checkpoints (quantization_config.quant_method "fp8", e4m3 weights) have
// scales: a `weight_scale_inv` per block of weight_block_size (default
// 128 x 128; DeepSeek-V3 and Qwen3 FP8), or a `weight_scale` per tensor or
// output channel. Linear projections (fp8_linear_weight) come as e4m3 row
// blocks (DType::F8E4M3_B64: the codes kept, each 64-element row block
// with its scale) when their rows are whole blocks inside the scale blocks;
// other FP8 tensors, and those, come dequantised to bf16. NaN codes are
// refused. The copies are owned here.
class HfWeightSource final : public WeightSource {
 public:
  HfWeightSource(const HfCheckpoint& checkpoint, bool post_attention_is_ffn_norm,
                 HfExpertLayout expert_layout = HfExpertLayout::OutInGateFirst);
  std::optional<Tensor> find(std::string_view canonical_name) const override;

 private:
  // A canonical expert stack: per-expert tensor names, or a stacked tensor
  // (of which the gate or up half when gate_up).
  struct ExpertStack {
    std::map<int, std::string> per_expert;
    std::string stacked;
    // GateEven / UpOdd: interleaved rows (matrices) or columns (biases).
    enum class Part : uint8_t { Whole, GateHalf, UpHalf, GateEven, UpOdd } part = Part::Whole;
    bool transposed = false;  // stored [E, in, out]
  };
  struct OwnedStack {
    std::vector<uint8_t> bytes;
    Tensor view;
  };
  Tensor stack_experts(const std::string& canonical, const ExpertStack& stack) const;
  Tensor transposed_stack(const std::string& hf_name) const;
  Tensor interleaved_part(const std::string& canonical, const ExpertStack& stack) const;
  OwnedStack& own(const std::string& key, DType dtype, std::initializer_list<int64_t> shape) const;
  // How an FP8 weight comes out: e4m3 row blocks where its rows are whole
  // blocks inside the checkpoint's scale blocks, or dequantised to bf16.
  enum class Fp8Form : uint8_t { Bf16, Blocks };
  // The scales of an FP8 weight: element (r, c) is scaled by
  // values[(r / block_rows) * scale_cols + c / block_cols].
  struct Fp8Scales {
    std::vector<float> values;
    int64_t block_rows = 1, block_cols = 1, scale_cols = 1;
    float at(int64_t r, int64_t c) const {
      return values[static_cast<size_t>((r / block_rows) * scale_cols + c / block_cols)];
    }
  };
  // The file's tensor; FP8 weights as `form` asks where they can (see above).
  Tensor file_tensor(const std::string& hf_name, Fp8Form form = Fp8Form::Bf16) const;
  Fp8Scales fp8_scales(const std::string& hf_name, const Tensor& weight) const;
  Tensor dequantized_fp8(const std::string& hf_name, const Tensor& weight, const Fp8Scales& scales) const;
  Tensor fp8_blocks(const std::string& hf_name, const Tensor& weight, const Fp8Scales& scales) const;

  const HfCheckpoint& checkpoint_;
  std::unordered_map<std::string, std::string> canonical_to_hf_;
  std::unordered_map<std::string, ExpertStack> expert_stacks_;
  mutable std::map<std::string, OwnedStack> owned_stacks_;
};

}  // namespace deepinfer
