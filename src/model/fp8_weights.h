// FP8 weights at load time: which tensors FP8 may store, and
// `--quantization fp8` (vLLM's flag): a WeightSource over another that hands
// out the linear projections' 16/32-bit weights quantised to e4m3 row blocks
// (DType::F8E4M3_B64, core/fp8_blocks.h; one scale per 64 elements of a
// row). The CPU backend multiplies with them directly; the CUDA backend has
// no FP8 weight kernels yet and refuses the option (FP8 checkpoints still
// load there, dequantised to bf16 at upload).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/weight_source.h"

namespace deepinfer {

// Whether FP8 may store the canonical tensor: the weight of a linear
// projection inside a layer (attention, MLP, shared and routed experts).
// Embeddings, the LM head, norms, routers and weights the loader takes apart
// byte by byte (MLA's kv_b, the MTP layer's eh_proj) keep their precision, as
// FP8 releases keep them.
bool fp8_linear_weight(std::string_view canonical_name);

enum class WeightQuantization : uint8_t { None, Fp8 };

// "" / "none" -> None, "fp8" -> Fp8; anything else throws naming the choices.
WeightQuantization parse_weight_quantization(std::string_view name);

class Fp8QuantizingSource final : public WeightSource {
 public:
  explicit Fp8QuantizingSource(std::unique_ptr<WeightSource> inner) : inner_(std::move(inner)) {}
  // Linear weights in f32 / f16 / bf16 whose rows are whole blocks come
  // quantised (once; the copy is owned here); everything else as the inner
  // source has it.
  std::optional<Tensor> find(std::string_view canonical_name) const override;

  struct Stats {
    int quantized = 0;        // tensors now FP8
    int kept = 0;             // linear weights left as they were (rows not whole blocks, already quantised)
    size_t bytes_before = 0;  // of the quantised tensors, as the checkpoint had them
    size_t bytes_after = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  Tensor quantized(const std::string& name, const Tensor& t) const;

  std::unique_ptr<WeightSource> inner_;
  mutable std::map<std::string, std::vector<uint8_t>> owned_;
  mutable std::map<std::string, Tensor> done_;
  mutable Stats stats_;
};

}  // namespace deepinfer
