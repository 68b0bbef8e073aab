#include "tokenizer/vocab.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <limits>

#include "core/error.h"

namespace deepinfer::tok {

namespace {

uint64_t text_hash(std::string_view text) { return XXH3_64bits(text.data(), text.size()); }

}  // namespace

Vocab::Vocab(std::span<const std::string_view> tokens) {
  DI_CHECK(tokens.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()), "tokenizer: vocabulary too large");
  size_t total = 0, indexed = 0;
  for (auto t : tokens) {
    total += t.size();
    indexed += !t.empty();
  }
  DI_CHECK(total <= std::numeric_limits<uint32_t>::max(), "tokenizer: vocabulary texts exceed 4 GiB");
  bytes_.reserve(total);
  offsets_.reserve(tokens.size() + 1);
  offsets_.push_back(0);
  for (auto t : tokens) {
    bytes_.insert(bytes_.end(), t.begin(), t.end());
    offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
  }

  slots_.assign(std::bit_ceil(std::max<size_t>(16, indexed + indexed / 2)), Slot{0, -1});
  mask_ = slots_.size() - 1;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string_view text = tokens[id];
    if (text.empty()) continue;
    const uint64_t h = text_hash(text);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = Slot{tag, static_cast<int32_t>(id)};
        break;
      }
      if (s.tag == tag && (*this)[s.id] == text) break;  // a repeated text keeps its first id
    }
  }
}

std::optional<int32_t> Vocab::find(std::string_view text) const {
  if (slots_.empty()) return std::nullopt;
  const uint64_t h = text_hash(text);
  const auto tag = static_cast<uint32_t>(h >> 32);
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.id < 0) return std::nullopt;
    if (s.tag == tag && (*this)[s.id] == text) return s.id;
  }
}

}  // namespace deepinfer::tok
