// Expert parallelism (--enable-expert-parallel) over the ranks of the
// tensor-parallel group: instead of every rank holding a slice of every
// expert's width, each rank holds whole experts — its physical slots of an
// EPLB placement (moe/eplb.h), replicas of hot experts included — and the
// tokens travel to them:
//
//   1. every rank takes an equal slice of the step's tokens and routes them;
//   2. each (token, choice) goes to a replica of its expert (the placement's
//      rotation by token index) over an all-to-all, with the slot it wants;
//   3. the owners run their slots' experts on what they received and send the
//      outputs back over a second all-to-all;
//   4. each rank adds its tokens' outputs with the routing weights, in choice
//      order (so the result does not depend on which replica computed what),
//      plus the shared expert, and an all-gather gives every rank every row.
//
// Placements change while serving (set_placement): the rank's new slots are
// filled from ranks that hold those experts now, over the device group.
// Host memory only for now (the CPU backend): the dispatch counts are read on
// the host, which a GPU step would have to wait for.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/layers/moe_layer.h"
#include "moe/eplb.h"

namespace deepinfer {

class Communicator;

class ExpertParallelMoe {
 public:
  ExpertParallelMoe(Backend& backend, Communicator& comm);

  // Adds the next MoE layer: the checkpoint's full expert stacks (host views,
  // [experts, ...]) of which this rank keeps its slots of `placement`.
  void add_layer(const MoeExpertWeights& full, moe::ExpertPlacement placement);
  size_t num_layers() const { return layers_.size(); }
  // The layer's placement; null for a layer it does not have.
  const moe::ExpertPlacement* find_placement(size_t layer) const {
    return layer < layers_.size() ? &layers_[layer].placement : nullptr;
  }
  const MoeExpertWeights& local_experts(size_t layer) const { return layers_.at(layer).local; }

  // out[n, hidden] = the layer's mixture of h[n, hidden] (routed experts and,
  // when w has one, the shared expert), on every rank. expert_counts
  // (i32[n_experts], optional) gets every rank's routed choices.
  void forward(size_t layer, const layers::MoeWeights& w, const MoeRouteParams& route, Activation act,
               const Tensor& h, Tensor out, Tensor expert_counts);

  // Every rank, together, at a step boundary: the layer moves to `next`;
  // weights the rank lacks come from a rank that holds them.
  void set_placement(size_t layer, moe::ExpertPlacement next);

 private:
  struct Stack {
    std::vector<uint8_t> bytes;  // [slots, rest...] of the expert tensor
    size_t slot_bytes = 0;
  };
  struct Layer {
    moe::ExpertPlacement placement;
    std::vector<Stack> stacks;  // gate, up, down, then the biases that exist
    MoeExpertWeights local;     // views of the stacks
    std::vector<Tensor> full_shapes;  // the full tensors (shapes and dtypes only after loading)
  };
  void build_views(Layer& l) const;
  std::vector<float>& scratch(size_t i, size_t floats);

  Backend& backend_;
  Communicator& comm_;
  std::vector<Layer> layers_;
  // Host buffers of forward(), kept between calls (grown, never shrunk).
  std::vector<std::vector<float>> scratch_;
  std::vector<uint8_t> workspace_;
  std::vector<int32_t> ids_, dest_, slot_, send_slot_, recv_slot_, zero_ids_;
  std::vector<int64_t> position_;
};

}  // namespace deepinfer
