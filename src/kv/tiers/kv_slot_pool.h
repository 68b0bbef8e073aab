// KvSlotPool: block-sized slots below the device pages, each holding one KV
// block's payload and its identity (key, parent key or salt, token ids), as
// KvTiers uses them: a slot is reserved for a key, filled (a device copy or a
// disk read), and only then published; lookups confirm a hit by content;
// pinned slots are never reused. Two kinds:
//   HostKvTier    - process-local host memory (kv/tiers/host_tier.h);
//   SharedKvPool  - slots other processes on the node read too (device memory
//                   over CUDA IPC, or shared host memory): how a prefill engine
//                   hands KV to a decode engine (kv/tiers/shared_pool.h).
// Implementations are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "kv/tiers/disk_tier.h"

namespace deepinfer {

struct HostKvTierStats {
  int64_t hits = 0, misses = 0;
  int64_t stored = 0;       // slots published
  int64_t evictions = 0;    // published slots reused for other blocks
  int64_t expirations = 0;  // slots dropped past their time to live
  int64_t full = 0;         // reserve() calls refused because every slot was pinned
  int64_t blocks = 0, capacity_blocks = 0;
};

class KvSlotPool {
 public:
  virtual ~KvSlotPool() = default;

  virtual size_t block_bytes() const = 0;
  virtual int64_t capacity_blocks() const = 0;
  // Whether payload() is device memory (a disk tier cannot read it directly).
  virtual bool payload_on_device() const { return false; }

  // A pinned slot for a new block, not visible to lookups until publish();
  // nothing when the key is already present (published or being filled) or
  // when every slot is pinned. expires_at: Unix seconds, 0 = never.
  virtual std::optional<int32_t> reserve(const KvBlockIdentity& id, int64_t expires_at) = 0;
  // The slot's payload, writable while reserved, readable while pinned.
  virtual std::span<std::byte> payload(int32_t slot) = 0;
  // The reserved slot now holds its block: lookups may find it. Unpins it.
  virtual void publish(int32_t slot) = 0;
  // Drops a reserved slot that could not be filled. Unpins it.
  virtual void abandon(int32_t slot) = 0;

  // The published slot holding exactly this block (content verified), pinned
  // until unpin(); -1 on a miss (an expired slot is dropped).
  virtual int32_t find_and_pin(const KvBlockIdentity& id) = 0;
  virtual void pin(int32_t slot) = 0;
  virtual void unpin(int32_t slot) = 0;

  // Whether a slot is published or being filled for the key (no verification).
  virtual bool contains(uint64_t key) const = 0;
  // The identity a published, pinned slot holds (for writing it to disk).
  virtual KvBlockIdentity identity(int32_t slot) const = 0;
  virtual int64_t expires_at(int32_t slot) const = 0;

  virtual HostKvTierStats stats() const = 0;
};

}  // namespace deepinfer
