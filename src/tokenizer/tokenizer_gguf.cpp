// Tokenizer::from_gguf: the vocabulary stored in a GGUF file's tokenizer.* metadata.
#include <algorithm>
#include <deque>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "loader/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_parts.h"
#include "tokenizer/utf8.h"

namespace deepinfer {

using json = nlohmann::json;
using namespace tok;

namespace {

// GGUF token types.
constexpr int32_t kTypeNormal = 1;
constexpr int32_t kTypeUnused = 5;
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;

constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kO200kSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kDeepseekV3Split =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json split(const std::string& regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}
json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", use_regex}};
}
json sequence(std::vector<json> parts) { return {{"type", "Sequence"}, {"pretokenizers", parts}}; }

// The pre-tokenizer llama.cpp's tokenizer.ggml.pre names stand for.
json byte_level_pre_tokenizer(std::string_view pre) {
  if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" || pre == "pixtral")
    return sequence({split(kLlama3Split), byte_level(false)});
  if (pre == "qwen2" || pre == "qwen3" || pre == "deepseek-r1-qwen" || pre == "megrez")
    return sequence({split(kQwen2Split), byte_level(false)});
  if (pre == "gpt-4o" || pre == "gpt4o" || pre == "o200k")
    return sequence({split(kO200kSplit), byte_level(false)});
  if (pre == "deepseek-v3")
    return sequence({split(R"(\p{N}{1,3})"), split("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
                     split(kDeepseekV3Split), byte_level(false)});
  if (pre == "smollm" || pre == "starcoder" || pre == "refact")
    return sequence({{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)});
  if (pre != "default" && pre != "gpt-2" && pre != "gpt2")
    log_warn("tokenizer: unknown GGUF pre-tokenizer '{}', using GPT-2's split rules", pre);
  return byte_level(true);
}

template <typename T>
std::vector<T> optional_array(const GgufFile& gguf, const char* key, std::vector<T> (GgufFile::*get)(std::string_view) const,
                              size_t n, T def) {
  if (!gguf.has(key)) return std::vector<T>(n, def);
  std::vector<T> v = (gguf.*get)(key);
  DI_CHECK(v.size() == n, "tokenizer: GGUF {} has {} entries for {} tokens", key, v.size(), n);
  return v;
}

std::optional<int32_t> optional_id(const GgufFile& gguf, const char* key, size_t n) {
  auto v = gguf.find_i64(key);
  if (!v || *v < 0) return std::nullopt;  // some converters store -1 for "none"
  DI_CHECK(static_cast<uint64_t>(*v) < n, "tokenizer: GGUF {} = {} is outside the vocabulary", key, *v);
  return static_cast<int32_t>(*v);
}

// SentencePiece merges by score: any two adjacent pieces whose concatenation is a
// token merge, best-scoring result first. Enumerating every split of every token
// turns this into an ordinary ranked merge list, ordered as transformers'
// SentencePiece converter orders it (score, then longer left piece, then longer
// right piece), so GGUF and tokenizer.json vocabularies tokenize alike.
// User-defined pieces have score 0 in SentencePiece (GGUF writes -1000 for them).
// Gemma 3's 262k tokens have 1.1M splits and 515k merges, so this is the bulk of
// loading such a vocabulary: one flat-index lookup per split (the right piece is
// looked up only when the left one is a token) and character counts kept as running
// sums instead of recounting both pieces at every split.
std::vector<tok::BpeMerge> merges_from_scores(const tok::Vocab& vocab, const std::vector<float>& scores,
                                              const std::vector<int32_t>& types) {
  struct Ranked {
    tok::BpeMerge merge;
    float score;
    uint32_t left_chars, right_chars;
  };
  // Characters as counted for the ordering: bytes that do not continue a sequence.
  auto chars = [](std::string_view s) {
    uint32_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  std::vector<Ranked> ranked;
  ranked.reserve(vocab.size() * 2);  // about two merges per token in the vocabularies seen
  for (size_t id = 0; id < vocab.size(); ++id) {
    if (types[id] != kTypeNormal && types[id] != kTypeUnused && types[id] != kTypeUserDefined) continue;
    const float score = types[id] == kTypeUserDefined ? 0.0f : scores[id];
    std::string_view text = vocab[id];
    const uint32_t total_chars = chars(text);
    uint32_t left_chars = 0;
    size_t pos = 0, counted = 0;
    tok::utf8_next(text, pos);
    while (pos < text.size()) {
      left_chars += chars(text.substr(counted, pos - counted));
      counted = pos;
      if (auto left = vocab.find(text.substr(0, pos))) {
        if (auto right = vocab.find(text.substr(pos))) {
          ranked.push_back({{*left, *right, static_cast<int32_t>(id)}, score, left_chars, total_chars - left_chars});
        }
      }
      tok::utf8_next(text, pos);
    }
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.left_chars != b.left_chars) return a.left_chars > b.left_chars;
    return a.right_chars > b.right_chars;
  });
  std::vector<tok::BpeMerge> merges;
  merges.reserve(ranked.size());
  for (const auto& r : ranked) merges.push_back(r.merge);
  return merges;
}

// llama.cpp stores SentencePiece user-defined tokens with " " for "\u2581".
std::string restore_sentencepiece_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == ' ') out += "\u2581";
    else out += c;
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& gguf) {
  const std::string model(gguf.get_string("tokenizer.ggml.model"));
  DI_CHECK(model == "gpt2" || model == "llama", "tokenizer: GGUF tokenizer model '{}' is not supported (gpt2, llama)", model);
  std::vector<std::string_view> tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  const size_t n = tokens.size();
  DI_CHECK(n > 0, "tokenizer: GGUF vocabulary is empty");
  std::vector<int32_t> types = optional_array<int32_t>(gguf, "tokenizer.ggml.token_type", &GgufFile::get_i32_array, n, 1);

  Parts parts;
  std::deque<std::string> restored;  // texts that tokens[] views instead of the file's
  for (size_t i = 0; i < n; ++i) {
    if (types[i] == kTypeControl || types[i] == kTypeUserDefined) {
      if (tokens[i].empty()) continue;
      // Restore the SentencePiece form of user-defined tokens so they match what the
      // normalizer produces, as in tokenizer.json.
      if (model == "llama" && types[i] == kTypeUserDefined)
        tokens[i] = restored.emplace_back(restore_sentencepiece_spaces(tokens[i]));
      tok::AddedToken t;
      t.id = static_cast<int32_t>(i);
      t.content = tokens[i];
      t.special = types[i] == kTypeControl;
      parts.added.push_back(std::move(t));
    }
  }
  parts.vocab = tok::Vocab(tokens);
  auto bos = optional_id(gguf, "tokenizer.ggml.bos_token_id", n);
  auto eos = optional_id(gguf, "tokenizer.ggml.eos_token_id", n);
  auto unk = optional_id(gguf, "tokenizer.ggml.unknown_token_id", n);

  bool add_bos_default = false;
  if (model == "gpt2") {
    auto merges = gguf.get_string_array("tokenizer.ggml.merges");
    parts.merges.reserve(merges.size());
    std::string joined;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      std::string_view m = merges[rank];
      size_t space = m.find(' ');
      DI_CHECK(space != std::string_view::npos, "tokenizer: GGUF merge {} is not 'a b'", rank);
      auto a = parts.vocab.find(m.substr(0, space));
      auto b = parts.vocab.find(m.substr(space + 1));
      joined.assign(m.substr(0, space));
      joined += m.substr(space + 1);
      auto c = parts.vocab.find(joined);
      DI_CHECK(a && b && c, "tokenizer: GGUF merge {} ('{}') uses tokens outside the vocabulary", rank, m);
      parts.merges.push_back({*a, *b, *c});
    }
    parts.pre_tokenizer = tok::make_pre_tokenizer(byte_level_pre_tokenizer(gguf.find_string("tokenizer.ggml.pre").value_or("default")));
    parts.decoder = tok::make_decoder(json{{"type", "ByteLevel"}});
  } else {
    std::vector<float> scores = optional_array<float>(gguf, "tokenizer.ggml.scores", &GgufFile::get_f32_array, n, 0.0f);
    parts.merges = merges_from_scores(parts.vocab, scores, types);
    parts.options.byte_fallback = true;
    parts.options.unk_id = unk;
    parts.options.fuse_unk = true;
    const bool space_prefix = gguf.find_bool("tokenizer.ggml.add_space_prefix").value_or(true);
    json normalizers = json::array();
    if (space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
    normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
    parts.normalizer = tok::make_normalizer({{"type", "Sequence"}, {"normalizers", normalizers}});
    json decoders = json::array({json{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                 json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}}});
    if (space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    parts.decoder = tok::make_decoder({{"type", "Sequence"}, {"decoders", decoders}});
    add_bos_default = true;
  }
  if (gguf.find_bool("tokenizer.ggml.add_bos_token").value_or(add_bos_default) && bos) parts.prefix.push_back(*bos);
  if (gguf.find_bool("tokenizer.ggml.add_eos_token").value_or(false) && eos) parts.suffix.push_back(*eos);

  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->assemble(std::move(parts));
  t->bos_id_ = bos;
  t->eos_id_ = eos;
  if (bos) t->bos_token_ = t->id_to_token_[*bos];
  if (eos) t->eos_token_ = t->id_to_token_[*eos];
  t->chat_template_ = std::string(gguf.find_string("tokenizer.chat_template").value_or(""));
  t->finish_special_ids();
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    auto id = optional_id(gguf, key, n);
    if (id && std::find(t->eos_ids_.begin(), t->eos_ids_.end(), *id) == t->eos_ids_.end()) t->eos_ids_.push_back(*id);
  }
  return t;
}

}  // namespace deepinfer
