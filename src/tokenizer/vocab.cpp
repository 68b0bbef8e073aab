#include "tokenizer/vocab.h"

#include <xxhash.h>

#include <bit>

namespace deepinfer::tok {

namespace {

uint64_t text_hash(std::string_view text) { return XXH3_64bits(text.data(), text.size()); }

}  // namespace

Vocab::Vocab(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
  size_t n = 0;
  for (const auto& t : tokens_) n += !t.empty();
  slots_.assign(std::bit_ceil(std::max<size_t>(16, n + n / 2)), Slot{0, -1});
  mask_ = slots_.size() - 1;
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& text = tokens_[id];
    if (text.empty()) continue;
    const uint64_t h = text_hash(text);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = Slot{tag, static_cast<int32_t>(id)};
        break;
      }
      if (s.tag == tag && tokens_[s.id] == text) break;  // a repeated text keeps its first id
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
    if (s.tag == tag && tokens_[s.id] == text) return s.id;
  }
}

}  // namespace deepinfer::tok
