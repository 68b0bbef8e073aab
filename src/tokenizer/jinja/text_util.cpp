#include "tokenizer/jinja/text_util.h"

#include <utf8proc.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace deepinfer::jinja {

std::vector<char32_t> utf8_decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp = 0;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                              static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {
      // Surrogate-escape the stray byte (as Python's errors="surrogateescape").
      out.push_back(0xDC00 + static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      out.push_back(static_cast<char32_t>(cp));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

std::string utf8_encode(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end && i < cps.size(); ++i) {
    if (cps[i] >= 0xDC80 && cps[i] < 0xDD00) {
      out.push_back(static_cast<char>(cps[i] - 0xDC00));
    } else {
      utf8_append(out, cps[i]);
    }
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return std::isalnum(static_cast<int>(c)) || c == '_';
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO: return true;
    default: return false;
  }
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  auto cps = utf8_decode(s);
  std::vector<char32_t> set;
  if (chars) set = utf8_decode(*chars);
  auto strip_it = [&](char32_t c) {
    if (!chars) return is_py_space(c);
    for (char32_t x : set) {
      if (x == c) return true;
    }
    return false;
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  return utf8_encode(cps, b, e);
}

namespace {

template <typename F>
std::string map_codepoints(std::string_view s, F f) {
  if (is_ascii(s)) {
    std::string out(s);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(f(static_cast<char32_t>(out[i]), i));
    return out;
  }
  auto cps = utf8_decode(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < cps.size(); ++i) utf8_append(out, f(cps[i], i));
  return out;
}

char32_t upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
bool is_cased_letter(char32_t c) { return upper(c) != c || lower(c) != c; }

}  // namespace

std::string py_upper(std::string_view s) {
  return map_codepoints(s, [](char32_t c, size_t) { return upper(c); });
}

std::string py_lower(std::string_view s) {
  return map_codepoints(s, [](char32_t c, size_t) { return lower(c); });
}

std::string py_title(std::string_view s) {
  bool prev_cased = false;
  return map_codepoints(s, [&](char32_t c, size_t) {
    char32_t r = prev_cased ? lower(c) : upper(c);
    prev_cased = is_cased_letter(c);
    return r;
  });
}

std::string py_capitalize(std::string_view s) {
  return map_codepoints(s, [](char32_t c, size_t i) { return i == 0 ? upper(c) : lower(c); });
}

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci looks like "-d.ddde+XX"; split into sign, digits and decimal exponent.
  bool neg = sci[0] == '-';
  std::string body = neg ? sci.substr(1) : sci;
  size_t epos = body.find('e');
  int exp = std::atoi(body.c_str() + epos + 1);
  std::string digits;
  for (size_t i = 0; i < epos; ++i) {
    if (body[i] != '.') digits.push_back(body[i]);
  }
  std::string out = neg ? "-" : "";
  int n = static_cast<int>(digits.size());
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (exp + 1 >= n) {
      out += digits + std::string(static_cast<size_t>(exp + 1 - n), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return out;
}

std::string py_str_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7F && c < 0xA0)) {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out.push_back(q);
  return out;
}

void json_quote(std::string& out, std::string_view s) {
  out.push_back('"');
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[16];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

}  // namespace deepinfer::jinja
