// ForwardInputs: what one model step reads, as backend tensors. Built by the
// ModelRunner from a scheduled batch and passed explicitly to Model::forward.
#pragma once

#include "backend/backend.h"

namespace deepinfer {

struct ForwardInputs {
  int32_t num_tokens = 0;
  Tensor token_ids;     // i32[num_tokens]
  Tensor positions;     // i32[num_tokens]
  Tensor slot_mapping;  // i32[num_tokens]: KV slot of each new token
  Tensor logit_rows;    // i32[num_logits]: token rows whose next-token logits are wanted
  AttentionMetadata attention;
  // Optional i32[moe_layers, n_experts] (EPLB load statistics): the k-th MoE
  // layer adds its routed choices per expert to row k (ops::count_experts),
  // skipping padding tokens (negative slot_mapping). Undefined: nothing is counted.
  Tensor expert_counts;
};

}  // namespace deepinfer
