// DeepseekModel: DeepSeek-V2 / V3 decoders (archs/deepseek.cpp reads their
// configuration). Each layer is Multi-head Latent Attention over a compressed
// KV cache (layers/mla_layer.h) followed by a dense gated MLP (the first
// first_k_dense_replace layers) or DeepSeek MoE: routed experts through the
// moe ops plus shared experts, a plain MLP every token runs, added without a
// gate. A sibling of DecoderModel rather than a branch of it because both the
// attention and the KV cache layout differ; the sub-layers are shared.
#pragma once

#include <cstdint>
#include <vector>

#include "model/layers/mla_layer.h"
#include "model/layers/mlp_layer.h"
#include "model/layers/moe_layer.h"
#include "model/model.h"
#include "model/weight_loader.h"
#include "model/weight_source.h"
#include "model/weight_store.h"

namespace deepinfer {

class DeepseekModel final : public Model {
 public:
  DeepseekModel(ModelConfig config, const WeightSource& source, Backend& backend);

  const ModelConfig& config() const override { return config_; }
  void reserve(int32_t max_tokens, int32_t max_logit_rows) override;
  void forward(const ForwardInputs& inputs, const KvStorage& kv, Tensor logits) override;
  // One latent row per token and layer: kv_lora_rank + qk_rope_head_dim, V
  // being its first kv_lora_rank channels.
  KvCacheSpec kv_spec(int32_t page_size, DType dtype) const override;
  size_t weight_bytes() const override { return weight_bytes_; }

 private:
  struct Layer {
    Tensor attn_norm;
    layers::MlaWeights mla;
    Tensor ffn_norm;
    layers::MlpWeights mlp;     // dense layers, and the shared experts of MoE layers
    layers::MoeWeights moe;     // MoE layers (moe.router defined)
    MoeRouteParams route;       // with this layer's correction bias (V3)
  };

  void load_mla(Layer& l, WeightLoader& load, const std::string& prefix);
  void load_moe(Layer& l, WeightLoader& load, const std::string& prefix);
  Tensor work_view(DType dtype, int64_t rows, int64_t cols, size_t& offset) const;

  ModelConfig config_;
  Backend& backend_;
  WeightStore store_;
  layers::MlaShape mla_shape_;
  float attention_scale_ = 1.0f;
  Tensor token_embd_;
  Tensor output_norm_;
  Tensor output_;
  std::vector<Layer> layers_;
  std::vector<std::vector<uint8_t>> absorbed_;  // host copies of each layer's W_UK^T
  Tensor inv_freq_;
  size_t weight_bytes_ = 0;
  bool has_moe_ = false;
  int64_t ffn_scratch_ = 0;  // widest dense MLP: intermediate or shared experts
  size_t moe_workspace_bytes_ = 0;

  Buffer workspace_;
  int32_t max_tokens_ = 0;
  int32_t max_logit_rows_ = 0;
};

}  // namespace deepinfer
