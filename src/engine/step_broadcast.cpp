#include "engine/step_broadcast.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>

#include "core/logging.h"
#include "dist/gloo_communicator.h"
#include "engine/kv_tier_mirror.h"
#include "runner/model_runner.h"
#include "sched/step_plan_wire.h"

namespace deepinfer {

namespace {

enum class ControlMessage : uint8_t {
  Step = 1,
  Heartbeat = 2,
  Stop = 3,
  Placement = 4,
  Padding = 5,
  TierOffload = 6,
  TierLoad = 7
};

static_assert(sizeof(KvSlotCopy) == 2 * sizeof(int32_t), "host-tier messages carry KvSlotCopy as two i32");

// A host-tier message: kind, the tier's slots, then (block, slot) pairs (i32).
std::vector<uint8_t> encode_tier_copies(ControlMessage kind, int32_t num_slots, std::span<const KvSlotCopy> copies) {
  std::vector<int32_t> words = {num_slots};
  for (const KvSlotCopy& c : copies) words.insert(words.end(), {c.block, c.slot});
  std::vector<uint8_t> message(1 + words.size() * sizeof(int32_t));
  message[0] = static_cast<uint8_t>(kind);
  std::memcpy(message.data() + 1, words.data(), words.size() * sizeof(int32_t));
  return message;
}

// A host-tier message's body: the tier's slots (into num_slots) and its copies.
std::vector<KvSlotCopy> decode_tier_copies(std::span<const uint8_t> body, int32_t& num_slots) {
  DI_CHECK(body.size() % (2 * sizeof(int32_t)) == sizeof(int32_t),
           "tensor parallel: a host-tier message of {} bytes", body.size());
  std::memcpy(&num_slots, body.data(), sizeof(int32_t));
  std::vector<KvSlotCopy> copies((body.size() - sizeof(int32_t)) / (2 * sizeof(int32_t)));
  if (!copies.empty()) std::memcpy(copies.data(), body.data() + sizeof(int32_t), copies.size() * sizeof(KvSlotCopy));
  return copies;
}

// A placement message: kind, the MoE layer, the experts, the ranks, the
// slots per rank, then each physical slot's expert (all u32/i32).
std::vector<uint8_t> encode_placement(size_t moe_layer, const moe::ExpertPlacement& p) {
  std::vector<int32_t> words = {static_cast<int32_t>(moe_layer), p.num_logical(), p.num_ranks(),
                                p.slots_per_rank()};
  words.insert(words.end(), p.physical_to_logical().begin(), p.physical_to_logical().end());
  std::vector<uint8_t> message(1 + words.size() * sizeof(int32_t));
  message[0] = static_cast<uint8_t>(ControlMessage::Placement);
  std::memcpy(message.data() + 1, words.data(), words.size() * sizeof(int32_t));
  return message;
}

void apply_placement(ModelRunner& runner, std::span<const uint8_t> body) {
  DI_CHECK(body.size() % sizeof(int32_t) == 0 && body.size() >= 4 * sizeof(int32_t),
           "tensor parallel: a placement message of {} bytes", body.size());
  std::vector<int32_t> words(body.size() / sizeof(int32_t));
  std::memcpy(words.data(), body.data(), body.size());
  DI_CHECK(words[0] >= 0 && words[2] > 0 && words[3] > 0 &&
               words.size() - 4 == static_cast<size_t>(words[2]) * static_cast<size_t>(words[3]),
           "tensor parallel: a malformed placement message");
  // ExpertPlacement checks the map itself.
  runner.model().set_expert_placement(
      static_cast<size_t>(words[0]),
      moe::ExpertPlacement(words[1], words[2], words[3], std::vector<int32_t>(words.begin() + 4, words.end())));
}

}  // namespace

StepBroadcaster::StepBroadcaster(GlooCommunicator& control, std::chrono::milliseconds heartbeat_interval)
    : control_(control), interval_(heartbeat_interval), last_sent_(std::chrono::steady_clock::now()) {
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

StepBroadcaster::~StepBroadcaster() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  heartbeat_.join();
  std::vector<uint8_t> stop{static_cast<uint8_t>(ControlMessage::Stop)};
  try {
    send(stop);
  } catch (const std::exception& e) {
    log_warn("tensor parallel: could not tell the other ranks to stop: {}", e.what());
  }
}

void StepBroadcaster::send(std::vector<uint8_t>& message) {
  std::lock_guard lock(mutex_);
  control_.broadcast_bytes(message, 0);
  last_sent_ = std::chrono::steady_clock::now();
}

void StepBroadcaster::publish(const StepPlan& plan) {
  std::vector<uint8_t> message = encode_step_plan(plan);
  message.insert(message.begin(), static_cast<uint8_t>(ControlMessage::Step));
  send(message);
}

void StepBroadcaster::publish_padding() {
  std::vector<uint8_t> message{static_cast<uint8_t>(ControlMessage::Padding)};
  send(message);
}

void StepBroadcaster::offload(int32_t num_slots, std::span<const KvSlotCopy> copies) {
  std::vector<uint8_t> message = encode_tier_copies(ControlMessage::TierOffload, num_slots, copies);
  send(message);
}

void StepBroadcaster::load(int32_t num_slots, std::span<const KvSlotCopy> copies) {
  std::vector<uint8_t> message = encode_tier_copies(ControlMessage::TierLoad, num_slots, copies);
  send(message);
}

void StepBroadcaster::publish_placement(size_t moe_layer, const moe::ExpertPlacement& placement) {
  std::vector<uint8_t> message = encode_placement(moe_layer, placement);
  send(message);
}

void StepBroadcaster::heartbeat_loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const auto due = last_sent_ + interval_;
    if (std::chrono::steady_clock::now() < due) {
      wake_.wait_until(lock, due);
      continue;
    }
    std::vector<uint8_t> beat{static_cast<uint8_t>(ControlMessage::Heartbeat)};
    try {
      control_.broadcast_bytes(beat, 0);
      last_sent_ = std::chrono::steady_clock::now();
    } catch (const std::exception& e) {
      // No step can run without every rank; serving on would only hang.
      log_error("tensor parallel: a rank is gone ({}); stopping", e.what());
      std::_Exit(1);
    }
  }
}

void follow_steps(ModelRunner& runner, Backend& backend, KvStorage& kv, GlooCommunicator& control) {
  log_info("tensor parallel: rank {} of {} following rank 0's steps", control.rank(), control.size());
  std::deque<int> in_flight;
  uint64_t steps = 0;
  // This rank's slice of rank 0's host tier, made at the first host-tier
  // message (its size is rank 0's).
  std::unique_ptr<KvTierMirror> tier;
  for (;;) {
    std::vector<uint8_t> message;
    control.broadcast_bytes(message, 0);
    DI_CHECK(!message.empty(), "tensor parallel: empty control message from rank 0");
    const auto kind = static_cast<ControlMessage>(message[0]);
    if (kind == ControlMessage::Stop) break;
    if (kind == ControlMessage::Heartbeat) continue;
    if (kind == ControlMessage::Placement) {
      // At a step boundary, as on rank 0: nothing of ours may be in flight.
      for (int slot : in_flight) runner.wait(slot);
      in_flight.clear();
      apply_placement(runner, std::span<const uint8_t>(message).subspan(1));
      continue;
    }
    if (kind == ControlMessage::TierOffload || kind == ControlMessage::TierLoad) {
      int32_t num_slots = 0;
      const std::vector<KvSlotCopy> copies = decode_tier_copies(std::span<const uint8_t>(message).subspan(1), num_slots);
      if (!tier) tier = std::make_unique<KvTierMirror>(backend, kv, num_slots);
      DI_CHECK(tier->num_slots() == num_slots, "tensor parallel: a host tier of {} slots, then of {}",
               tier->num_slots(), num_slots);
      if (kind == ControlMessage::TierOffload) {
        tier->offload(copies);
      } else {
        tier->load(copies);
      }
      continue;
    }
    DI_CHECK(kind == ControlMessage::Step || kind == ControlMessage::Padding,
             "tensor parallel: unknown control message {}", message[0]);
    // Keep a slot free for the next step while this one runs, as rank 0 does.
    while (in_flight.size() >= ModelRunner::kSlots - 1) {
      runner.wait(in_flight.front());
      in_flight.pop_front();
    }
    if (kind == ControlMessage::Padding) {
      DI_CHECK(message.size() == 1, "tensor parallel: a padding message of {} bytes", message.size());
      in_flight.push_back(runner.launch_padding());
    } else {
      const StepPlan plan = decode_step_plan(std::span<const uint8_t>(message).subspan(1));
      if (tier) tier->before_step(plan);
      in_flight.push_back(runner.launch(plan));
    }
    ++steps;
  }
  for (int slot : in_flight) runner.wait(slot);
  log_info("tensor parallel: rank {} stopped after {} steps", control.rank(), steps);
}

}  // namespace deepinfer
