// tokenizer.json decoders: turn a sequence of token strings back into text.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace deepinfer::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Transforms the list of token strings (tokenizers' decode_chain); the final text
  // is the concatenation of the result.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // Turns one token into the exact bytes it adds in the middle of a text:
  // unlike decode_chain, no UTF-8 repair (a token may hold part of a
  // character) and nothing that only happens at the text's start (Strip).
  // What grammar engines need to match tokens against a grammar.
  virtual void token_bytes(std::string& token) const {}
};

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config);

}  // namespace deepinfer::tok
