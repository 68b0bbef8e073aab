// HostKvTier: KV blocks in host memory (pinned where the backend has it), the
// tier between the device pages and the disk.
//
// A fixed number of block-sized slots in one allocation. Each slot holds one
// block's payload (the layout of KvStorage::save_block) and its identity (the
// key, the parent's key or the salt, and the token ids), so a hit is
// confirmed by content exactly as in the prefix cache and the disk tier.
//
// A slot is reserved for a key, filled (by a device copy or a disk read), and
// only then published: lookups never see a half-written slot. Slots in use by
// a copy or a disk write are pinned and never evicted; otherwise the least
// recently used published slot is reused first (the LRU list holds only
// unpinned published slots, so finding it is O(1) however many are pinned).
// Expired slots are misses.
//
// Thread-safe: the engine thread and the tier's I/O thread both use it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/tiers/disk_tier.h"
#include "kv/tiers/kv_slot_pool.h"

namespace deepinfer {

class Backend;

class HostKvTier final : public KvSlotPool {
 public:
  // capacity_blocks slots of block_bytes each, from backend.allocate_host().
  HostKvTier(Backend& backend, size_t block_bytes, int64_t capacity_blocks);
  ~HostKvTier() override;
  HostKvTier(const HostKvTier&) = delete;
  HostKvTier& operator=(const HostKvTier&) = delete;

  size_t block_bytes() const override { return block_bytes_; }
  int64_t capacity_blocks() const override { return static_cast<int64_t>(slots_.size()); }

  // KvSlotPool (see there).
  std::optional<int32_t> reserve(const KvBlockIdentity& id, int64_t expires_at) override;
  std::span<std::byte> payload(int32_t slot) override;
  void publish(int32_t slot) override;
  void abandon(int32_t slot) override;
  int32_t find_and_pin(const KvBlockIdentity& id) override;
  void pin(int32_t slot) override;
  void unpin(int32_t slot) override;
  bool contains(uint64_t key) const override;
  KvBlockIdentity identity(int32_t slot) const override;
  int64_t expires_at(int32_t slot) const override;
  HostKvTierStats stats() const override;
  void set_clock_for_testing(std::chrono::system_clock::time_point (*now)()) { now_ = now; }

 private:
  enum class State : uint8_t { Free, Filling, Ready };
  struct Slot {
    State state = State::Free;
    int32_t pins = 0;
    uint64_t key = 0, parent_key = 0;
    bool first = false;
    std::string salt;
    std::vector<int32_t> tokens;
    int64_t expires_at = 0;
    bool in_lru = false;               // Ready and unpinned
    std::list<int32_t>::iterator lru;  // valid while in_lru
  };

  int64_t now_seconds() const;
  // Frees a slot (removes it from the index and the LRU list).
  void drop(int32_t slot);
  // Keeps `in_lru` equal to (Ready and unpinned), most recent at the front.
  void sync_lru(Slot& s, int32_t slot);
  bool matches(const Slot& s, const KvBlockIdentity& id) const;

  Backend& backend_;
  size_t block_bytes_;
  std::byte* memory_ = nullptr;
  std::chrono::system_clock::time_point (*now_)() = &std::chrono::system_clock::now;

  mutable std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<int32_t> free_;                 // Free slots
  std::unordered_map<uint64_t, int32_t> by_key_;  // Filling and Ready slots
  std::list<int32_t> lru_;                    // Ready unpinned slots, front = most recently used
  int64_t ready_ = 0;                         // Ready slots
  HostKvTierStats stats_;
};

}  // namespace deepinfer
