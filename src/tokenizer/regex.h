// A compiled PCRE2 pattern (UTF + Unicode properties + JIT) for the split
// regexes of pre-tokenizers; matches are reported as byte ranges.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::tok {

class Regex {
 public:
  // literal: the pattern is matched as plain text (tokenizer.json {"String": ...}).
  Regex(std::string_view pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-empty matches, left to right, as [begin, end) byte offsets. text must be valid UTF-8.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  // Replaces every match with replacement (no group references).
  std::string replace_all(std::string_view text, std::string_view replacement) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  bool literal_;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace deepinfer::tok
