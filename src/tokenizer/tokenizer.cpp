#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/error.h"
#include "core/file_io.h"
#include "core/json_parse.h"
#include "loader/gguf.h"
#include "tokenizer/json_util.h"
#include "tokenizer/text_growth.h"
#include "tokenizer/tokenizer_parts.h"
#include "tokenizer/utf8.h"

namespace deepinfer {

using json = nlohmann::json;

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::assemble(Parts&& parts) {
  normalizer_ = std::move(parts.normalizer);
  pre_tokenizer_ = std::move(parts.pre_tokenizer);
  decoder_ = std::move(parts.decoder);
  prefix_ids_ = std::move(parts.prefix);
  suffix_ids_ = std::move(parts.suffix);

  size_t size = parts.vocab.size();
  for (const auto& a : parts.added) {
    DI_CHECK(a.id >= 0, "tokenizer: added token '{}' has a negative id", a.content);
    size = std::max(size, static_cast<size_t>(a.id) + 1);
  }
  DI_CHECK(size <= parts.vocab.size() + parts.added.size() + 1024,
           "tokenizer: ids are far sparser than the vocabulary ({} ids for {} tokens)", size,
           parts.vocab.size() + parts.added.size());
  model_ = std::make_unique<tok::BpeModel>(std::move(parts.vocab), parts.merges, parts.options);
  const tok::Vocab& vocab = model_->vocab();
  id_to_token_.resize(size);
  for (size_t id = 0; id < vocab.size(); ++id) id_to_token_[id] = vocab[id];
  special_.assign(size, 0);
  added_.assign(size, 0);

  raw_matcher_ = std::make_unique<tok::AddedTokenMatcher>();
  normalized_matcher_ = std::make_unique<tok::AddedTokenMatcher>();
  for (const auto& a : parts.added) {
    special_[a.id] = a.special;
    added_[a.id] = 1;
    id_to_token_[a.id] = added_index_.insert_or_assign(a.content, a.id).first->first;
    // Special tokens are never normalized in tokenizers (normalized=false is forced for them
    // only by some front ends, so honour the flag as written).
    (a.normalized && normalizer_ ? normalized_matcher_ : raw_matcher_)->add(a);
  }
  if (pre_tokenizer_ && pre_tokenizer_->defer_byte_mapping()) model_->set_byte_level_input();
  for (int32_t id : prefix_ids_) DI_CHECK(id >= 0 && static_cast<size_t>(id) < size, "tokenizer: template id {} out of range", id);
  for (int32_t id : suffix_ids_) DI_CHECK(id >= 0 && static_cast<size_t>(id) < size, "tokenizer: template id {} out of range", id);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[id];
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = added_index_.find(std::string(token));
  if (it != added_index_.end()) return it->second;
  return model_->find(token);
}

std::string_view Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return {};
  return id_to_token_[id];
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || is_special(id)) return {};
  std::string bytes(id_to_token_[static_cast<size_t>(id)]);
  if (decoder_) decoder_->token_bytes(bytes);
  return bytes;
}

void Tokenizer::encode_plain(std::string_view text, bool at_text_start, std::vector<int32_t>& out) const {
  std::string normalized(text);
  if (normalizer_) normalizer_->normalize(normalized);
  tok::check_text_growth(text.size(), normalized.size(), "normalizer");
  std::vector<tok::Segment> segments;
  if (normalized_matcher_->empty()) {
    segments.push_back({normalized, -1});
  } else {
    normalized_matcher_->split(normalized, segments);
  }
  std::vector<std::string> pieces;
  for (size_t i = 0; i < segments.size(); ++i) {
    const auto& seg = segments[i];
    if (seg.token >= 0) {
      out.push_back(seg.token);
      continue;
    }
    pieces.assign(1, std::string(seg.text));
    if (pre_tokenizer_) {
      pre_tokenizer_->apply(pieces, at_text_start && i == 0);
      tok::check_text_growth(seg.text.size(), pieces, "pre-tokenizer");
    }
    for (const auto& p : pieces) model_->encode_word(p, out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::string sanitized;
  if (!tok::utf8_is_valid(text)) {
    sanitized = tok::utf8_sanitize(text);
    text = sanitized;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
  if (raw_matcher_->empty()) {
    encode_plain(text, true, ids);
  } else {
    std::vector<tok::Segment> segments;
    raw_matcher_->split(text, segments);
    for (const auto& seg : segments) {
      if (seg.token >= 0) {
        ids.push_back(seg.token);
      } else {
        encode_plain(seg.text, seg.text.data() == text.data(), ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) continue;
    if (skip_special_tokens && special_[id]) continue;
    if (id_to_token_[id].empty()) continue;
    tokens.emplace_back(id_to_token_[id]);
  }
  std::string text;
  if (decoder_) {
    decoder_->decode_chain(tokens);
    for (const auto& t : tokens) text += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) text += ' ';
      text += tokens[i];
    }
  }
  return text;
}

namespace {

// A token given in tokenizer_config.json as a string or as {"content": ...}.
std::string config_token(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return {};
}

// tokenizer.json of the largest vocabularies is ~35 MB; a parsed document
// takes several times its text, so the text is bounded.
constexpr uint64_t kMaxTokenizerFileBytes = 256ull << 20;

std::string read_file(const std::filesystem::path& path) {
  try {
    return read_regular_file(path.string(), kMaxTokenizerFileBytes);
  } catch (const Error& e) {
    fail("tokenizer: {}", e.what());
  }
}

bool has_gguf_magic(const std::string& path) {
  const int fd = open_regular_file(path);
  char magic[4] = {};
  const ssize_t n = ::read(fd, magic, sizeof magic);
  ::close(fd);
  return n == 4 && std::string_view(magic, 4) == "GGUF";
}

}  // namespace

void Tokenizer::apply_config(const json& config) {
  if (!config.is_object()) return;
  if (auto t = config_token(config, "bos_token"); !t.empty()) {
    bos_token_ = t;
    bos_id_ = token_to_id(t);
  }
  if (auto t = config_token(config, "eos_token"); !t.empty()) {
    eos_token_ = t;
    eos_id_ = token_to_id(t);
  }
  if (auto it = config.find("chat_template"); it != config.end()) {
    if (it->is_string()) {
      chat_template_ = it->get<std::string>();
    } else if (it->is_array()) {
      // Named templates: use "default".
      for (const auto& entry : *it) {
        if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
            entry["template"].is_string())
          chat_template_ = entry["template"].get<std::string>();
      }
    }
  }
  // transformers' Llama/Gemma tokenizer classes rebuild the post-processor from
  // add_bos_token / add_eos_token; other classes ignore these keys.
  const std::string cls = config.value("tokenizer_class", "");
  const bool rebuilds = cls.rfind("LlamaTokenizer", 0) == 0 || cls.rfind("GemmaTokenizer", 0) == 0 ||
                        cls.rfind("CodeLlamaTokenizer", 0) == 0;
  if (rebuilds) {
    auto flag = [&](const char* key, bool def) {
      auto it = config.find(key);
      return it != config.end() && it->is_boolean() ? it->get<bool>() : def;
    };
    prefix_ids_.clear();
    suffix_ids_.clear();
    if (flag("add_bos_token", true) && bos_id_) prefix_ids_.push_back(*bos_id_);
    if (flag("add_eos_token", false) && eos_id_) suffix_ids_.push_back(*eos_id_);
  }
}

void Tokenizer::finish_special_ids() {
  if (!bos_id_ && !prefix_ids_.empty() && is_special(prefix_ids_.front())) bos_id_ = prefix_ids_.front();
  if (bos_id_ && bos_token_.empty()) bos_token_ = id_to_token_[*bos_id_];
  // End-of-generation tokens used by the supported families' chat formats.
  static const char* const kStopTokens[] = {"<|eot_id|>",  "<|eom_id|>",  "<|end_of_text|>", "<|im_end|>",
                                            "<|endoftext|>", "<end_of_turn>", "<eos>",          "</s>",
                                            "<|return|>",  "<|call|>",    "<｜end▁of▁sentence｜>"};
  if (!eos_id_) {
    for (const char* name : kStopTokens) {
      if (auto id = token_to_id(name); id && is_special(*id)) {
        eos_id_ = id;
        break;
      }
    }
  }
  if (eos_id_ && eos_token_.empty()) eos_token_ = id_to_token_[*eos_id_];
  eos_ids_.clear();
  if (eos_id_) eos_ids_.push_back(*eos_id_);
  for (const char* name : kStopTokens) {
    auto id = token_to_id(name);
    if (id && is_special(*id) && std::find(eos_ids_.begin(), eos_ids_.end(), *id) == eos_ids_.end())
      eos_ids_.push_back(*id);
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  DI_CHECK(fs::exists(p), "tokenizer: '{}' does not exist", path);
  if (fs::is_directory(p)) {
    if (fs::exists(p / "tokenizer.json")) return from_file((p / "tokenizer.json").string());
    for (const auto& entry : fs::directory_iterator(p)) {
      if (entry.path().extension() == ".gguf") return from_file(entry.path().string());
    }
    fail("tokenizer: folder '{}' holds neither tokenizer.json nor a .gguf file", path);
  }
  if (has_gguf_magic(path)) {
    GgufFile gguf = GgufFile::open(path);
    return from_gguf(gguf);
  }
  std::string text = read_file(p);
  fs::path config_path = p.parent_path() / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    json config = parse_json(read_file(config_path), "tokenizer: " + config_path.string(), tok::tokenizer_json_limits());
    return from_json(text, &config);
  }
  return from_json(text, nullptr);
}

}  // namespace deepinfer
