// Incremental detokenization for streamed generation: feed ids one at a time and
// get the new text. Never emits a broken UTF-8 sequence, and the concatenation of
// everything emitted (including finish()) equals Tokenizer::decode of all ids.
//
// Decoding a window of the last tokens instead of only the new one keeps the
// decoders' context rules right (SentencePiece strips the space of the first
// token only, byte-level and byte-fallback characters span several tokens): the
// new text is decode(window + new) minus decode(window). Runs of byte-fallback
// tokens are held until they end, because their decoding depends on the whole run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer {

class Tokenizer;

class StreamingDetokenizer {
 public:
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Text that became final with this token (often "", e.g. mid-character).
  std::string push(int32_t id);
  // Whatever is still held back (an incomplete character at the end of the stream
  // decodes to U+FFFD, as the full decode does).
  std::string finish();
  void reset();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0;       // start of the context window
  size_t read_ = 0;         // tokens before read_ have been emitted
  std::string prefix_text_;  // decode(ids_[prefix_, read_))
};

}  // namespace deepinfer
