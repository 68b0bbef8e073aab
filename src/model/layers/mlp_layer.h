// Gated MLP sub-layer (SwiGLU / GeGLU): down(act(gate(h)) * up(h)).
#pragma once

#include "backend/backend.h"

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

void mlp_layer(Backend& backend, const MlpWeights& w, Activation activation, const Tensor& h,
               const MlpScratch& scratch, Tensor out);

}  // namespace deepinfer::layers
