#include "model/layers/mlp_layer.h"

#include "ops/ops.h"

namespace deepinfer::layers {

void mlp_layer(Backend& backend, const MlpWeights& w, Activation activation, const SublayerIo& io,
               const MlpScratch& scratch) {
  if (w.w_gate_up.defined() && ops::gated_linear(backend, io.input, w.w_gate_up, activation, scratch.act, io.norm)) {
    project_out(backend, io, scratch.act, w.w_down, Tensor());
    return;
  }
  const Tensor h = normalised_input(backend, io);
  if (w.w_gate_up.defined()) {
    const int64_t f = w.w_gate_up.size(0) / 2;
    if (!io.norm || !ops::gated_linear(backend, h, w.w_gate_up, activation, scratch.act)) {
      ops::linear(backend, h, w.w_gate_up, Tensor(), scratch.gate_up);
      ops::gated_activation(backend, scratch.gate_up.narrow(1, 0, f), scratch.gate_up.narrow(1, f, f), activation,
                            scratch.act);
    }
  } else {
    ops::linear(backend, h, w.w_gate, Tensor(), scratch.gate);
    ops::linear(backend, h, w.w_up, Tensor(), scratch.up);
    ops::gated_activation(backend, scratch.gate, scratch.up, activation, scratch.act);
  }
  project_out(backend, io, scratch.act, w.w_down, Tensor());
}

}  // namespace deepinfer::layers
