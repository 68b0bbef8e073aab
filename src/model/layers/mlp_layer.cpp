#include "model/layers/mlp_layer.h"

#include "ops/ops.h"

namespace deepinfer::layers {

MlpWeights load_mlp(WeightLoader& load, WeightStore& store, const std::string& prefix, const std::string& suffix,
                    int64_t ffn, int64_t hidden) {
  MlpWeights w;
  const Tensor gate = load.host_matrix(prefix + "ffn_gate" + suffix + ".weight", ffn, hidden);
  const Tensor up = load.host_matrix(prefix + "ffn_up" + suffix + ".weight", ffn, hidden);
  w.w_gate_up = store.fused_matrix({gate, up});
  if (!w.w_gate_up.defined()) {
    w.w_gate = store.linear_weight(gate);
    w.w_up = store.linear_weight(up);
  }
  w.w_down = load.linear(prefix + "ffn_down" + suffix + ".weight", hidden, ffn);
  return w;
}

void mlp_layer(Backend& backend, const MlpWeights& w, Activation activation, const Tensor& h,
               const MlpScratch& scratch, Tensor out) {
  if (w.w_gate_up.defined()) {
    const int64_t f = w.w_gate_up.size(0) / 2;
    if (ops::gated_linear(backend, h, w.w_gate_up, activation, scratch.act)) {
      ops::linear(backend, scratch.act, w.w_down, Tensor(), out);
      return;
    }
    ops::linear(backend, h, w.w_gate_up, Tensor(), scratch.gate_up);
    ops::gated_activation(backend, scratch.gate_up.narrow(1, 0, f), scratch.gate_up.narrow(1, f, f), activation,
                          scratch.act);
  } else {
    ops::linear(backend, h, w.w_gate, Tensor(), scratch.gate);
    ops::linear(backend, h, w.w_up, Tensor(), scratch.up);
    ops::gated_activation(backend, scratch.gate, scratch.up, activation, scratch.act);
  }
  ops::linear(backend, scratch.act, w.w_down, Tensor(), out);
}

}  // namespace deepinfer::layers
