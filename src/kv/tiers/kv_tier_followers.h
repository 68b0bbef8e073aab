// The host KV tier under tensor parallelism: every rank holds its own heads'
// slice of each cached block, so rank 0's KvTiers, which decides everything
// (what is offloaded to which host slot, what is loaded back), tells the
// other ranks each copy it makes, and each of them makes the same copy of its
// slice (engine/kv_tier_mirror.h) at the same point of the step sequence.
#pragma once

#include <cstdint>
#include <span>

namespace deepinfer {

struct KvSlotCopy {
  int32_t block = 0;  // device page
  int32_t slot = 0;   // host slot
};

class KvTierFollowers {
 public:
  virtual ~KvTierFollowers() = default;
  // Device blocks to host slots, after the steps published so far (the ones
  // that wrote them). num_slots: the host tier's size, the same on every rank.
  virtual void offload(int32_t num_slots, std::span<const KvSlotCopy> copies) = 0;
  // Host slots to device blocks, before the next published step (which reads
  // them). Only slots whose offload rank 0 has seen complete.
  virtual void load(int32_t num_slots, std::span<const KvSlotCopy> copies) = 0;
};

}  // namespace deepinfer
