#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/text_growth.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tok {

using json = nlohmann::json;

bool is_unicode_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

namespace {

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  void normalize(std::string& text) const override {
    if (text.empty()) return;
    bool ascii = true;
    for (unsigned char c : text) ascii &= c < 0x80;
    if (ascii) return;  // every form leaves ASCII unchanged
    utf8proc_uint8_t* out = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                      static_cast<utf8proc_ssize_t>(text.size()), &out,
                                      static_cast<utf8proc_option_t>(options_));
    DI_CHECK(n >= 0, "tokenizer: Unicode normalization failed: {}", utf8proc_errmsg(n));
    text.assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
  }

 private:
  int options_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) utf8_append(out, static_cast<char32_t>(utf8proc_tolower(utf8_next(text, pos))));
    text = std::move(out);
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      size_t pos = 0;
      while (pos < text.size()) {
        size_t at = pos;
        if (!is_unicode_whitespace(utf8_next(text, pos))) {
          begin = at;
          break;
        }
        begin = pos;
      }
    }
    if (right_) {
      // Walk forward and remember where the trailing whitespace run starts.
      size_t pos = begin, run = end;
      bool in_run = false;
      while (pos < end) {
        size_t at = pos;
        bool ws = is_unicode_whitespace(utf8_next(text, pos));
        if (ws && !in_run) run = at;
        in_run = ws;
      }
      if (in_run) end = run;
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
      char32_t cp = utf8_next(text, pos);
      if (utf8proc_category(static_cast<utf8proc_int32_t>(cp)) != UTF8PROC_CATEGORY_MN) utf8_append(out, cp);
    }
    text = std::move(out);
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string_view pattern, bool literal, std::string content)
      : regex_(pattern, literal), content_(std::move(content)) {}
  void normalize(std::string& text) const override { text = regex_.replace_all(text, content_); }

 private:
  Regex regex_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    const size_t original = text.size();
    for (const auto& p : parts_) {
      p->normalize(text);
      check_text_growth(original, text.size(), "normalizer sequence");
    }
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& config) {
  if (config.is_null()) return nullptr;
  const std::string type = json_string(config, "type", "normalizer");
  constexpr int kStable = UTF8PROC_STABLE;
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(kStable | UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(kStable | UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(kStable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(kStable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(json_bool(config, "strip_left", true),
                                             json_bool(config, "strip_right", true));
  }
  if (type == "Replace") {
    auto [pattern, literal] = json_pattern(config, "Replace normalizer");
    return std::make_unique<ReplaceNormalizer>(pattern, literal, json_string(config, "content", "Replace normalizer"));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(json_string(config, "prepend", "Prepend normalizer"));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& child : json_array(config, "normalizers", "Sequence normalizer")) {
      if (auto n = make_normalizer(child)) parts.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  fail("tokenizer: unsupported normalizer type '{}'", type);
}

}  // namespace deepinfer::tok
