// DeepseekModel: DeepSeek-V2 / V3 decoders (archs/deepseek.cpp reads their
// configuration). Each layer is Multi-head Latent Attention over a compressed
// KV cache (layers/mla_layer.h) followed by a dense gated MLP (the first
// first_k_dense_replace layers) or DeepSeek MoE: routed experts through the
// moe ops plus shared experts, a plain MLP every token runs, added without a
// gate. A sibling of DecoderModel rather than a branch of it because both the
// attention and the KV cache layout differ; the sub-layers are shared.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/expert_parallel.h"
#include "model/layers/mla_layer.h"
#include "model/layers/mlp_layer.h"
#include "model/layers/moe_layer.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "model/weight_loader.h"
#include "model/weight_source.h"
#include "model/weight_store.h"

namespace deepinfer {

class DeepseekModel final : public Model {
 public:
  // The decoder (mtp_layer < 0), or the checkpoint's multi-token-prediction
  // layer number mtp_layer (DeepSeek-V3's layer num_hidden_layers): the token
  // embedding (zero at position 0) and the target's hidden state
  // (ForwardInputs::hidden_in), each RMS-normed, concatenated and projected
  // (eh_proj), one decoder layer, then the shared head's norm and projection.
  // Its KV is that layer of the target's KV cache (kv_spec of the target
  // with the MTP layer).
  //
  // With tensor parallelism (the decoder only) the heads, the MLPs' and
  // shared experts' widths and the vocabulary are cut as in DecoderModel; the
  // latent KV row serves every head, so each rank keeps it whole. With expert
  // parallelism the routed experts spread over the ranks (expert_parallel.h).
  DeepseekModel(ModelConfig config, const WeightSource& source, Backend& backend, int32_t mtp_layer = -1,
                TensorParallel tp = {});

  const ModelConfig& config() const override { return config_; }
  void reserve(int32_t max_tokens, int32_t max_logit_rows) override;
  void forward(const ForwardInputs& inputs, const KvStorage& kv, Tensor logits) override;
  // One latent row per token and layer: kv_lora_rank + qk_rope_head_dim, V
  // being its first kv_lora_rank channels.
  KvCacheSpec kv_spec(int32_t page_size, DType dtype) const override;
  size_t weight_bytes() const override { return weight_bytes_; }
  const moe::ExpertPlacement* expert_placement(size_t moe_layer) const override;
  void set_expert_placement(size_t moe_layer, const moe::ExpertPlacement& placement) override;

 private:
  struct Layer {
    Tensor attn_norm;
    layers::MlaWeights mla;
    Tensor ffn_norm;
    layers::MlpWeights mlp;     // dense layers, and the shared experts of MoE layers
    layers::MoeWeights moe;     // MoE layers (moe.router defined)
    MoeRouteParams route;       // with this layer's correction bias (V3)
    int32_t ep_layer = -1;      // the layer's index in ep_ (expert parallelism), else -1
  };

  void load_mla(Layer& l, WeightLoader& load, const std::string& prefix);
  void load_moe(Layer& l, WeightLoader& load, const std::string& prefix);
  void load_layer(Layer& l, WeightLoader& load, const std::string& prefix, bool moe);
  void load_mtp(WeightLoader& load);
  // h and delta: scratch [n, hidden]; leaves the MTP layer's input in x.
  void mtp_input(const ForwardInputs& in, Tensor x, Tensor h, Tensor delta);
  Tensor work_view(DType dtype, int64_t rows, int64_t cols, size_t& offset) const;

  TpForward tp_;
  std::unique_ptr<ShardedWeightSource> sharded_;  // this rank's slices (tensor parallelism)
  std::unique_ptr<ExpertParallelMoe> ep_;         // --enable-expert-parallel
  ModelConfig config_;
  Backend& backend_;
  WeightStore store_;
  layers::MlaShape mla_shape_;
  float attention_scale_ = 1.0f;
  Tensor token_embd_;
  Tensor output_norm_;
  Tensor output_;
  std::vector<Layer> layers_;
  std::vector<std::vector<uint8_t>> absorbed_;  // host copies of each layer's W_UK^T (and eh_proj's halves)
  // The MTP layer: its number (< 0: the decoder), input norms and eh_proj's
  // halves acting on the embedding and on the hidden state.
  int32_t mtp_layer_ = -1;
  Tensor mtp_enorm_, mtp_hnorm_, mtp_eh_embed_, mtp_eh_hidden_;
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
