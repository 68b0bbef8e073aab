// The steps of a tensor-parallel group, from rank 0 to the others over the
// group's host control channel (Gloo). Rank 0's runner publishes every plan
// before launching it (StepBroadcaster); each other rank runs
// follow_steps(): it receives the plans in order and launches them on
// its own runner and model slice, so the forwards' collectives meet.
//
// An idle rank 0 (a server without requests) sends a heartbeat now and then,
// so followers waiting for the next step tell "idle" from "gone": a follower
// that hears nothing within the group's timeout, or whose rank 0 closed its
// connections, stops with an error; a rank 0 whose heartbeat cannot reach a
// follower ends the process with an error (the group cannot run a step
// without every rank).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "kv/tiers/kv_tier_followers.h"
#include "moe/eplb.h"
#include "runner/runner_rank.h"

namespace deepinfer {

class Backend;
class GlooCommunicator;
class KvStorage;
class ModelRunner;

class StepBroadcaster final : public StepPublisher, public KvTierFollowers {
 public:
  StepBroadcaster(GlooCommunicator& control, std::chrono::milliseconds heartbeat_interval);
  // Tells the followers to stop.
  ~StepBroadcaster() override;
  StepBroadcaster(const StepBroadcaster&) = delete;
  StepBroadcaster& operator=(const StepBroadcaster&) = delete;

  void publish(const StepPlan& plan) override;
  void publish_padding() override;
  // The followers move MoE layer `moe_layer`'s experts to `placement` after
  // the steps published so far (Model::set_expert_placement).
  void publish_placement(size_t moe_layer, const moe::ExpertPlacement& placement);
  // The host KV tier's copies, for the followers' slices (KvTierMirror).
  void offload(int32_t num_slots, std::span<const KvSlotCopy> copies) override;
  void load(int32_t num_slots, std::span<const KvSlotCopy> copies) override;

 private:
  void send(std::vector<uint8_t>& message);
  void heartbeat_loop();

  GlooCommunicator& control_;
  std::chrono::milliseconds interval_;
  std::mutex mutex_;  // one message at a time on the channel
  std::condition_variable wake_;
  std::chrono::steady_clock::time_point last_sent_;
  bool stopping_ = false;
  std::thread heartbeat_;
};

// Runs this follower rank until rank 0 stops the group; its slice of the
// host KV tier lives in `kv`'s pages' mirror when rank 0 has one. Throws
// CommError when rank 0 is gone.
void follow_steps(ModelRunner& runner, Backend& backend, KvStorage& kv, GlooCommunicator& control);

}  // namespace deepinfer
