#include "model/layers/moe_layer.h"

#include "ops/ops.h"

namespace deepinfer::layers {

void moe_layer(Backend& backend, const MoeWeights& w, const MoeRouteParams& route, Activation activation,
               const Tensor& h, const MoeScratch& scratch, Tensor out, const Tensor& token_slots,
               Tensor expert_counts) {
  bool accumulate = false;
  if (w.shared.gate.defined()) {
    // The shared expert runs as a one-expert MoE whose routing weight is the
    // sigmoid of its gate: the same grouped kernels, no extra ops.
    ops::linear(backend, h, w.shared_gate, Tensor(), scratch.shared_logits);
    MoeRouteParams gate_route;
    gate_route.scoring = MoeScoring::Sigmoid;
    ops::moe_route(backend, scratch.shared_logits, gate_route, scratch.shared_ids, scratch.shared_weights);
    ops::moe_experts(backend, h, scratch.shared_ids, scratch.shared_weights, w.shared, activation, false,
                     scratch.workspace, out);
    accumulate = true;
  }
  ops::linear(backend, h, w.router, w.router_bias, scratch.router_logits);
  ops::moe_route(backend, scratch.router_logits, route, scratch.expert_ids, scratch.expert_weights);
  if (expert_counts.defined()) ops::count_experts(backend, scratch.expert_ids, token_slots, expert_counts);
  ops::moe_experts(backend, h, scratch.expert_ids, scratch.expert_weights, w.experts, activation, accumulate,
                   scratch.workspace, out);
}

}  // namespace deepinfer::layers
