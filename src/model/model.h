// Model: one architecture's forward pass over a batch of tokens from many
// sequences, reading and writing the paged KV cache. Models never see scheduler
// state; everything a step needs arrives in ForwardInputs.
#pragma once

#include <memory>
#include <string>

#include "kv/kv_storage.h"
#include "moe/eplb.h"
#include "model/forward_inputs.h"
#include "model/model_config.h"

namespace deepinfer {

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // Sizes the activation buffers for steps of up to max_tokens tokens and
  // max_logit_rows logit rows; forward() never allocates after this.
  virtual void reserve(int32_t max_tokens, int32_t max_logit_rows) = 0;
  // Writes logits f32[num_logit_rows, vocab] for inputs.logit_rows.
  virtual void forward(const ForwardInputs& inputs, const KvStorage& kv, Tensor logits) = 0;
  // KV layout this model needs (n_layers, heads, head_dim) for a page size and
  // dtype; MLA models override it with their latent cache.
  virtual KvCacheSpec kv_spec(int32_t page_size, DType dtype) const;
  // Bytes of weights the model reads per forward step (for roofline figures).
  virtual size_t weight_bytes() const = 0;
  // Expert parallelism: where the k-th MoE layer's experts live now (null
  // when they are not spread over ranks), and a new placement, applied by
  // every rank of the group at the same step boundary.
  virtual const moe::ExpertPlacement* expert_placement(size_t moe_layer) const { return nullptr; }
  virtual void set_expert_placement(size_t moe_layer, const moe::ExpertPlacement& placement);
};

}  // namespace deepinfer
