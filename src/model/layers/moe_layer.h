// Mixture-of-experts feed-forward sub-layer: a router picks top-k experts per
// token, the experts' gated MLPs run grouped by expert, and their outputs are
// summed with the routing weights; optionally plus a shared expert that every
// token uses, scaled per token by sigmoid(shared_gate . h) (Qwen2-MoE).
#pragma once

#include "backend/backend.h"

namespace deepinfer::layers {

struct MoeWeights {
  Tensor router;  // [n_experts, hidden]
  Tensor router_bias;  // optional f32[n_experts] (gpt-oss)
  MoeExpertWeights experts;
  // Optional shared expert as a one-expert stack ([1, ffn, hidden] / [1, hidden, ffn])
  // with its gate [1, hidden]; undefined when the model has none.
  MoeExpertWeights shared;
  Tensor shared_gate;
};

// Buffers for n tokens (views into the model's workspace).
struct MoeScratch {
  Tensor router_logits;   // f32[n, n_experts]
  Tensor expert_ids;      // i32[n, top_k]
  Tensor expert_weights;  // f32[n, top_k]
  Tensor shared_logits;   // f32[n, 1]
  Tensor shared_ids;      // i32[n, 1]
  Tensor shared_weights;  // f32[n, 1]
  Tensor workspace;       // u8[moe_workspace_bytes of the routed and the shared experts, the larger]
};

// out[n, hidden] = moe(h[n, hidden]). When expert_counts (i32[n_experts]) is
// defined the routed choices of tokens with a non-negative slot are added to
// it (the shared expert is not counted: it sits on every rank).
void moe_layer(Backend& backend, const MoeWeights& w, const MoeRouteParams& route, Activation activation,
               const Tensor& h, const MoeScratch& scratch, Tensor out, const Tensor& token_slots = Tensor(),
               Tensor expert_counts = Tensor());

}  // namespace deepinfer::layers
