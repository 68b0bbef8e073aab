// KvTierLink: what the KV-cache manager asks of the tiers below the device
// pages (host memory, disk; kv/tiers/kv_tiers.h). The manager decides which
// device blocks hold what; the link moves bytes. Blocks are named as the
// prefix cache names them: chain hash, group, parent hash or salt, tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kv/prefix_cache.h"

namespace deepinfer {

// A full block of one layer group of a sequence.
struct KvBlockRef {
  int32_t group = 0;
  int32_t index = 0;  // block index in the sequence
  BlockHash hash;
  BlockHash parent;  // block index - 1's hash; unused for block 0
  std::string_view salt;
  std::span<const int32_t> tokens;
};

// The blocks a new sequence could load: hashes[i] is block i's chain hash,
// tokens holds at least hashes.size() full blocks; `groups` are the layer
// groups the tiers keep (KvCacheManager::tier_groups()).
struct KvTierQuery {
  std::span<const BlockHash> hashes;
  std::span<const int32_t> tokens;
  std::string_view salt;
  int32_t block_size = 0;
  std::span<const int32_t> groups;
};

class KvTierLink {
 public:
  virtual ~KvTierLink() = default;

  // The prefix cache registered device block `block_id` as `ref`; the step
  // being launched writes its K/V. ttl_s: how long the lower tiers keep it
  // (0 = their default). True when the tiers will copy it: the manager then
  // keeps the block out of the pool until take_released_blocks() returns it,
  // so no later step overwrites it while the copy may still read it.
  virtual bool on_registered(const KvBlockRef& ref, int32_t block_id, int64_t ttl_s) = 0;
  // Blocks whose copies (on_registered) have landed since the last call.
  virtual std::vector<int32_t> take_released_blocks() = 0;

  // The longest run of blocks from..to-1 that the tiers hold for every
  // group, held for load() until release(); 0 when none (or when loading
  // them would be slower than recomputing).
  virtual int32_t acquire(const KvTierQuery& query, int32_t from, int32_t to) = 0;
  // Fills device block block_id with acquired block `index` of `group`
  // (ordered before the next step that reads it).
  virtual void load(int32_t index, int32_t group, int32_t block_id) = 0;
  // Ends an acquire(): blocks not loaded are let go.
  virtual void release() = 0;
};

}  // namespace deepinfer
