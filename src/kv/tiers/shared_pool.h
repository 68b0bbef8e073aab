// SharedKvPool: KV block slots that every process on the node can read — the
// one-node transport between a prefill engine and a decode engine
// (`serve --kv-transport shared`, docs/router.md).
//
// The exporting engine (prefill) creates the pool and uses it as the tier
// right below its device pages: every block its prefix cache registers is
// copied into a slot by the tiers' copy stream, exactly as into host memory.
// The slots are device memory shared through CUDA IPC where the backend has
// device memory (a device-to-device copy on each side, no host round trip),
// else they live in the shared segment itself (the CPU backend). The importing
// engine (decode) attaches to the pool by name and loads the blocks a new
// request's prompt needs from it as from its own host tier, into its own
// device pages.
//
// Metadata lives in a POSIX shared-memory segment (/dev/shm/deepinfer-kv-*):
// a header naming the model fingerprint and layout, one record per slot
// (state, pins, identity, expiry, last use), the slots' salts and token ids,
// and an open-addressed index from key to slot. A process-shared robust mutex
// guards it (a process that dies holding it leaves it usable). Only the
// creator changes which key a slot holds; importers pin, read and unpin.
// Everything an importer reads from the segment is bounds-checked: a segment
// of another model, layout or format is refused at attach, a damaged record
// is a miss.
//
// Pins: a slot an importer copies from stays pinned until its copy has landed
// (one step). A pin older than two minutes is taken for the leftover of a
// process that died holding it, and the slot becomes reusable again.
// Lifetime: the creator unlinks the segment when it ends; a creator finding
// segments of processes that no longer run removes them. An importer stops
// using a pool whose creator is gone (its device memory is gone with it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "kv/tiers/kv_slot_pool.h"

namespace deepinfer {

class Backend;

class SharedKvPool final : public KvSlotPool {
 public:
  struct Options {
    std::string fingerprint;  // the model, weights, KV dtype and layout (kv_cache_fingerprint)
    size_t block_bytes = 0;
    int64_t capacity_blocks = 0;  // create() only
    int32_t block_tokens = 0;     // token ids per block identity
  };

  // The exporting side: a new segment under a fresh name. Throws when the
  // shared memory or the device memory cannot be had.
  static std::unique_ptr<SharedKvPool> create(Backend& backend, const Options& options);
  // The importing side: maps the pool `name` another process created, or
  // nullptr (logged) when the name is malformed, the segment is missing or
  // damaged, made for another model or layout, or its memory cannot be mapped.
  static std::unique_ptr<SharedKvPool> attach(Backend& backend, std::string_view name, const Options& expect);
  // Whether `name` has the form create() gives names (deepinfer-kv-PID-N).
  static bool valid_name(std::string_view name);

  ~SharedKvPool() override;
  SharedKvPool(const SharedKvPool&) = delete;
  SharedKvPool& operator=(const SharedKvPool&) = delete;

  const std::string& name() const { return name_; }
  bool is_creator() const { return creator_; }
  // Importer: whether the creating process still runs.
  bool creator_alive() const;

  // KvSlotPool. reserve/publish/abandon are the creator's; the rest both sides'.
  size_t block_bytes() const override { return block_bytes_; }
  int64_t capacity_blocks() const override { return capacity_; }
  bool payload_on_device() const override { return device_memory_ != nullptr; }
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

 private:
  struct Header;
  struct SlotRecord;
  class SegmentLock;

  SharedKvPool(Backend& backend, std::string name, bool creator);
  // The segment's parts, from the header (validated first on attach).
  void bind_segment();
  SlotRecord& record(int32_t slot) const;
  char* salt_of(int32_t slot) const;
  int32_t* tokens_of(int32_t slot) const;
  // Index (under the lock): the slot holding `key`, -1 when none.
  int32_t index_find(uint64_t key) const;
  void index_insert(uint64_t key, int32_t slot);
  void index_erase(uint64_t key);
  void index_rebuild();
  bool matches(int32_t slot, const KvBlockIdentity& id) const;
  void drop(int32_t slot);  // creator, under the lock
  static void remove_orphaned_segments();

  Backend& backend_;
  std::string name_;
  bool creator_ = false;
  void* segment_ = nullptr;
  size_t segment_bytes_ = 0;
  Header* header_ = nullptr;
  SlotRecord* slots_ = nullptr;
  int32_t* index_ = nullptr;
  char* salts_ = nullptr;
  int32_t* tokens_ = nullptr;
  std::byte* payload_ = nullptr;
  void* device_memory_ = nullptr;  // the payload when on the device (created or opened)
  size_t block_bytes_ = 0;
  int64_t capacity_ = 0;
  uint32_t block_tokens_ = 0;
  uint64_t index_size_ = 0;

  mutable std::mutex stats_mutex_;  // this process's view
  mutable HostKvTierStats stats_;
};

}  // namespace deepinfer
