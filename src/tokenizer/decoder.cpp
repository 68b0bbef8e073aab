#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tok {

using json = nlohmann::json;

namespace {

// Byte-level tokens back to bytes; a token with a character outside the
// alphabet contributes its own UTF-8 bytes. The joined bytes are decoded lossily.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      size_t mark = bytes.size();
      if (!byte_level_decode(t, bytes)) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, utf8_sanitize(bytes));
  }
  void token_bytes(std::string& token) const override {
    std::string bytes;
    if (byte_level_decode(token, bytes)) token = std::move(bytes);
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first) : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      size_t pos = 0;
      while (pos < t.size()) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      if (i == 0 && strip_first_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      tokens[i] = std::move(out);
    }
  }
  void token_bytes(std::string& token) const override {
    std::string out;
    for (size_t pos = 0; pos < token.size();) {
      if (token.compare(pos, replacement_.size(), replacement_) == 0) {
        out.push_back(' ');
        pos += replacement_.size();
      } else {
        out.push_back(token[pos++]);
      }
    }
    token = std::move(out);
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

// Runs of <0xXX> tokens become their bytes when those form valid UTF-8, otherwise
// one U+FFFD per byte.
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      if (utf8_is_valid(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending_count; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (auto& t : tokens) {
      int byte = parse_byte_token(t);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
  void token_bytes(std::string& token) const override {
    if (int byte = parse_byte_token(token); byte >= 0) token.assign(1, static_cast<char>(byte));
  }

  static int parse_byte_token(const std::string& t) {
    if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      size_t begin = 0, end = t.size();
      for (size_t i = 0; i < start_ && t.compare(begin, content_.size(), content_) == 0 && begin < end; ++i)
        begin += content_.size();
      for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                         t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i)
        end -= content_.size();
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string_view pattern, bool literal, std::string content)
      : regex_(pattern, literal), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = regex_.replace_all(t, content_);
  }
  void token_bytes(std::string& token) const override { token = regex_.replace_all(token, content_); }

 private:
  Regex regex_;
  std::string content_;
};

// Classic BPE end-of-word suffix: the suffix becomes a space except on the last token.
class BpeSuffixDecoder final : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string replacement = i + 1 == tokens.size() ? "" : " ";
      if (!suffix_.empty()) tokens[i] = Regex(suffix_, true).replace_all(tokens[i], replacement);
    }
  }
  void token_bytes(std::string& token) const override {
    if (!suffix_.empty()) token = Regex(suffix_, true).replace_all(token, " ");
  }

 private:
  std::string suffix_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }
  void token_bytes(std::string& token) const override {
    for (const auto& p : parts_) p->token_bytes(token);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& config) {
  if (config.is_null()) return nullptr;
  const std::string type = json_string(config, "type", "decoder");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    std::string replacement = json_opt_string(config, "replacement", "\xE2\x96\x81");
    DI_CHECK(!replacement.empty(), "tokenizer: Metaspace decoder replacement is empty");
    bool strip = true;
    if (config.contains("prepend_scheme")) {
      strip = json_string(config, "prepend_scheme", "Metaspace decoder") != "never";
    } else {
      strip = json_bool(config, "add_prefix_space", true);
    }
    return std::make_unique<MetaspaceDecoder>(replacement, strip);
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const auto& start = json_field(config, "start", "Strip decoder");
    const auto& stop = json_field(config, "stop", "Strip decoder");
    DI_CHECK(start.is_number_unsigned() && stop.is_number_unsigned(), "tokenizer: Strip decoder start/stop must be unsigned");
    std::string content = json_string(config, "content", "Strip decoder");
    DI_CHECK(!content.empty(), "tokenizer: Strip decoder content is empty");
    return std::make_unique<StripDecoder>(content, start.get<size_t>(), stop.get<size_t>());
  }
  if (type == "Replace") {
    auto [pattern, literal] = json_pattern(config, "Replace decoder");
    return std::make_unique<ReplaceDecoder>(pattern, literal, json_string(config, "content", "Replace decoder"));
  }
  if (type == "BPEDecoder") return std::make_unique<BpeSuffixDecoder>(json_opt_string(config, "suffix", "</w>"));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& child : json_array(config, "decoders", "Sequence decoder")) {
      if (auto d = make_decoder(child)) parts.push_back(std::move(d));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  fail("tokenizer: unsupported decoder type '{}'", type);
}

}  // namespace deepinfer::tok
