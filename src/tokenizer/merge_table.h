// BPE merges by pair of token ids: one flat open-addressing table, sized once.
// The BPE loop looks a pair up for every candidate merge, and a vocabulary
// derived from SentencePiece scores has ~500k merges: a node-based map costs an
// allocation per merge at load and a chain of cache misses per lookup.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

namespace deepinfer::tok {

class MergeTable {
 public:
  struct Value {
    int32_t rank, merged;
  };

  // Room for n pairs without growing (the table never grows: callers know n).
  explicit MergeTable(size_t n = 0)
      : slots_(std::bit_ceil(std::max<size_t>(16, n + n / 2)), Slot{kEmpty, {0, 0}}),
        shift_(64 - std::countr_zero(slots_.size())) {}

  // Callers insert at most the n distinct pairs the table was sized for (it does
  // not grow). Ids are >= 0, so no pair has the empty slot's key.
  void insert_or_assign(int32_t a, int32_t b, Value v) {
    const uint64_t key = pair_key(a, b);
    for (size_t i = slot_of(key);; i = (i + 1) & (slots_.size() - 1)) {
      Slot& s = slots_[i];
      if (s.key == kEmpty || s.key == key) {
        s = Slot{key, v};
        return;
      }
    }
  }

  const Value* find(int32_t a, int32_t b) const {
    const uint64_t key = pair_key(a, b);
    for (size_t i = slot_of(key);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& s = slots_[i];
      if (s.key == kEmpty) return nullptr;
      if (s.key == key) return &s.value;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key;
    Value value;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Fibonacci hashing: the top bits of key * 2^64/phi spread the structured keys.
  size_t slot_of(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }

  std::vector<Slot> slots_;  // power-of-two size, at most 2/3 full
  int shift_;
};

}  // namespace deepinfer::tok
