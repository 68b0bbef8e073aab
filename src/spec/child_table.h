// ChildTable: the suffix trees' (parent, token) -> child index, as an
// open-addressing hash table with linear probing. Every draft and every
// appended token costs tens of lookups or inserts, and a per-request tree
// holds ~max_depth entries per token of context; std::unordered_map's node
// per entry made that the largest host cost of a drafting step (one
// allocation per insert, a cache miss per lookup). Erasing shifts the
// following run back (no tombstones), so lookups stay short under churn.
#pragma once

#include <cstdint>
#include <vector>

namespace deepinfer::spec {

class ChildTable {
 public:
  static constexpr int32_t kAbsent = -1;

  int32_t find(int32_t parent, int32_t token) const {
    if (size_ == 0) return kAbsent;
    const uint64_t k = key(parent, token);
    for (size_t i = home(k);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value == kAbsent) return kAbsent;
      if (s.key == k) return s.value;
    }
  }
  // Adds a child that find() reported absent.
  void insert(int32_t parent, int32_t token, int32_t child) {
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    const uint64_t k = key(parent, token);
    size_t i = home(k);
    while (slots_[i].value != kAbsent) i = (i + 1) & mask_;
    slots_[i] = Slot{k, child};
    ++size_;
  }
  void erase(int32_t parent, int32_t token) {
    if (size_ == 0) return;
    const uint64_t k = key(parent, token);
    size_t i = home(k);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].value == kAbsent) return;
      if (slots_[i].key == k) break;
    }
    // Backward shift: move later entries of the run into the hole when their
    // home position does not lie cyclically in (hole, their slot].
    size_t hole = i;
    for (size_t j = (i + 1) & mask_; slots_[j].value != kAbsent; j = (j + 1) & mask_) {
      const size_t h = home(slots_[j].key);
      const bool stays = hole < j ? (h > hole && h <= j) : (h > hole || h <= j);
      if (!stays) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key = 0;
    int32_t value = kAbsent;
  };
  static uint64_t key(int32_t parent, int32_t token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(parent)) << 32) | static_cast<uint32_t>(token);
  }
  size_t home(uint64_t k) const {
    k *= 0x9e3779b97f4a7c15ull;  // Fibonacci hashing: the high bits mix parent and token
    return static_cast<size_t>(k >> shift_) & mask_;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    const size_t n = old.empty() ? 64 : old.size() * 2;
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    shift_ = 64 - static_cast<int>(__builtin_ctzll(n));
    size_ = 0;
    for (const Slot& s : old) {
      if (s.value == kAbsent) continue;
      size_t i = home(s.key);
      while (slots_[i].value != kAbsent) i = (i + 1) & mask_;
      slots_[i] = s;
      ++size_;
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

}  // namespace deepinfer::spec
