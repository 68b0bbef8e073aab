#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

std::vector<int32_t> SequenceTokens::slice(int32_t begin, int32_t end) const {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(end - begin));
  for (int32_t i = begin; i < end; ++i) out.push_back(at(i));
  return out;
}

KvCacheManager::KvCacheManager(KvLayout layout, int32_t num_blocks, KvManagerConfig config)
    : layout_(std::move(layout)), config_(config), pool_(num_blocks) {
  DI_CHECK(config_.block_size > 0, "KV cache: block size must be positive, got {}", config_.block_size);
  DI_CHECK(config_.max_step_tokens > 0, "KV cache: the per-step token budget must be positive, got {}",
           config_.max_step_tokens);
  DI_CHECK(layout_.num_groups() > 0, "KV cache: the layout has no layer group");
  if (config_.enable_prefix_caching) prefix_cache_.emplace(pool_, config_.block_size);
  int32_t max_window = 0;
  for (const KvGroup& g : layout_.groups) max_window = std::max(max_window, g.window);
  if (max_window > 0) replay_tokens_ = max_window + std::max(config_.swa_replay_rollback, 0);
  in_tiers_.assign(static_cast<size_t>(layout_.num_groups()), false);
  for (int32_t g = 0; g < layout_.num_groups(); ++g) {
    if (layout_.groups[static_cast<size_t>(g)].window == 0) {
      tier_groups_.push_back(g);
      in_tiers_[static_cast<size_t>(g)] = true;
    }
  }
}

int32_t KvCacheManager::first_needed_block(int32_t position, int32_t window) const {
  if (window <= 0) return 0;
  return std::max(position - window + 1, 0) / config_.block_size;
}

int32_t KvCacheManager::table_end(const KvGroup& g, int32_t num_computed, int32_t num_new,
                                  int32_t num_lookahead) const {
  const int32_t step = g.window > 0 ? std::min(num_new, config_.max_step_tokens) : num_new;
  return blocks_for(num_computed + step + num_lookahead);
}

const SequenceKv& KvCacheManager::tables(uint64_t seq) const {
  auto it = seqs_.find(seq);
  DI_CHECK(it != seqs_.end(), "KV cache: sequence {} holds no pages", seq);
  return it->second;
}

std::optional<int32_t> KvCacheManager::admit(uint64_t seq, std::span<const int32_t> tokens, std::string_view salt,
                                             int32_t reserve_blocks, int64_t cache_ttl_s) {
  DI_CHECK(!seqs_.contains(seq), "KV cache: sequence {} is already admitted", seq);
  DI_CHECK(!tokens.empty(), "KV cache: sequence {} has no tokens", seq);
  const auto total = static_cast<int32_t>(tokens.size());
  const int32_t bs = config_.block_size;
  const int32_t n_groups = layout_.num_groups();
  SequenceKv s;
  s.cache_ttl_s = cache_ttl_s;
  s.groups.resize(static_cast<size_t>(n_groups));
  std::vector<std::vector<int32_t>> hits(static_cast<size_t>(n_groups));
  int32_t hit_blocks = 0;   // on the device
  int32_t tier_blocks = 0;  // after those, in the lower tiers
  if (prefix_cache_) {
    s.block_hashes = PrefixCache::compute_block_hashes(tokens, bs, salt);
    // At least the last token must be computed to produce logits.
    const int32_t usable_blocks = std::min<int32_t>(static_cast<int32_t>(s.block_hashes.size()), (total - 1) / bs);
    hit_blocks = usable_blocks;
    for (int32_t g = 0; g < n_groups && hit_blocks > 0; ++g) {
      const auto usable = std::span(s.block_hashes).first(static_cast<size_t>(hit_blocks));
      hits[g] = prefix_cache_->lookup(usable, tokens, salt, g);
      hit_blocks = std::min(hit_blocks, static_cast<int32_t>(hits[g].size()));
    }
    if (tier_link_ != nullptr && !tier_groups_.empty() && hit_blocks < usable_blocks) {
      const KvTierQuery query{s.block_hashes, tokens, salt, bs, tier_groups_};
      tier_blocks = tier_link_->acquire(query, hit_blocks, usable_blocks);
      if (replay_tokens_ > 0 && tier_blocks > 0) {
        // SWA bounded replay: the windowed layers rebuild the last W + r tokens.
        const int32_t replay_from = std::max((hit_blocks + tier_blocks) * bs - replay_tokens_, 0) / bs;
        tier_blocks = std::max(replay_from - hit_blocks, 0);
      }
    }
  }
  const bool replay = replay_tokens_ > 0 && tier_blocks > 0;
  const int32_t cached_blocks = hit_blocks + tier_blocks;
  const int32_t cached = cached_blocks * bs;
  // Each group keeps the cached blocks its first query still reads: device
  // hits are referenced (those with refcount 0 count as free in the pool
  // until then), tier hits take fresh pages like the blocks still to compute.
  std::vector<int32_t> first_held(static_cast<size_t>(n_groups)), ends(static_cast<size_t>(n_groups));
  int64_t free_after_refs = pool_.num_free();
  int64_t need = 0;
  for (int32_t g = 0; g < n_groups; ++g) {
    const KvGroup& group = layout_.groups[static_cast<size_t>(g)];
    // After a replay a windowed group starts empty at the replay start.
    first_held[g] = replay && group.window > 0 ? cached_blocks
                                               : std::min(first_needed_block(cached, group.window), cached_blocks);
    ends[g] = table_end(group, cached, total - cached, 0);
    for (int32_t i = first_held[g]; i < hit_blocks; ++i) free_after_refs -= pool_.refcount(hits[g][i]) == 0;
    need += std::max(ends[g] - std::max(first_held[g], hit_blocks), 0);
  }
  if (need + reserve_blocks > free_after_refs) {
    if (tier_link_ != nullptr) tier_link_->release();
    return std::nullopt;
  }
  if (prefix_cache_) prefix_cache_->record_query(total, cached);
  for (int32_t g = 0; g < n_groups; ++g) {
    GroupTable& t = s.groups[static_cast<size_t>(g)];
    t.blocks.assign(hits[g].begin(), hits[g].begin() + hit_blocks);
    // Tier blocks a window has already passed are neither loaded nor held.
    if (first_held[g] > hit_blocks) t.blocks.resize(static_cast<size_t>(first_held[g]), GroupTable::kNoBlock);
    t.num_released = first_held[g];
    for (int32_t i = t.num_released; i < hit_blocks; ++i) pool_.ref(t.blocks[static_cast<size_t>(i)]);
    grow_table(t, ends[g]);
    for (int32_t i = std::max(first_held[g], hit_blocks); i < cached_blocks; ++i) {
      const int32_t block = t.blocks[static_cast<size_t>(i)];
      tier_link_->load(i, g, block);
      // Cached on the device from now on, where its parent is known.
      if (i == 0 || i - 1 >= t.num_released) {
        const auto block_tokens = tokens.subspan(static_cast<size_t>(i) * bs, static_cast<size_t>(bs));
        const int32_t parent = i == 0 ? PrefixCache::kNoParent : t.blocks[static_cast<size_t>(i - 1)];
        prefix_cache_->insert(s.block_hashes[static_cast<size_t>(i)], block, block_tokens, parent, salt, g);
      }
    }
  }
  if (tier_link_ != nullptr) tier_link_->release();
  tier_hit_tokens_ += int64_t{tier_blocks} * bs;
  num_swa_replays_ += replay;
  s.cacheable = !replay;
  s.replay_start = replay ? cached : 0;
  s.num_registered_blocks = cached_blocks;
  seqs_.emplace(seq, std::move(s));
  return cached;
}

int32_t KvCacheManager::num_cached_blocks(std::span<const BlockHash> hashes, std::span<const int32_t> tokens,
                                          std::string_view salt) const {
  if (!prefix_cache_) return 0;
  auto n = static_cast<int32_t>(hashes.size());
  for (int32_t g = 0; g < layout_.num_groups() && n > 0; ++g) {
    n = std::min(n, static_cast<int32_t>(prefix_cache_->lookup(hashes.first(static_cast<size_t>(n)), tokens, salt, g)
                                             .size()));
  }
  return n;
}

bool KvCacheManager::allocate_slots(uint64_t seq, int32_t num_computed, int32_t num_new, int32_t num_lookahead) {
  DI_CHECK(num_computed >= 0 && num_new >= 0 && num_lookahead >= 0,
           "KV cache: negative slot request ({} computed, {} new, {} lookahead)", num_computed, num_new, num_lookahead);
  auto it = seqs_.find(seq);
  DI_CHECK(it != seqs_.end(), "KV cache: sequence {} holds no pages", seq);
  SequenceKv& s = it->second;
  // Pages a window has already passed are never allocated.
  for (int32_t g = 0; g < layout_.num_groups(); ++g) {
    release_passed(s.groups[static_cast<size_t>(g)], layout_.groups[static_cast<size_t>(g)].window, num_computed);
  }
  int64_t need = 0;
  for (int32_t g = 0; g < layout_.num_groups(); ++g) {
    const int32_t end = table_end(layout_.groups[static_cast<size_t>(g)], num_computed, num_new, num_lookahead);
    need += std::max(end - static_cast<int32_t>(s.groups[static_cast<size_t>(g)].blocks.size()), 0);
  }
  if (need > pool_.num_free()) return false;
  for (int32_t g = 0; g < layout_.num_groups(); ++g) {
    grow_table(s.groups[static_cast<size_t>(g)],
               table_end(layout_.groups[static_cast<size_t>(g)], num_computed, num_new, num_lookahead));
  }
  return true;
}

void KvCacheManager::grow_table(GroupTable& t, int32_t end) {
  const int32_t grow = end - static_cast<int32_t>(t.blocks.size());
  if (grow <= 0) return;
  auto fresh = pool_.allocate(grow);
  DI_CHECK(fresh.has_value(), "KV cache: {} blocks counted free but not allocatable", grow);
  t.blocks.insert(t.blocks.end(), fresh->begin(), fresh->end());
}

void KvCacheManager::register_full_blocks(SequenceKv& s, const SequenceTokens& tokens, int32_t num_computed,
                                          std::string_view salt) {
  if (!s.cacheable) return;
  const int32_t bs = config_.block_size;
  // Only blocks whose token ids are all known on the host (none in flight).
  const int32_t known = std::min(num_computed, tokens.size());
  int32_t full = known / bs;
  for (const GroupTable& t : s.groups) full = std::min(full, static_cast<int32_t>(t.blocks.size()));
  if (full <= s.num_registered_blocks) return;
  // The tokens of the blocks to register; hashes only for blocks not hashed yet.
  const int32_t from = s.num_registered_blocks;
  const std::vector<int32_t> ids = tokens.slice(from * bs, full * bs);
  const auto hashed = static_cast<int32_t>(s.block_hashes.size());
  DI_CHECK(hashed >= from, "KV cache: {} blocks registered but only {} hashed", from, hashed);
  if (hashed < full) {
    PrefixCache::extend_block_hashes(s.block_hashes, std::span(ids).subspan(static_cast<size_t>(hashed - from) * bs),
                                     bs, salt);
  }
  for (int32_t i = from; i < full; ++i) {
    const auto block_tokens = std::span(ids).subspan(static_cast<size_t>(i - from) * bs, static_cast<size_t>(bs));
    for (int32_t g = 0; g < layout_.num_groups(); ++g) {
      const GroupTable& t = s.groups[static_cast<size_t>(g)];
      // A block no longer held, or one whose predecessor is not, cannot be
      // named safely: its chain is broken for this sequence.
      if (i < t.num_released || (i > 0 && i - 1 < t.num_released)) continue;
      const int32_t block = t.blocks[static_cast<size_t>(i)];
      if (prefix_cache_->is_cached(block)) continue;
      const int32_t parent = i == 0 ? PrefixCache::kNoParent : t.blocks[static_cast<size_t>(i - 1)];
      const BlockHash hash = s.block_hashes[static_cast<size_t>(i)];
      if (prefix_cache_->insert(hash, block, block_tokens, parent, salt, g) && tier_link_ != nullptr &&
          in_tiers_[static_cast<size_t>(g)]) {
        const BlockHash parent_hash = i == 0 ? BlockHash{} : s.block_hashes[static_cast<size_t>(i - 1)];
        if (tier_link_->on_registered({g, i, hash, parent_hash, salt, block_tokens}, block, s.cache_ttl_s)) {
          pool_.ref(block);
          tier_held_.insert(block);
        }
      }
    }
  }
  s.num_registered_blocks = full;
}

void KvCacheManager::commit(uint64_t seq, const SequenceTokens& tokens, int32_t num_computed, std::string_view salt) {
  auto it = seqs_.find(seq);
  DI_CHECK(it != seqs_.end(), "KV cache: sequence {} holds no pages", seq);
  SequenceKv& s = it->second;
  if (prefix_cache_) register_full_blocks(s, tokens, num_computed, salt);
  for (int32_t g = 0; g < layout_.num_groups(); ++g) {
    release_passed(s.groups[static_cast<size_t>(g)], layout_.groups[static_cast<size_t>(g)].window, num_computed);
  }
}

void KvCacheManager::release_passed(GroupTable& t, int32_t window, int32_t num_computed) {
  if (window <= 0) return;
  // The next query sits at position num_computed.
  const int32_t dead = first_needed_block(num_computed, window);
  const int32_t held_end = std::min(dead, static_cast<int32_t>(t.blocks.size()));
  for (int32_t b = t.num_released; b < held_end; ++b) pool_.release(t.blocks[static_cast<size_t>(b)]);
  if (static_cast<int32_t>(t.blocks.size()) < dead) t.blocks.resize(static_cast<size_t>(dead), GroupTable::kNoBlock);
  t.num_released = std::max(t.num_released, dead);
}

std::vector<int32_t> KvCacheManager::detach(SequenceKv& s) const {
  std::vector<int32_t> reversed;
  for (GroupTable& t : s.groups) {
    for (auto b = static_cast<int32_t>(t.blocks.size()) - 1; b >= t.num_released; --b) {
      reversed.push_back(t.blocks[static_cast<size_t>(b)]);
    }
    t.blocks.clear();
    t.num_released = 0;
  }
  return reversed;
}

void KvCacheManager::free(uint64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  pool_.release(detach(it->second));
  seqs_.erase(it);
}

void KvCacheManager::free_after_step(uint64_t seq, uint64_t step) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  std::vector<int32_t> blocks = detach(it->second);
  seqs_.erase(it);
  if (!blocks.empty()) deferred_.push_back({step, std::move(blocks)});
}

void KvCacheManager::release_deferred(uint64_t completed_step) {
  auto keep = std::stable_partition(deferred_.begin(), deferred_.end(),
                                    [&](const DeferredBlocks& d) { return d.step > completed_step; });
  for (auto it = keep; it != deferred_.end(); ++it) pool_.release(it->blocks);
  deferred_.erase(keep, deferred_.end());
  collect_tier_releases();
}

void KvCacheManager::collect_tier_releases() {
  if (tier_link_ == nullptr) return;
  for (int32_t b : tier_link_->take_released_blocks()) {
    auto it = tier_held_.find(b);
    DI_CHECK(it != tier_held_.end(), "KV cache: the tiers released block {} they did not hold", b);
    tier_held_.erase(it);
    pool_.release(b);
  }
}

size_t KvCacheManager::num_deferred_blocks() const {
  size_t n = 0;
  for (const DeferredBlocks& d : deferred_) n += d.blocks.size();
  return n;
}

int64_t KvCacheManager::blocks_held(int32_t num_tokens, int32_t new_tokens) const {
  const int32_t all = blocks_for(num_tokens);
  int64_t n = 0;
  for (const KvGroup& g : layout_.groups) {
    // A query sees `window` positions, itself included: (window - 1) before
    // the step's first new token, which may start mid-block.
    n += g.window > 0 ? std::min(all, blocks_for(g.window - 1 + new_tokens) + 1) : all;
  }
  return n;
}

int64_t KvCacheManager::blocks_when_decoding(int32_t num_tokens) const { return blocks_held(num_tokens, 0); }

int64_t KvCacheManager::max_blocks(int32_t num_tokens) const {
  return blocks_held(num_tokens, config_.max_step_tokens);
}

void KvCacheManager::check_integrity() const {
  pool_.check_integrity();
  if (prefix_cache_) prefix_cache_->check_integrity();
  std::vector<int32_t> holders(static_cast<size_t>(pool_.num_blocks()), 0);
  auto count = [&](int32_t b, uint64_t seq) {
    DI_CHECK(b >= 0 && b < pool_.num_blocks(), "KV cache integrity: sequence {} names block {} of {}", seq, b,
             pool_.num_blocks());
    ++holders[static_cast<size_t>(b)];
  };
  for (const auto& [seq, s] : seqs_) {
    DI_CHECK(s.groups.size() == layout_.groups.size(), "KV cache integrity: sequence {} has {} tables for {} groups",
             seq, s.groups.size(), layout_.groups.size());
    for (const GroupTable& t : s.groups) {
      DI_CHECK(t.num_released >= 0 && t.num_released <= static_cast<int32_t>(t.blocks.size()),
               "KV cache integrity: sequence {} released {} of {} blocks", seq, t.num_released, t.blocks.size());
      for (size_t b = static_cast<size_t>(t.num_released); b < t.blocks.size(); ++b) count(t.blocks[b], seq);
    }
  }
  for (const DeferredBlocks& d : deferred_) {
    for (int32_t b : d.blocks) count(b, 0);
  }
  for (int32_t b : tier_held_) count(b, 0);
  for (int32_t b = 0; b < pool_.num_blocks(); ++b) {
    DI_CHECK(pool_.refcount(b) == holders[static_cast<size_t>(b)],
             "KV cache integrity: block {} has refcount {} but {} holders", b, pool_.refcount(b),
             holders[static_cast<size_t>(b)]);
  }
}

}  // namespace deepinfer
