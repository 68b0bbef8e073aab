#include "tokenizer/streaming_detokenizer.h"

#include <cctype>
#include <span>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

namespace {

bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

// A byte-fallback token "<0xHH>". tokenizers' ByteFallback decoder renders a whole
// run of them as U+FFFD per byte when the run is not valid UTF-8, so text already
// decoded from a run can change until the run ends.
bool is_byte_token(std::string_view t) {
  return t.size() == 6 && t[0] == '<' && t[1] == '0' && t[2] == 'x' && t[5] == '>' &&
         std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]));
}

}  // namespace

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

void StreamingDetokenizer::reset() {
  ids_.clear();
  prefix_ = read_ = 0;
  prefix_text_.clear();
}

std::string StreamingDetokenizer::push(int32_t id) {
  ids_.push_back(id);
  // Wait while a byte run may still be open. Tokens that decode to nothing (ids
  // outside the vocabulary, skipped special tokens) do not end a run either.
  std::string_view token = tokenizer_.id_to_token(id);
  if (is_byte_token(token) || token.empty() || (skip_special_ && tokenizer_.is_special(id))) return {};
  std::span<const int32_t> window(ids_.data() + prefix_, ids_.size() - prefix_);
  std::string text = tokenizer_.decode(window, skip_special_);
  // Hold back while the window ends inside a character (the decoders render an
  // incomplete sequence as U+FFFD) or while the old text is not yet a prefix.
  if (text.size() <= prefix_text_.size() || ends_with_replacement(text) ||
      text.compare(0, prefix_text_.size(), prefix_text_) != 0)
    return {};
  std::string out = text.substr(prefix_text_.size());
  prefix_ = read_;
  read_ = ids_.size();
  prefix_text_ = tokenizer_.decode(std::span<const int32_t>(ids_.data() + prefix_, read_ - prefix_), skip_special_);
  // Drop ids that can no longer influence the output to keep decoding O(window).
  if (prefix_ > 0) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(prefix_));
    read_ -= prefix_;
    prefix_ = 0;
  }
  return out;
}

std::string StreamingDetokenizer::finish() {
  std::span<const int32_t> window(ids_.data() + prefix_, ids_.size() - prefix_);
  std::string text = tokenizer_.decode(window, skip_special_);
  std::string out;
  if (text.size() > prefix_text_.size() && text.compare(0, prefix_text_.size(), prefix_text_) == 0)
    out = text.substr(prefix_text_.size());
  reset();
  return out;
}

}  // namespace deepinfer
