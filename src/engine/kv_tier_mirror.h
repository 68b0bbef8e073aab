// A tensor-parallel follower's host KV tier: its slice of every block rank
// 0's KvTiers keeps in host memory, in the same slots, filled and read by the
// copies rank 0 publishes (kv_tier_followers.h). It decides nothing itself.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kv/tiers/kv_tier_followers.h"

namespace deepinfer {

class Backend;
class CopyStream;
class DeviceEvent;
class KvStorage;
struct StepPlan;

class KvTierMirror {
 public:
  KvTierMirror(Backend& backend, KvStorage& storage, int32_t num_slots);
  // Completes the copies in flight.
  ~KvTierMirror();
  KvTierMirror(const KvTierMirror&) = delete;
  KvTierMirror& operator=(const KvTierMirror&) = delete;

  int32_t num_slots() const { return num_slots_; }
  // On a copy stream after the steps launched so far, as rank 0 does.
  void offload(std::span<const KvSlotCopy> copies);
  // On the op stream, before the next step. Rank 0 loads only slots whose
  // offloads it has seen land, into pages no offload still reads; this
  // rank's copies may be behind its, so first waits for those that touch
  // the same slots or pages.
  void load(std::span<const KvSlotCopy> copies);
  // Before launching `plan`: waits for offloads still reading a page the
  // step writes (rank 0 reuses a page only once its own copy has landed).
  void before_step(const StepPlan& plan);

 private:
  struct Batch {
    std::unique_ptr<DeviceEvent> done;
    std::vector<KvSlotCopy> copies;
  };
  void check(const KvSlotCopy& c) const;
  std::byte* slot(int32_t s) const;
  // Waits for the offload batches (oldest first: one copy stream) up to the
  // last one with a copy for which touches(copy) holds; forgets the landed ones.
  template <typename Touches>
  void wait_for_offloads(Touches touches);

  Backend& backend_;
  KvStorage& storage_;
  int32_t num_slots_;
  size_t block_bytes_;
  std::byte* host_ = nullptr;
  std::unique_ptr<CopyStream> copy_stream_;
  std::vector<Batch> in_flight_;
};

}  // namespace deepinfer
