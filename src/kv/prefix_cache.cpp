#include "kv/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

namespace {

// Seeds of block 0's hash: distinct for "no salt" and for every salt.
constexpr uint64_t kRootSeed = 0x6b76'6361'6368'6500ULL;

uint64_t root_seed(std::string_view salt) {
  if (salt.empty()) return kRootSeed;
  return XXH3_64bits_withSeed(salt.data(), salt.size(), kRootSeed ^ 1);
}

}  // namespace

PrefixCache::PrefixCache(BlockPool& pool, int32_t block_size) : pool_(pool), block_size_(block_size) {
  DI_CHECK(block_size > 0, "PrefixCache: block size must be positive, got {}", block_size);
  entries_.resize(static_cast<size_t>(pool.num_blocks()));
  tokens_.resize(static_cast<size_t>(pool.num_blocks()) * static_cast<size_t>(block_size));
  pool_.set_reuse_listener(this);
}

PrefixCache::~PrefixCache() { pool_.set_reuse_listener(nullptr); }

std::vector<BlockHash> PrefixCache::compute_block_hashes(std::span<const int32_t> tokens, int32_t block_size,
                                                         std::string_view salt) {
  std::vector<BlockHash> hashes;
  extend_block_hashes(hashes, tokens, block_size, salt);
  return hashes;
}

void PrefixCache::extend_block_hashes(std::vector<BlockHash>& hashes, std::span<const int32_t> more_tokens,
                                      int32_t block_size, std::string_view salt) {
  DI_CHECK(block_size > 0, "PrefixCache: block size must be positive, got {}", block_size);
  const size_t n_blocks = more_tokens.size() / static_cast<size_t>(block_size);
  uint64_t seed = hashes.empty() ? root_seed(salt) : hashes.back().value;
  hashes.reserve(hashes.size() + n_blocks);
  for (size_t i = 0; i < n_blocks; ++i) {
    const int32_t* block = more_tokens.data() + i * static_cast<size_t>(block_size);
    seed = XXH3_64bits_withSeed(block, static_cast<size_t>(block_size) * sizeof(int32_t), seed);
    hashes.push_back({seed});
  }
}

std::span<const int32_t> PrefixCache::stored_tokens(int32_t block_id) const {
  return {tokens_.data() + static_cast<size_t>(block_id) * static_cast<size_t>(block_size_),
          static_cast<size_t>(block_size_)};
}

std::vector<int32_t> PrefixCache::lookup(std::span<const BlockHash> hashes, std::span<const int32_t> tokens,
                                        std::string_view salt, int32_t group) const {
  DI_CHECK(tokens.size() >= hashes.size() * static_cast<size_t>(block_size_),
           "PrefixCache::match: {} hashes but only {} tokens", hashes.size(), tokens.size());
  std::vector<int32_t> ids;
  uint64_t parent_uid = kRootUid;
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto it = by_hash_.find(key(hashes[i], group));
    if (it == by_hash_.end()) break;
    const int32_t id = it->second;
    const Entry& e = entries_[static_cast<size_t>(id)];
    const std::string_view expected_extra = i == 0 ? salt : std::string_view{};
    const auto block = tokens.subspan(i * static_cast<size_t>(block_size_), static_cast<size_t>(block_size_));
    const auto stored = stored_tokens(id);
    if (e.group != group || e.parent_uid != parent_uid || e.extra != expected_extra ||
        !std::equal(block.begin(), block.end(), stored.begin())) {
      break;
    }
    ids.push_back(id);
    parent_uid = e.uid;
  }
  return ids;
}

void PrefixCache::record_query(int64_t query_tokens, int64_t hit_tokens) {
  ++stats_.num_queries;
  stats_.query_tokens += query_tokens;
  stats_.hit_tokens += hit_tokens;
}

std::vector<int32_t> PrefixCache::match(std::span<const BlockHash> hashes, std::span<const int32_t> tokens,
                                        std::string_view salt, int32_t group) {
  std::vector<int32_t> ids = lookup(hashes, tokens, salt, group);
  record_query(static_cast<int64_t>(tokens.size()), static_cast<int64_t>(ids.size()) * block_size_);
  return ids;
}

bool PrefixCache::insert(BlockHash hash, int32_t block_id, std::span<const int32_t> block_tokens,
                         int32_t parent_block_id, std::string_view salt, int32_t group) {
  DI_CHECK(block_id >= 0 && block_id < pool_.num_blocks(), "PrefixCache::insert: block id {} out of range",
           block_id);
  DI_CHECK(block_tokens.size() == static_cast<size_t>(block_size_),
           "PrefixCache::insert: block {} has {} tokens, expected a full block of {}", block_id,
           block_tokens.size(), block_size_);
  DI_CHECK(pool_.refcount(block_id) > 0, "PrefixCache::insert: block {} is not held by the caller", block_id);
  Entry& e = entries_[static_cast<size_t>(block_id)];
  DI_CHECK(!e.cached || (e.hash == hash && e.group == group),
           "PrefixCache::insert: block {} is already cached with another hash or group", block_id);
  if (e.cached) return true;

  uint64_t parent_uid = kRootUid;
  std::string_view extra = salt;
  if (parent_block_id != kNoParent) {
    DI_CHECK(parent_block_id >= 0 && parent_block_id < pool_.num_blocks(),
             "PrefixCache::insert: parent block id {} out of range", parent_block_id);
    const Entry& parent = entries_[static_cast<size_t>(parent_block_id)];
    if (!parent.cached) return false;
    parent_uid = parent.uid;
    extra = {};
  }

  auto it = by_hash_.find(key(hash, group));
  if (it != by_hash_.end()) {
    const int32_t other = it->second;
    const Entry& o = entries_[static_cast<size_t>(other)];
    const auto stored = stored_tokens(other);
    if (o.group == group && o.parent_uid == parent_uid && o.extra == extra &&
        std::equal(block_tokens.begin(), block_tokens.end(), stored.begin())) {
      return false;
    }
    // A stale chain (its parent was evicted) or a true collision: the newer
    // block is the one future requests can reach, so it takes the slot.
    uncache(other);
  }

  e.cached = true;
  e.hash = hash;
  e.uid = next_uid_++;
  e.parent_uid = parent_uid;
  e.extra.assign(extra);
  e.group = group;
  std::copy(block_tokens.begin(), block_tokens.end(),
            tokens_.begin() + static_cast<ptrdiff_t>(block_id) * block_size_);
  by_hash_.emplace(key(hash, group), block_id);
  return true;
}

bool PrefixCache::is_cached(int32_t block_id) const {
  DI_CHECK(block_id >= 0 && block_id < pool_.num_blocks(), "PrefixCache: block id {} out of range", block_id);
  return entries_[static_cast<size_t>(block_id)].cached;
}

void PrefixCache::uncache(int32_t block_id) {
  Entry& e = entries_[static_cast<size_t>(block_id)];
  by_hash_.erase(key(e.hash, e.group));
  e.cached = false;
  e.extra.clear();
}

void PrefixCache::on_block_reuse(int32_t block_id) {
  if (block_id >= 0 && block_id < static_cast<int32_t>(entries_.size()) &&
      entries_[static_cast<size_t>(block_id)].cached) {
    uncache(block_id);
  }
}

void PrefixCache::clear() {
  for (auto& [hash, id] : by_hash_) {
    entries_[static_cast<size_t>(id)].cached = false;
    entries_[static_cast<size_t>(id)].extra.clear();
  }
  by_hash_.clear();
}

void PrefixCache::check_integrity() const {
  DI_CHECK(entries_.size() == static_cast<size_t>(pool_.num_blocks()),
           "PrefixCache integrity: {} entries for a pool of {} blocks", entries_.size(), pool_.num_blocks());
  for (const auto& [hash, id] : by_hash_) {
    DI_CHECK(id >= 0 && id < pool_.num_blocks(), "PrefixCache integrity: hash {:#x} maps to invalid block {}", hash,
             id);
    const Entry& e = entries_[static_cast<size_t>(id)];
    DI_CHECK(e.cached, "PrefixCache integrity: hash {:#x} maps to block {} which is not cached", hash, id);
    DI_CHECK(key(e.hash, e.group) == hash, "PrefixCache integrity: key {:#x} maps to block {} whose key is {:#x}", hash,
             id, key(e.hash, e.group));
  }
  size_t n_cached = 0;
  for (size_t id = 0; id < entries_.size(); ++id) {
    const Entry& e = entries_[id];
    if (!e.cached) continue;
    ++n_cached;
    DI_CHECK(e.uid > kRootUid && e.uid < next_uid_, "PrefixCache integrity: block {} has invalid entry uid {}", id,
             e.uid);
    DI_CHECK(e.parent_uid < e.uid, "PrefixCache integrity: block {} (uid {}) names a later parent uid {}", id, e.uid,
             e.parent_uid);
    DI_CHECK(e.parent_uid == kRootUid || e.extra.empty(),
             "PrefixCache integrity: block {} is not a first block but carries a salt", id);
    auto it = by_hash_.find(key(e.hash, e.group));
    DI_CHECK(it != by_hash_.end() && it->second == static_cast<int32_t>(id),
             "PrefixCache integrity: cached block {} is not reachable through its hash {:#x}", id, e.hash.value);
  }
  DI_CHECK(n_cached == by_hash_.size(), "PrefixCache integrity: {} cached blocks but {} hash entries", n_cached,
           by_hash_.size());
}

}  // namespace deepinfer
