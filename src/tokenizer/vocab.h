// A token vocabulary: text by id and id by text.
//
// The index is one flat open-addressing table of (hash tag, id) slots filled in a
// single pass. A node-based map costs one allocation per token and two or three
// dependent cache misses per lookup; here loading a 262k-token vocabulary makes
// one allocation, and a lookup touches one slot and, when the tag matches, the
// token's text. Loading GGUF vocabularies does a few million lookups, so this is
// most of their start-up time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::tok {

class Vocab {
 public:
  Vocab() = default;
  // tokens[id] is the text of token id; "" marks ids without a token (not indexed).
  // Where several ids share a text, find() returns the lowest of them.
  explicit Vocab(std::vector<std::string> tokens);

  std::optional<int32_t> find(std::string_view text) const;

  size_t size() const { return tokens_.size(); }
  const std::string& operator[](size_t id) const { return tokens_[id]; }
  const std::vector<std::string>& tokens() const { return tokens_; }

 private:
  struct Slot {
    uint32_t tag;  // high half of the text's hash
    int32_t id;    // -1: empty
  };
  std::vector<std::string> tokens_;
  std::vector<Slot> slots_;  // power-of-two size, at most 2/3 full
  size_t mask_ = 0;
};

}  // namespace deepinfer::tok
