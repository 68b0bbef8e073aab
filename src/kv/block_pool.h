// BlockPool: the KV block ids of one cache, their reference counts and the free
// queue. CPU bookkeeping only; the K/V tensors live in KvStorage.
//
// The free queue is ordered least-recently-freed first: release() appends a block
// at the tail, allocate() takes blocks from the head. A freed block keeps its
// content (and its prefix-cache registration) until allocate() hands it out
// again, so the free queue doubles as the LRU eviction order of unreferenced
// cached blocks. Whoever caches block contents (PrefixCache) subscribes as the
// BlockReuseListener and forgets a block the moment it is handed out again.
//
// Every operation is O(1) per block: the queue is an intrusive doubly linked
// list threaded through per-block prev/next ids.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace deepinfer {

class BlockReuseListener {
 public:
  virtual ~BlockReuseListener() = default;
  // Called by BlockPool::allocate() for each block taken from the free queue,
  // before it is handed out: its old content is about to be overwritten.
  virtual void on_block_reuse(int32_t block_id) = 0;
};

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Takes n blocks from the head of the free queue, each with refcount 1, or
  // nothing (std::nullopt) if fewer than n are free. n = 0 yields an empty list.
  std::optional<std::vector<int32_t>> allocate(int32_t n);

  // Adds a reference. A block with refcount 0 (free but still holding cached
  // content, e.g. a prefix-cache hit) is taken out of the free queue without
  // notifying the listener: its content stays valid.
  void ref(int32_t block_id);

  // Drops a reference; at 0 the block goes to the tail of the free queue.
  // Releasing a block with refcount 0 throws (double free).
  void release(int32_t block_id);
  // Releases in the given order. Callers free a sequence's blocks last block
  // first so that its shared prefix blocks are evicted last.
  void release(std::span<const int32_t> block_ids);

  int32_t refcount(int32_t block_id) const;
  int32_t num_free() const { return num_free_; }
  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Fraction of blocks in use (refcount > 0), in [0, 1].
  double usage() const;

  // Free-queue order from head (next to be allocated) to tail; for tests/debug.
  std::vector<int32_t> free_queue() const;

  // At most one listener; nullptr unsubscribes.
  void set_reuse_listener(BlockReuseListener* listener) { listener_ = listener; }

  // Verifies the queue links, the free count and that the blocks with
  // refcount 0 are exactly those in the free queue; throws deepinfer::Error
  // describing the first inconsistency.
  void check_integrity() const;

 private:
  friend struct BlockPoolTestAccess;
  static constexpr int32_t kNone = -1;

  struct Block {
    int32_t refcount = 0;
    int32_t prev = kNone;
    int32_t next = kNone;
    bool in_free_queue = false;
  };

  void check_id(int32_t block_id) const;
  void push_tail(int32_t block_id);
  void unlink(int32_t block_id);

  std::vector<Block> blocks_;
  int32_t head_ = kNone;
  int32_t tail_ = kNone;
  int32_t num_free_ = 0;
  BlockReuseListener* listener_ = nullptr;
};

}  // namespace deepinfer
