// Fuzzes tokenizer.json parsing: arbitrary bytes must load or throw
// deepinfer::Error, and a tokenizer that loads must encode and decode safely.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "tokenizer/streaming_detokenizer.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    auto tok = deepinfer::Tokenizer::from_json(text);
    for (std::string_view sample : {"Hello world 123 ", "<s> é\xE2\x82\xAC\xF0\x9F\x98\x80 \n\t", "\xFF\xC3"}) {
      auto ids = tok->encode(sample, true);
      std::string decoded = tok->decode(ids, false);
      deepinfer::StreamingDetokenizer stream(*tok, true);
      for (int32_t id : ids) stream.push(id);
      stream.finish();
    }
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
