// ForwardInputs: what one model step reads, as backend tensors. Built by the
// ModelRunner from a StepPlan and passed explicitly to Model::forward.
#pragma once

#include <vector>

#include "backend/backend.h"

namespace deepinfer {

// One KV layer group's view of the step (kv_layout.h): where each new token's
// K/V goes and which pages each sequence's attention reads. Every layer of
// the group uses it.
struct KvGroupInputs {
  Tensor slot_mapping;  // i32[num_tokens]: KV slot of each new token; negative for padding tokens
  AttentionMetadata attention;
};

struct ForwardInputs {
  int32_t num_tokens = 0;
  Tensor token_ids;     // i32[num_tokens]
  Tensor positions;     // i32[num_tokens]
  Tensor logit_rows;    // i32[num_logits]: token rows whose next-token logits are wanted
  std::vector<KvGroupInputs> kv_groups;  // indexed by KvStorage::group_of_layer
  // Optional i32[moe_layers, n_experts] (EPLB load statistics): the k-th MoE
  // layer adds its routed choices per expert to row k (ops::count_experts),
  // skipping padding tokens (negative slot in padding_mask()). Undefined:
  // nothing is counted.
  Tensor expert_counts;
  // Multi-token prediction (both optional, [num_tokens, hidden] activations).
  // hidden_in: the hidden state an MTP layer combines with each token's
  // embedding. hidden_out: where the model writes each token's final hidden
  // state: the target's after its output norm (what an MTP layer takes), an
  // MTP layer's before its head's norm (what its next draft step takes).
  Tensor hidden_in;
  Tensor hidden_out;

  // Padding tokens have a negative slot in every group; group 0's slots serve
  // as the mask.
  const Tensor& padding_mask() const { return kv_groups.front().slot_mapping; }
};

}  // namespace deepinfer
