#include "tokenizer/pre_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/text_growth.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tok {

using json = nlohmann::json;

namespace {

// GPT-2's split regex, used by ByteLevel(use_regex = true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& name) {
  if (name == "Removed") return Behavior::Removed;
  if (name == "Isolated") return Behavior::Isolated;
  if (name == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::MergedWithNext;
  if (name == "Contiguous") return Behavior::Contiguous;
  fail("tokenizer: unknown split behavior '{}'", name);
}

using Ranges = std::vector<std::pair<size_t, size_t>>;
struct Span {
  size_t begin, end;
  bool is_match;
};

// Applies a split behaviour to the matches of one piece (the semantics of
// tokenizers' NormalizedString::split) and appends the resulting pieces.
void split_by_matches(const std::string& piece, const Ranges& matches, Behavior behavior, bool invert,
                      std::vector<std::string>& out) {
  std::vector<Span> spans;
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < piece.size()) spans.push_back({prev, piece.size(), invert});

  std::vector<Span> merged;
  switch (behavior) {
    case Behavior::Isolated:
      merged = std::move(spans);
      break;
    case Behavior::Removed:
      for (const auto& s : spans)
        if (!s.is_match) merged.push_back(s);
      break;
    case Behavior::MergedWithPrevious: {
      bool previous_match = false;
      for (const auto& s : spans) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case Behavior::Contiguous: {
      bool previous_match = false;
      for (const auto& s : spans) {
        if (s.is_match == previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
  for (const auto& s : merged)
    if (s.end > s.begin) out.emplace_back(piece, s.begin, s.end - s.begin);
}

// Each character satisfying pred is one match.
void char_matches(const std::string& piece, const std::function<bool(char32_t)>& pred, Ranges& out) {
  out.clear();
  size_t pos = 0;
  while (pos < piece.size()) {
    size_t at = pos;
    char32_t cp = utf8_next(piece, pos);
    if (pred(cp)) out.emplace_back(at, pos);
  }
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::string_view pattern, bool literal, Behavior behavior, bool invert)
      : regex_(pattern, literal), behavior_(behavior), invert_(invert) {}
  void apply(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 2);
    Ranges matches;
    for (const auto& p : pieces) {
      regex_.find_all(p, matches);
      split_by_matches(p, matches, behavior_, invert_, out);
    }
    pieces = std::move(out);
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

class CharSplitPreTokenizer final : public PreTokenizer {
 public:
  CharSplitPreTokenizer(std::function<bool(char32_t)> pred, Behavior behavior)
      : pred_(std::move(pred)), behavior_(behavior) {}
  void apply(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    Ranges matches;
    for (const auto& p : pieces) {
      char_matches(p, pred_, matches);
      split_by_matches(p, matches, behavior_, false, out);
    }
    pieces = std::move(out);
  }

 private:
  std::function<bool(char32_t)> pred_;
  Behavior behavior_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern, false);
  }
  void apply(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    Ranges matches;
    for (auto& p : pieces) {
      if (add_prefix_space_ && (p.empty() || p[0] != ' ')) p.insert(0, 1, ' ');
      if (regex_) {
        regex_->find_all(p, matches);
        split_by_matches(p, matches, Behavior::Isolated, false, out);
      } else {
        out.push_back(std::move(p));
      }
    }
    if (map_bytes_)
      for (auto& p : out) p = byte_level_encode(p);
    pieces = std::move(out);
  }
  bool defer_byte_mapping() override {
    map_bytes_ = false;
    return true;
  }

 private:
  bool add_prefix_space_;
  bool map_bytes_ = true;
  std::unique_ptr<Regex> regex_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split), regex_(replacement_, true),
        space_(" ", true) {}
  void apply(std::vector<std::string>& pieces, bool at_text_start) const override {
    std::vector<std::string> out;
    Ranges matches;
    for (size_t i = 0; i < pieces.size(); ++i) {
      std::string p = space_.replace_all(pieces[i], replacement_);
      bool starts = p.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_ == Prepend::Always || (prepend_ == Prepend::First && i == 0 && at_text_start)))
        p.insert(0, replacement_);
      if (split_) {
        regex_.find_all(p, matches);
        split_by_matches(p, matches, Behavior::MergedWithNext, false, out);
      } else {
        out.push_back(std::move(p));
      }
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
  Regex regex_;
  Regex space_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<std::string>& pieces, bool at_text_start) const override {
    size_t original = 0;
    for (const auto& piece : pieces) original += piece.size();
    for (const auto& p : parts_) {
      p->apply(pieces, at_text_start);
      check_text_growth(original, pieces, "pre-tokenizer sequence");
    }
  }
  bool defer_byte_mapping() override { return !parts_.empty() && parts_.back()->defer_byte_mapping(); }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

bool is_numeric(char32_t cp) {
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool is_punctuation(char32_t cp) {
  if (cp < 0x80) return (cp >= '!' && cp <= '/') || (cp >= ':' && cp <= '@') || (cp >= '[' && cp <= '`') ||
                        (cp >= '{' && cp <= '~');
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& config) {
  if (config.is_null()) return nullptr;
  const std::string type = json_string(config, "type", "pre_tokenizer");
  if (type == "Split") {
    auto [pattern, literal] = json_pattern(config, "Split pre-tokenizer");
    return std::make_unique<SplitPreTokenizer>(pattern, literal,
                                               parse_behavior(json_string(config, "behavior", "Split pre-tokenizer")),
                                               json_bool(config, "invert", false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(json_bool(config, "add_prefix_space", true),
                                                   json_bool(config, "use_regex", true));
  }
  if (type == "Metaspace") {
    std::string replacement = json_opt_string(config, "replacement", "\xE2\x96\x81");
    DI_CHECK(!replacement.empty(), "tokenizer: Metaspace replacement is empty");
    auto scheme = MetaspacePreTokenizer::Prepend::Always;
    if (config.contains("prepend_scheme")) {
      std::string s = json_string(config, "prepend_scheme", "Metaspace");
      if (s == "first") scheme = MetaspacePreTokenizer::Prepend::First;
      else if (s == "never") scheme = MetaspacePreTokenizer::Prepend::Never;
      else DI_CHECK(s == "always", "tokenizer: unknown Metaspace prepend_scheme '{}'", s);
    } else if (!json_bool(config, "add_prefix_space", true)) {
      scheme = MetaspacePreTokenizer::Prepend::Never;
    }
    return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, json_bool(config, "split", true));
  }
  if (type == "Digits") {
    bool individual = json_bool(config, "individual_digits", false);
    return std::make_unique<CharSplitPreTokenizer>(is_numeric,
                                                   individual ? Behavior::Isolated : Behavior::Contiguous);
  }
  if (type == "Punctuation") {
    std::string behavior = json_opt_string(config, "behavior", "Isolated");
    return std::make_unique<CharSplitPreTokenizer>(is_punctuation, parse_behavior(behavior));
  }
  if (type == "Whitespace") {
    return std::make_unique<SplitPreTokenizer>(R"(\w+|[^\w\s]+)", false, Behavior::Removed, true);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<CharSplitPreTokenizer>(is_unicode_whitespace, Behavior::Removed);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& child : json_array(config, "pretokenizers", "Sequence pre-tokenizer")) {
      if (auto p = make_pre_tokenizer(child)) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  fail("tokenizer: unsupported pre-tokenizer type '{}'", type);
}

}  // namespace deepinfer::tok
