// Text <-> token ids for real model families: byte-level BPE (GPT-2 style) and
// SentencePiece-style BPE with byte fallback, loaded from a Hugging Face
// tokenizer.json (+ tokenizer_config.json) or from a GGUF file's vocabulary.
//
// Encoding follows Hugging Face `tokenizers` exactly: added tokens are cut out
// first, the rest is normalized, pre-tokenized and BPE-encoded word by word; with
// add_special_tokens the post-processor's template (e.g. BOS) is applied. Input
// that is not valid UTF-8 is not an error: invalid sequences are replaced by
// U+FFFD first (what Python's bytes.decode(errors="replace") gives before HF
// sees the text).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace deepinfer {

class GgufFile;

namespace tok {
class BpeModel;
class Normalizer;
class PreTokenizer;
class Decoder;
class AddedTokenMatcher;
struct AddedToken;
}  // namespace tok

class Tokenizer {
 public:
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // tokenizer.json contents. config: the parsed tokenizer_config.json, or null.
  static std::unique_ptr<Tokenizer> from_json(std::string_view tokenizer_json, const nlohmann::json* config = nullptr);
  // The tokenizer.* metadata of a GGUF file (models "gpt2" and "llama").
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& gguf);
  // A tokenizer.json, a folder holding one (and tokenizer_config.json), or a .gguf file.
  // A tokenizer_config.json beside a tokenizer.json is read too.
  static std::unique_ptr<Tokenizer> from_file(const std::string& path);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Ids outside the vocabulary are skipped (as tokenizers does).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  // Every token that ends a generation: eos plus end-of-turn tokens of the family.
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool is_special(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // "" for ids outside the vocabulary.
  std::string_view id_to_token(int32_t id) const;
  // The bytes token `id` adds in the middle of a decoded text (possibly part
  // of a UTF-8 character); "" for special tokens and ids outside the
  // vocabulary. What a grammar matcher compares with its grammar.
  std::string token_bytes(int32_t id) const;

  const std::string& chat_template() const { return chat_template_; }
  // Replaces the chat template (a model's own may be missing or unwanted).
  void set_chat_template(std::string source) { chat_template_ = std::move(source); }
  // Token texts for chat templates ("" when the tokenizer has none).
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // Ids the post-processor puts around the text when add_special_tokens is set.
  const std::vector<int32_t>& prefix_ids() const { return prefix_ids_; }
  const std::vector<int32_t>& suffix_ids() const { return suffix_ids_; }

  // The pipeline before it is assembled (internal: filled by the front ends).
  struct Parts;

 private:
  Tokenizer();
  void assemble(Parts&& parts);
  void apply_config(const nlohmann::json& config);
  void finish_special_ids();
  void encode_plain(std::string_view text, bool at_text_start, std::vector<int32_t>& out) const;

  std::unique_ptr<tok::BpeModel> model_;
  std::unique_ptr<tok::Normalizer> normalizer_;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tok::Decoder> decoder_;
  std::unique_ptr<tok::AddedTokenMatcher> raw_matcher_;         // added tokens matched before normalization
  std::unique_ptr<tok::AddedTokenMatcher> normalized_matcher_;  // ... and after it

  // Views of model_'s vocabulary and of added_index_'s keys (map nodes never move).
  std::vector<std::string_view> id_to_token_;
  std::unordered_map<std::string, int32_t> added_index_;
  std::vector<uint8_t> special_;
  std::vector<uint8_t> added_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  std::optional<int32_t> bos_id_, eos_id_;
  std::vector<int32_t> eos_ids_;
  std::string bos_token_, eos_token_;
  std::string chat_template_;
};

}  // namespace deepinfer
