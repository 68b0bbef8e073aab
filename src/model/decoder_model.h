// DecoderModel: the decoder-only transformer shared by the Llama family
// (Llama 2/3/3.1, Mistral, SmolLM2), Qwen2/Qwen3, Gemma 3 and the MoE models
// with dense attention (Mixtral, Qwen2-MoE, Qwen3-MoE). The architectures
// differ in configuration (biases, q/k norms, sandwich norms, sliding windows,
// rope bases, which layers' feed-forward block is a mixture of experts), which
// archs/*.cpp read from the checkpoint. A layer's feed-forward block is either
// the dense gated MLP or an MoE block; everything else is shared, so MoE is a
// per-layer choice here rather than a sibling class.
//
// With tensor parallelism (tensor_parallel.h) the model is built from the
// full checkpoint's configuration and this rank's slices of its weights; its
// config() is then the rank's (its heads and widths, the whole vocabulary),
// and the forward adds the ranks' partial sums after each block and gathers
// the logits, so every rank ends the step with the full logits.
#pragma once

#include <memory>
#include <vector>

#include "model/layers/attention_layer.h"
#include "model/layers/mlp_layer.h"
#include "model/layers/moe_layer.h"
#include "model/model.h"
#include "model/expert_parallel.h"
#include "model/tensor_parallel.h"
#include "model/weight_loader.h"
#include "model/weight_source.h"
#include "model/weight_store.h"

namespace deepinfer {

class DecoderModel final : public Model {
 public:
  DecoderModel(ModelConfig config, const WeightSource& source, Backend& backend, TensorParallel tp = {});

  const ModelConfig& config() const override { return config_; }
  void reserve(int32_t max_tokens, int32_t max_logit_rows) override;
  void forward(const ForwardInputs& inputs, const KvStorage& kv, Tensor logits) override;
  size_t weight_bytes() const override { return weight_bytes_; }
  const moe::ExpertPlacement* expert_placement(size_t moe_layer) const override;
  void set_expert_placement(size_t moe_layer, const moe::ExpertPlacement& placement) override;

 private:
  struct Layer {
    Tensor attn_norm;
    layers::AttentionWeights attn;
    Tensor post_attn_norm;  // Gemma
    Tensor ffn_norm;
    layers::MlpWeights mlp;  // dense layers
    layers::MoeWeights moe;  // MoE layers (moe.router defined)
    Tensor post_ffw_norm;  // Gemma
    Tensor sinks;          // gpt-oss: f32[n_heads_q]
    bool local = false;    // sliding-window layer
    int32_t ep_layer = -1;  // the layer's index in ep_ (expert parallelism), else -1
  };

  Tensor act_view(int64_t rows, int64_t cols, size_t& offset) const;
  Tensor work_view(DType dtype, int64_t rows, int64_t cols, size_t& offset) const;
  void load_moe(Layer& l, WeightLoader& load, const std::string& prefix);
  layers::MoeScratch moe_scratch(int64_t n, size_t& offset) const;

  TpForward tp_;
  // This rank's slices of the checkpoint (tensor parallelism only); the
  // weights may view its copies, so it lives as long as the model.
  std::unique_ptr<ShardedWeightSource> sharded_;
  std::unique_ptr<ExpertParallelMoe> ep_;  // --enable-expert-parallel
  ModelConfig config_;
  Backend& backend_;
  WeightStore store_;
  Tensor token_embd_;
  Tensor output_norm_;
  Tensor output_;
  std::vector<Layer> layers_;
  Tensor inv_freq_global_;
  Tensor inv_freq_local_;
  size_t weight_bytes_ = 0;
  bool has_moe_ = false;
  MoeRouteParams route_;
  size_t moe_workspace_bytes_ = 0;  // for max_tokens_

  Buffer workspace_;
  int32_t max_tokens_ = 0;
  int32_t max_logit_rows_ = 0;
};

}  // namespace deepinfer
