// A bound on how much normalizers and pre-tokenizers may lengthen text. Real
// ones grow it by a small factor (byte-level mapping turns each byte >= 0x80
// into two; Metaspace turns a space into three bytes), but a tokenizer.json
// that chains them, e.g. twenty byte-level pre-tokenizers in a Sequence, would
// grow it exponentially and stall every request it encodes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace deepinfer::tok {

constexpr size_t kMaxTextGrowth = 16;     // times the input
constexpr size_t kTextGrowthSlack = 4096;  // bytes, for short inputs

inline void check_text_growth(size_t original_bytes, size_t bytes, std::string_view stage) {
  DI_CHECK(bytes <= kMaxTextGrowth * original_bytes + kTextGrowthSlack,
           "tokenizer: the {} grew {} bytes of text to {} (more than {}x): the tokenizer file is not usable", stage,
           original_bytes, bytes, kMaxTextGrowth);
}

// The same for text split into pieces (pre-tokenizers).
inline void check_text_growth(size_t original_bytes, const std::vector<std::string>& pieces, std::string_view stage) {
  size_t bytes = 0;
  for (const auto& p : pieces) bytes += p.size();
  check_text_growth(original_bytes, bytes, stage);
}

}  // namespace deepinfer::tok
