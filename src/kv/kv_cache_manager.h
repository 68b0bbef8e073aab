// KvCacheManager: which KV pages each sequence holds, per layer group.
//
// It owns the block pool and the prefix cache and, for every sequence it has
// admitted, one page table per group of the KvLayout. A full-attention group's
// table covers the whole sequence. A sliding-window group's table releases
// its leading pages once the window has moved past them (they stay in the
// prefix cache until the pool hands them out again), and holds pages for at
// most window - 1 + max_step_tokens positions while a long prompt is
// prefilled in chunks — so a model whose layers are mostly windowed (Gemma 3,
// gpt-oss) stores roughly the window, not the context, for those layers.
//
// Positions are allocated ahead of use: admit() for a new sequence (after a
// prefix-cache lookup), allocate_slots() for the next tokens plus any
// lookahead slots (speculative drafts). commit() records what a step
// computed: full blocks go to the prefix cache and windows release pages.
// Nothing here touches tensors or scheduler state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_layout.h"
#include "kv/kv_tier_link.h"
#include "kv/prefix_cache.h"

namespace deepinfer {

struct KvManagerConfig {
  int32_t block_size = 16;
  // The most tokens of one sequence that one step computes (the token
  // budget): what a windowed group must hold beyond its window while a prompt
  // is prefilled in chunks.
  int32_t max_step_tokens = 2048;
  bool enable_prefix_caching = true;
  // SWA bounded replay (tier hits of models with sliding-window layers): the
  // speculative rollback r added to the window W of tokens replayed.
  int32_t swa_replay_rollback = 6;
};

// A sequence's token ids as prompt followed by outputs, without copying.
struct SequenceTokens {
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
  int32_t size() const { return static_cast<int32_t>(prompt.size() + output.size()); }
  int32_t at(int32_t i) const {
    return i < static_cast<int32_t>(prompt.size()) ? prompt[static_cast<size_t>(i)]
                                                   : output[static_cast<size_t>(i) - prompt.size()];
  }
  std::vector<int32_t> slice(int32_t begin, int32_t end) const;  // tokens [begin, end)
};

// One group's pages of one sequence: blocks[i] holds positions
// [i * block_size, (i + 1) * block_size). The first num_released entries are
// no longer held (a window passed them, or a prefix hit did not need them);
// their ids are kept only as the prefix-cache parents of later blocks, or are
// kNoBlock where a window passed positions before they were allocated.
struct GroupTable {
  static constexpr int32_t kNoBlock = -1;
  std::vector<int32_t> blocks;
  int32_t num_released = 0;
  int32_t num_held() const { return static_cast<int32_t>(blocks.size()) - num_released; }
};

struct SequenceKv {
  std::vector<GroupTable> groups;       // one per layout group
  std::vector<BlockHash> block_hashes;  // chained hashes of the full blocks seen so far
  int32_t num_registered_blocks = 0;    // leading blocks already offered to the prefix cache
  int64_t cache_ttl_s = 0;              // how long lower tiers keep its blocks (0 = their default)
  // False after an SWA replay: its windowed layers did not see keys before
  // the replay start, so nothing it computes is exact enough to cache.
  bool cacheable = true;
  // After an SWA replay: the position windowed tables start at (keys before
  // it are never read, by design); 0 otherwise.
  int32_t replay_start = 0;
};

class KvCacheManager {
 public:
  KvCacheManager(KvLayout layout, int32_t num_blocks, KvManagerConfig config);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // Takes a new sequence whose tokens are all known: reuses the longest prefix
  // of full blocks every group has cached (always leaving the last token to
  // compute), continues it with blocks the lower tiers hold (loaded into
  // fresh pages), and allocates pages for the rest. Returns the number of
  // cached tokens, or nothing (and holds nothing) when that would leave fewer
  // than reserve_blocks blocks free. cache_ttl_s: how long lower tiers keep
  // the blocks this sequence computes (0 = their default).
  std::optional<int32_t> admit(uint64_t seq, std::span<const int32_t> tokens, std::string_view salt,
                               int32_t reserve_blocks, int64_t cache_ttl_s = 0);
  // Leading full blocks of `tokens` (their chain hashes: `hashes`) every
  // group has cached on the device (the most admit() would reuse from
  // there), without taking them.
  int32_t num_cached_blocks(std::span<const BlockHash> hashes, std::span<const int32_t> tokens,
                            std::string_view salt) const;

  // Tiers below the device pages (null: none). Registered blocks of the
  // tier groups are offered to them; admit() loads what they hold beyond the
  // device's hits.
  //
  // A model with sliding-window layers keeps only its full-attention groups
  // in the tiers (SWA bounded replay): a tier hit ending at h loads those
  // groups up to s = h - (W + r) (rounded down to a block; W the largest
  // window, r = swa_replay_rollback), and the prefill from s rebuilds the
  // windowed layers' KV with query i attending keys max(s, i - W + 1)..i
  // (their tables start at s). That is an approximation by design: the
  // sequence then caches nothing. The hit is at most L - (W + r) tokens and
  // the replay costs W + r tokens whatever the prefix's length.
  void set_tier_link(KvTierLink* link) { tier_link_ = link; }
  // The groups the tiers keep: all of them, or the full-attention ones when
  // some are windowed (none when every layer is windowed).
  const std::vector<int32_t>& tier_groups() const { return tier_groups_; }
  // Tokens a tier hit recomputes for the windowed layers (W + r; 0 without windows).
  int32_t swa_replay_tokens() const { return replay_tokens_; }
  int64_t num_swa_replays() const { return num_swa_replays_; }
  // Prompt tokens admit() took from the lower tiers.
  int64_t tier_hit_tokens() const { return tier_hit_tokens_; }
  // Returns to the pool the blocks the tiers have finished copying (also
  // done by release_deferred()).
  void collect_tier_releases();
  size_t num_tier_held_blocks() const { return tier_held_.size(); }
  // Pages for the next num_new tokens after num_computed, plus num_lookahead
  // more slots; a windowed group allocates for at most max_step_tokens of the
  // new ones. All or nothing: false when the pool is short.
  bool allocate_slots(uint64_t seq, int32_t num_computed, int32_t num_new, int32_t num_lookahead);
  // After a step: positions [0, num_computed) hold K/V. Registers newly full
  // blocks whose ids are known (tokens) with the prefix cache and releases
  // the pages every window has passed.
  void commit(uint64_t seq, const SequenceTokens& tokens, int32_t num_computed, std::string_view salt);

  // Releases a sequence's pages now (preemption, or no step in flight uses them).
  void free(uint64_t seq);
  // Forgets the sequence now but returns its pages to the pool only when
  // release_deferred() reports step `step` complete.
  void free_after_step(uint64_t seq, uint64_t step);
  void release_deferred(uint64_t completed_step);
  size_t num_deferred_blocks() const;

  bool holds(uint64_t seq) const { return seqs_.contains(seq); }
  const SequenceKv& tables(uint64_t seq) const;

  // Blocks a sequence of num_tokens holds while it decodes (full groups: all
  // of its pages; windowed groups: the window's).
  int64_t blocks_when_decoding(int32_t num_tokens) const;
  // The most blocks a sequence of up to num_tokens can hold at once.
  int64_t max_blocks(int32_t num_tokens) const;

  const KvLayout& layout() const { return layout_; }
  int32_t block_size() const { return config_.block_size; }
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  const PrefixCache* prefix_cache() const { return prefix_cache_ ? &*prefix_cache_ : nullptr; }
  size_t num_sequences() const { return seqs_.size(); }

  // Pool and prefix-cache integrity, and every block's refcount equal to the
  // tables and deferred lists holding it; throws deepinfer::Error naming the
  // first inconsistency.
  void check_integrity() const;

 private:
  int32_t blocks_for(int32_t num_tokens) const { return (num_tokens + config_.block_size - 1) / config_.block_size; }
  // First block a query at `position` of a group with this window still reads.
  int32_t first_needed_block(int32_t position, int32_t window) const;
  // Blocks group g's table should span once num_new tokens after num_computed (+ lookahead) have slots.
  int32_t table_end(const KvGroup& g, int32_t num_computed, int32_t num_new, int32_t num_lookahead) const;
  void register_full_blocks(SequenceKv& s, const SequenceTokens& tokens, int32_t num_computed, std::string_view salt);
  // Releases the pages of a windowed group that no query from num_computed on
  // reads; positions never allocated get kNoBlock entries.
  void release_passed(GroupTable& t, int32_t window, int32_t num_computed);
  // Appends fresh blocks until the table spans `end`; the caller checked they are free.
  void grow_table(GroupTable& t, int32_t end);
  // Blocks a sequence of num_tokens holds while a step computes new_tokens of it.
  int64_t blocks_held(int32_t num_tokens, int32_t new_tokens) const;
  // Held blocks, each group's last block first, so shared prefixes are evicted last.
  std::vector<int32_t> detach(SequenceKv& s) const;

  KvLayout layout_;
  KvManagerConfig config_;
  BlockPool pool_;
  std::optional<PrefixCache> prefix_cache_;
  std::unordered_map<uint64_t, SequenceKv> seqs_;
  KvTierLink* tier_link_ = nullptr;
  std::vector<int32_t> tier_groups_;
  std::vector<bool> in_tiers_;  // per group
  int32_t replay_tokens_ = 0;
  int64_t num_swa_replays_ = 0;
  std::unordered_multiset<int32_t> tier_held_;  // blocks referenced while the tiers copy them
  int64_t tier_hit_tokens_ = 0;
  struct DeferredBlocks {
    uint64_t step;
    std::vector<int32_t> blocks;
  };
  std::vector<DeferredBlocks> deferred_;
};

}  // namespace deepinfer
