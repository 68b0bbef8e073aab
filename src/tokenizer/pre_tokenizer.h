// tokenizer.json pre-tokenizers: cut normalized text into the pieces ("words")
// that the model encodes independently.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace deepinfer::tok {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every piece further (pieces may also be rewritten). at_text_start: the
  // first piece begins at the start of the input text (Metaspace "first" scheme).
  virtual void apply(std::vector<std::string>& pieces, bool at_text_start) const = 0;
  // When the last step is ByteLevel, stops it from mapping bytes to its printable
  // alphabet and returns true: the BPE model then reads raw bytes directly, which
  // is equivalent and faster.
  virtual bool defer_byte_mapping() { return false; }
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config);

}  // namespace deepinfer::tok
