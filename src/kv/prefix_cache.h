// PrefixCache: finds the KV blocks that already hold a prompt's leading full
// blocks, so prefill can skip them.
//
// Block i of a sequence is keyed by a chained hash
//   hash_0 = H(root(salt), tokens[0 .. bs)),  hash_i = H(hash_{i-1}, tokens of block i)
// (xxHash3, 64 bit). The optional per-request cache salt enters block 0 only, so
// equal prompts under different salts (tenants) never share blocks. Only full
// blocks are cached.
//
// A hash is only a lookup key: a hit is confirmed by content. Each cached block
// keeps its token ids, its extra key (the salt, for block 0) and the unique id of
// the cache entry it was computed after; match() requires all three to agree,
// so a hash collision can cost a miss but never returns wrong KV.
//
// A model whose layers form several KV groups (kv_layout.h) caches each
// group's blocks under the same hashes, told apart by the group index: a hit
// only ever returns blocks of the group that asked.
//
// Cached blocks live in the BlockPool: a block referenced by a running sequence
// is pinned; a released one stays cached in the pool's free queue (LRU) until
// the pool hands it out again, at which point this cache, the pool's
// BlockReuseListener, forgets it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace deepinfer {

struct BlockHash {
  uint64_t value = 0;
  friend bool operator==(BlockHash a, BlockHash b) { return a.value == b.value; }
};

struct PrefixCacheStats {
  int64_t num_queries = 0;   // match() calls
  int64_t query_tokens = 0;  // prompt tokens passed to match()
  int64_t hit_tokens = 0;    // tokens covered by the returned blocks
};

class PrefixCache : public BlockReuseListener {
 public:
  static constexpr int32_t kNoParent = -1;

  // Subscribes to the pool's reuse notifications for its lifetime.
  PrefixCache(BlockPool& pool, int32_t block_size);
  ~PrefixCache() override;
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Chained hashes of the full blocks of `tokens` (a trailing partial block is
  // not hashed).
  static std::vector<BlockHash> compute_block_hashes(std::span<const int32_t> tokens, int32_t block_size,
                                                     std::string_view salt = {});
  // Appends the hashes of the full blocks of more_tokens, the tokens that
  // follow the blocks `hashes` already covers (the chain continues from them).
  static void extend_block_hashes(std::vector<BlockHash>& hashes, std::span<const int32_t> more_tokens,
                                  int32_t block_size, std::string_view salt = {});

  // Ids of the cached blocks holding the longest prefix of blocks 0..k-1,
  // k <= hashes.size(); `tokens` holds at least hashes.size() full blocks. Pass
  // fewer hashes than full blocks to keep the tail uncached (prefill must compute
  // at least the last prompt token). The caller then refs the returned blocks.
  std::vector<int32_t> match(std::span<const BlockHash> hashes, std::span<const int32_t> tokens,
                             std::string_view salt = {}, int32_t group = 0);
  // match() without counting the query in stats(): for admission attempts that
  // may be retried; call record_query() once the request is admitted.
  std::vector<int32_t> lookup(std::span<const BlockHash> hashes, std::span<const int32_t> tokens,
                              std::string_view salt = {}, int32_t group = 0) const;
  void record_query(int64_t query_tokens, int64_t hit_tokens);

  // Registers block_id, which the caller holds (refcount > 0) and has just
  // filled, as block `hash` whose predecessor in the sequence is
  // parent_block_id (kNoParent for block 0, which also takes the salt).
  // Returns false, caching nothing, when the parent is not cached or when an
  // identical block is already cached (the caller keeps its private copy).
  // Inserting over a different entry with the same hash replaces it.
  bool insert(BlockHash hash, int32_t block_id, std::span<const int32_t> block_tokens, int32_t parent_block_id,
              std::string_view salt = {}, int32_t group = 0);

  bool is_cached(int32_t block_id) const;
  int32_t num_cached_blocks() const { return static_cast<int32_t>(by_hash_.size()); }
  int32_t block_size() const { return block_size_; }
  const PrefixCacheStats& stats() const { return stats_; }

  // Forgets every cached block (the blocks themselves stay where they are).
  void clear();

  // Verifies the hash map against the per-block entries; throws
  // deepinfer::Error describing the first inconsistency.
  void check_integrity() const;

  void on_block_reuse(int32_t block_id) override;

 private:
  friend struct PrefixCacheTestAccess;
  static constexpr uint64_t kRootUid = 0;

  struct Entry {
    bool cached = false;
    BlockHash hash;
    uint64_t uid = 0;         // never reused, so a child can name its exact parent
    uint64_t parent_uid = 0;  // kRootUid for block 0
    std::string extra;        // salt for block 0, empty otherwise
    int32_t group = 0;        // KV group whose layers the block holds
  };

  // Map key of a block hash within a group (group 0 keys by the hash itself).
  static uint64_t key(BlockHash hash, int32_t group) {
    return hash.value ^ (static_cast<uint64_t>(group) * 0x9e37'79b9'7f4a'7c15ULL);
  }

  std::span<const int32_t> stored_tokens(int32_t block_id) const;
  void uncache(int32_t block_id);

  BlockPool& pool_;
  int32_t block_size_;
  std::vector<Entry> entries_;  // indexed by block id
  std::vector<int32_t> tokens_;  // block_size_ token ids per block id
  std::unordered_map<uint64_t, int32_t> by_hash_;
  uint64_t next_uid_ = kRootUid + 1;
  PrefixCacheStats stats_;
};

}  // namespace deepinfer
