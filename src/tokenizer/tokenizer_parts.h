// The pieces a Tokenizer is assembled from, filled by the tokenizer.json and
// GGUF front ends (internal to the tokenizer module).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace deepinfer {

struct Tokenizer::Parts {
  tok::Vocab vocab;  // model vocabulary by id, indexed once and handed to the model
  std::vector<tok::BpeMerge> merges;
  tok::BpeOptions options;
  std::vector<tok::AddedToken> added;
  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tok::Decoder> decoder;
  std::vector<int32_t> prefix, suffix;  // post-processor template around the text
};

}  // namespace deepinfer
