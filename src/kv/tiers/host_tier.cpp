#include "kv/tiers/host_tier.h"

#include <algorithm>

#include "backend/backend.h"
#include "core/error.h"

namespace deepinfer {

HostKvTier::HostKvTier(Backend& backend, size_t block_bytes, int64_t capacity_blocks)
    : backend_(backend), block_bytes_(block_bytes) {
  DI_CHECK(block_bytes > 0, "host KV tier: block size must be positive");
  DI_CHECK(capacity_blocks > 0 && capacity_blocks < (int64_t{1} << 30), "host KV tier: {} blocks is out of range",
           capacity_blocks);
  memory_ = static_cast<std::byte*>(backend_.allocate_host(block_bytes_ * static_cast<size_t>(capacity_blocks)));
  slots_.resize(static_cast<size_t>(capacity_blocks));
  free_.reserve(slots_.size());
  for (auto s = static_cast<int32_t>(capacity_blocks) - 1; s >= 0; --s) free_.push_back(s);
  stats_.capacity_blocks = capacity_blocks;
}

HostKvTier::~HostKvTier() { backend_.deallocate_host(memory_); }

int64_t HostKvTier::now_seconds() const {
  return std::chrono::duration_cast<std::chrono::seconds>(now_().time_since_epoch()).count();
}

void HostKvTier::sync_lru(Slot& s, int32_t slot) {
  const bool want = s.state == State::Ready && s.pins == 0;
  if (want && !s.in_lru) {
    lru_.push_front(slot);
    s.lru = lru_.begin();
  } else if (!want && s.in_lru) {
    lru_.erase(s.lru);
  }
  s.in_lru = want;
}

void HostKvTier::drop(int32_t slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (s.in_lru) lru_.erase(s.lru);
  s.in_lru = false;
  if (s.state == State::Ready) --ready_;
  by_key_.erase(s.key);
  s.state = State::Free;
  s.tokens.clear();
  s.salt.clear();
  free_.push_back(slot);
}

std::optional<int32_t> HostKvTier::reserve(const KvBlockIdentity& id, int64_t expires_at) {
  std::lock_guard lock(mutex_);
  if (by_key_.contains(id.key)) return std::nullopt;
  if (free_.empty() && !lru_.empty()) {
    // The least recently used slot nobody is reading or writing.
    drop(lru_.back());
    ++stats_.evictions;
  }
  if (free_.empty()) {
    ++stats_.full;
    return std::nullopt;
  }
  const int32_t slot = free_.back();
  free_.pop_back();
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.state = State::Filling;
  s.pins = 1;
  s.key = id.key;
  s.parent_key = id.parent_key;
  s.first = id.first;
  s.salt.assign(id.salt);
  s.tokens.assign(id.tokens.begin(), id.tokens.end());
  s.expires_at = expires_at;
  by_key_.emplace(id.key, slot);
  return slot;
}

std::span<std::byte> HostKvTier::payload(int32_t slot) {
  DI_CHECK(slot >= 0 && slot < static_cast<int32_t>(slots_.size()), "host KV tier: slot {} out of range", slot);
  return {memory_ + static_cast<size_t>(slot) * block_bytes_, block_bytes_};
}

void HostKvTier::publish(int32_t slot) {
  std::lock_guard lock(mutex_);
  Slot& s = slots_[static_cast<size_t>(slot)];
  DI_CHECK(s.state == State::Filling && s.pins > 0, "host KV tier: publishing slot {} that was not reserved", slot);
  s.state = State::Ready;
  --s.pins;
  ++ready_;
  sync_lru(s, slot);
  ++stats_.stored;
}

void HostKvTier::abandon(int32_t slot) {
  std::lock_guard lock(mutex_);
  Slot& s = slots_[static_cast<size_t>(slot)];
  DI_CHECK(s.state == State::Filling, "host KV tier: abandoning slot {} that was not reserved", slot);
  s.pins = 0;
  drop(slot);
}

bool HostKvTier::matches(const Slot& s, const KvBlockIdentity& id) const {
  if (s.first != id.first || s.tokens.size() != id.tokens.size() ||
      !std::equal(s.tokens.begin(), s.tokens.end(), id.tokens.begin())) {
    return false;
  }
  return id.first ? s.salt == id.salt : s.parent_key == id.parent_key;
}

int32_t HostKvTier::find_and_pin(const KvBlockIdentity& id) {
  std::lock_guard lock(mutex_);
  auto it = by_key_.find(id.key);
  if (it == by_key_.end()) {
    ++stats_.misses;
    return -1;
  }
  const int32_t slot = it->second;
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (s.state != State::Ready || !matches(s, id)) {
    ++stats_.misses;
    return -1;
  }
  if (s.expires_at != 0 && s.expires_at <= now_seconds()) {
    ++stats_.misses;
    if (s.pins == 0) {
      drop(slot);
      ++stats_.expirations;
    }
    return -1;
  }
  ++s.pins;
  sync_lru(s, slot);  // out of the list while pinned; back at the front when unpinned
  ++stats_.hits;
  return slot;
}

void HostKvTier::pin(int32_t slot) {
  std::lock_guard lock(mutex_);
  Slot& s = slots_[static_cast<size_t>(slot)];
  ++s.pins;
  sync_lru(s, slot);
}

void HostKvTier::unpin(int32_t slot) {
  std::lock_guard lock(mutex_);
  Slot& s = slots_[static_cast<size_t>(slot)];
  DI_CHECK(s.pins > 0, "host KV tier: unpinning slot {} that is not pinned", slot);
  --s.pins;
  sync_lru(s, slot);
}

bool HostKvTier::contains(uint64_t key) const {
  std::lock_guard lock(mutex_);
  return by_key_.contains(key);
}

KvBlockIdentity HostKvTier::identity(int32_t slot) const {
  std::lock_guard lock(mutex_);
  const Slot& s = slots_[static_cast<size_t>(slot)];
  DI_CHECK(s.pins > 0, "host KV tier: slot {} must be pinned to read its identity", slot);
  // The strings and tokens stay put while the slot is pinned.
  return KvBlockIdentity{s.key, s.parent_key, s.first, s.salt, s.tokens};
}

int64_t HostKvTier::expires_at(int32_t slot) const {
  std::lock_guard lock(mutex_);
  return slots_[static_cast<size_t>(slot)].expires_at;
}

HostKvTierStats HostKvTier::stats() const {
  std::lock_guard lock(mutex_);
  HostKvTierStats s = stats_;
  s.blocks = ready_;
  return s;
}

}  // namespace deepinfer
