#include "model/layers/mlp_layer.h"

#include "ops/ops.h"

namespace deepinfer::layers {

void mlp_layer(Backend& backend, const MlpWeights& w, Activation activation, const Tensor& h,
               const MlpScratch& scratch, Tensor out) {
  ops::linear(backend, h, w.w_gate, Tensor(), scratch.gate);
  ops::linear(backend, h, w.w_up, Tensor(), scratch.up);
  ops::gated_activation(backend, scratch.gate, scratch.up, activation, scratch.act);
  ops::linear(backend, scratch.act, w.w_down, Tensor(), out);
}

}  // namespace deepinfer::layers
