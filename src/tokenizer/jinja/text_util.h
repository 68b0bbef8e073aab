// UTF-8 and Python-compatible text helpers shared by the Jinja value model,
// filters and string methods (templates expect Python's str semantics).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/utf8.h"

namespace deepinfer::jinja {

// Decodes UTF-8 leniently: an invalid byte becomes a lone surrogate U+DC80..U+DCFF
// that utf8_encode turns back into that byte, so any byte string round-trips.
std::vector<char32_t> utf8_decode(std::string_view s);
using tok::utf8_append;  // shared with the tokenizer
std::string utf8_encode(const std::vector<char32_t>& cps, size_t begin, size_t end);
// Number of code points (Python len()).
size_t utf8_length(std::string_view s);
bool is_ascii(std::string_view s);

// Python regex \w for one code point: letters, numbers and '_'.
bool is_word_char(char32_t cp);
// Python str.isspace() for one code point.
bool is_py_space(char32_t cp);
// Python str.strip/lstrip/rstrip; chars == nullptr means whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
// Python str.title(): a letter after a non-letter is upper-cased, others lower-cased.
std::string py_title(std::string_view s);
// Python str.capitalize(): first character upper-cased, the rest lower-cased.
std::string py_capitalize(std::string_view s);

// Python repr(float): shortest round-trip digits, exponent form outside [1e-4, 1e16).
std::string py_float_repr(double v);
// Python repr(str): single quotes unless the text holds ' and no ".
std::string py_str_repr(std::string_view s);
// json.dumps(str, ensure_ascii=False).
void json_quote(std::string& out, std::string_view s);

}  // namespace deepinfer::jinja
