// tokenizer.json normalizers: rewrite the text before pre-tokenization.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace deepinfer::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // text is valid UTF-8 and stays so.
  virtual void normalize(std::string& text) const = 0;
};

// Builds the normalizer described by a tokenizer.json "normalizer" object; null
// for JSON null. Throws deepinfer::Error for unknown or malformed entries.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config);

// Unicode White_Space, as Rust's char::is_whitespace (used by several components).
bool is_unicode_whitespace(char32_t cp);

}  // namespace deepinfer::tok
