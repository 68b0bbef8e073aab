// Gated MLP sub-layer (SwiGLU / GeGLU): down(act(gate(h)) * up(h)).
#pragma once

#include "backend/backend.h"

namespace deepinfer::layers {

struct MlpWeights {
  Tensor w_gate, w_up, w_down;  // [ffn, hidden], [ffn, hidden], [hidden, ffn]
};

struct MlpScratch {
  Tensor gate;  // [n, ffn]
  Tensor up;    // [n, ffn]
  Tensor act;   // [n, ffn]
};

void mlp_layer(Backend& backend, const MlpWeights& w, Activation activation, const Tensor& h,
               const MlpScratch& scratch, Tensor out);

}  // namespace deepinfer::layers
