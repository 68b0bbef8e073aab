// Expert parallelism (--enable-expert-parallel) over a group of ranks:
// instead of every rank holding a slice of every expert's width, each rank
// holds whole experts — its physical slots of an EPLB placement
// (moe/eplb.h), replicas of hot experts included — and the tokens travel to
// them. The experts' group is every rank that holds experts; a token group is
// a set of ranks that hold the same tokens (a tensor-parallel group: each of
// its ranks dispatches an equal slice of them), and without one each rank
// brings its own requests' tokens (data-parallel attention;
// sched/group_vote.h keeps the ranks' steps aligned). With tensor and data
// parallelism together the experts' group is every rank, made of one token
// group per data-parallel rank:
//
//   1. every rank routes its tokens: its equal slice of its token group's,
//      or all of its own;
//   2. each (token, choice) goes to a replica of its expert (the placement's
//      rotation by token index) over an all-to-all, with the slot it wants;
//   3. the owners run their slots' experts on what they received and send the
//      outputs back over a second all-to-all;
//   4. each rank adds its tokens' outputs with the routing weights, in choice
//      order (so the result does not depend on which replica computed what),
//      plus the shared expert; in a token group an all-gather then gives
//      every rank of it every row.
//
// Placements change while serving (set_placement): the rank's new slots are
// filled from ranks that hold those experts now, over the device group (one
// all-to-all per weight stack: each expert travels only to its new owner).
//
// The data stay on the backend's device (expert stacks, activations, the
// all-to-alls on the device group); only the routed expert ids come to the
// host, where the send order is planned, so a step waits for its routing once
// per MoE layer. On a GPU that rules out CUDA graphs for these steps (the
// engine runs them eagerly); device-side dispatch counts with fixed-size
// buffers, as DeepEP does, would lift that.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/layers/moe_layer.h"
#include "moe/eplb.h"

namespace deepinfer {

class Communicator;
struct TensorParallel;

class ExpertParallelMoe {
 public:
  // token_group: the ranks (a subset of `experts`, this rank among them) that
  // hold this rank's tokens too; null when each rank has its own.
  ExpertParallelMoe(Backend& backend, Communicator& experts, Communicator* token_group);
  // The model's expert-parallel MoE for `tp`'s groups; null without expert
  // parallelism.
  static std::unique_ptr<ExpertParallelMoe> for_ranks(Backend& backend, const TensorParallel& tp);
  int num_ranks() const;

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
  // when w has one, the shared expert). expert_counts (i32[n_experts],
  // optional) gets every rank's routed choices, skipping padding tokens
  // (a negative entry of token_slots, i32[n], when given).
  void forward(size_t layer, const layers::MoeWeights& w, const MoeRouteParams& route, Activation act,
               const Tensor& h, Tensor out, Tensor expert_counts, const Tensor& token_slots);

  // Every rank, together, at a step boundary: the layer moves to `next`;
  // weights the rank lacks come from a rank that holds them.
  void set_placement(size_t layer, moe::ExpertPlacement next);

 private:
  struct Stack {
    Buffer bytes;  // [slots, rest...] of the expert tensor, on the device
    size_t slot_bytes = 0;
  };
  struct Layer {
    moe::ExpertPlacement placement;
    std::vector<Stack> stacks;  // gate, up, down, then the biases that exist
    MoeExpertWeights local;     // views of the stacks
    std::vector<Tensor> full_shapes;  // the full tensors (shapes and dtypes only after loading)
  };
  // forward()'s device buffers, grown on demand and kept between calls.
  enum Scratch : uint8_t {
    kLogits, kIds, kWeights, kSendIndex, kSendChoice, kSendSlot, kSendX, kSendW, kRecvX, kRecvSlot, kRecvW, kY,
    kBack, kPosition, kGathered, kOwn, kAll, kWorkspace, kSharedGate, kCounts, kNumScratch
  };
  void build_views(Layer& l) const;
  Tensor scratch(Scratch which, DType dtype, std::initializer_list<int64_t> shape);
  Tensor upload(Scratch which, const std::vector<int32_t>& values);
  // Rows each rank sends this rank, given the rows this rank sends each.
  std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send_rows);
  // Moves the bytes of slot `from_slot` of `from` into slot `to_slot` of `to`.
  void copy_slot(const Stack& from, int32_t from_slot, Stack& to, int32_t to_slot, size_t slot_bytes);

  Backend& backend_;
  Communicator& comm_;          // the experts' group
  Communicator* token_group_;   // null: every rank its own tokens
  std::vector<Layer> layers_;
  Buffer scratch_[kNumScratch];
  // Host side of forward()'s plan, kept between calls.
  std::vector<int32_t> ids_, send_index_, send_choice_, send_slot_, position_;
};

}  // namespace deepinfer
