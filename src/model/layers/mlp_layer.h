// Gated MLP sub-layer (SwiGLU / GeGLU): down(act(gate(h)) * up(h)).
#pragma once

#include <string>

#include "backend/backend.h"
#include "model/weight_loader.h"

namespace deepinfer::layers {

struct MlpWeights {
  Tensor w_gate, w_up, w_down;  // [ffn, hidden], [ffn, hidden], [hidden, ffn]
  Tensor w_gate_up;             // optional [2 ffn, hidden]: gate then up, used instead of the two
};

struct MlpScratch {
  Tensor gate;     // [n, ffn]
  Tensor up;       // [n, ffn]
  Tensor act;      // [n, ffn]
  Tensor gate_up;  // [n, 2 ffn] with fused weights
};

// Loads <prefix>ffn_{gate,up,down}<suffix>.weight. Device backends get gate
// and up stacked into one matrix (one gemv with the activation fused at
// decode); the CPU keeps them apart.
MlpWeights load_mlp(WeightLoader& load, WeightStore& store, const std::string& prefix, const std::string& suffix,
                    int64_t ffn, int64_t hidden);

// The MLP's width.
inline int64_t mlp_ffn(const MlpWeights& w) {
  return w.w_gate_up.defined() ? w.w_gate_up.size(0) / 2 : w.w_gate.size(0);
}

void mlp_layer(Backend& backend, const MlpWeights& w, Activation activation, const Tensor& h,
               const MlpScratch& scratch, Tensor out);

}  // namespace deepinfer::layers
