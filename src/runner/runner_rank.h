// A ModelRunner's place in a tensor-parallel group. Every rank runs the same
// steps on its slice of the model: rank 0 plans each step and publishes it
// (StepPublisher) before launching it, the others receive and launch it
// (engine/step_broadcast.h). Rank 0 alone samples; it broadcasts each step's
// sampled tokens over the device group, so a later step's device-sourced
// input ids are the same on every rank.
#pragma once

#include <chrono>
#include <vector>

namespace deepinfer {

class Communicator;
struct StepPlan;

class StepPublisher {
 public:
  virtual ~StepPublisher() = default;
  virtual void publish(const StepPlan& plan) = 0;
  // A padding step (ModelRunner::launch_padding): a data-parallel rank
  // without work runs one so its expert-parallel group's collectives meet.
  virtual void publish_padding() = 0;
};

struct RunnerRank {
  Communicator* device_group = nullptr;  // null: a single rank
  bool samples = true;                   // rank 0
  StepPublisher* publisher = nullptr;    // rank 0 of a group
  // On a device: the groups whose collectives a step runs, watched while
  // waiting for it (dist/step_wait.h), and how long a step may take.
  std::vector<Communicator*> watched_groups;
  std::chrono::milliseconds step_timeout{0};
};

}  // namespace deepinfer
