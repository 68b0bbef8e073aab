// A token vocabulary: text by id and id by text, in three flat arrays.
//
// Token texts are stored back to back in one buffer with an offset per id, and the
// index is one open-addressing table of (hash tag, id) slots. Loading a 262k-token
// vocabulary (Gemma 3) thus makes a handful of allocations instead of one or two
// per token, and a lookup touches one slot and, when the tag matches, the token's
// bytes. GGUF SentencePiece vocabularies derive their merges with over a million
// lookups at load, so this layout is most of their start-up time.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace deepinfer::tok {

class Vocab {
 public:
  Vocab() = default;
  // tokens[id] is the text of token id; "" marks ids without a token (not indexed).
  // Where several ids share a text, find() returns the lowest of them.
  explicit Vocab(std::span<const std::string_view> tokens);

  std::optional<int32_t> find(std::string_view text) const;

  size_t size() const { return offsets_.empty() ? 0 : offsets_.size() - 1; }
  // Valid as long as the Vocab lives (moving it keeps the buffer).
  std::string_view operator[](size_t id) const {
    return {bytes_.data() + offsets_[id], offsets_[id + 1] - offsets_[id]};
  }

 private:
  struct Slot {
    uint32_t tag;  // high half of the text's hash
    int32_t id;    // -1: empty
  };
  std::vector<char> bytes_;        // every token's text, by id
  std::vector<uint32_t> offsets_;  // token id's text is bytes_[offsets_[id], offsets_[id + 1])
  std::vector<Slot> slots_;        // power-of-two size, at most 2/3 full
  size_t mask_ = 0;
};

}  // namespace deepinfer::tok
