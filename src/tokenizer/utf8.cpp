#include "tokenizer/utf8.h"

namespace deepinfer::tok {

size_t utf8_valid_len(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  unsigned char c = s[pos];
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (pos + 1 >= n || s[pos + 1] < lo || s[pos + 1] > hi) return 0;
  for (size_t i = 2; i < len; ++i) {
    if (pos + i >= n || (s[pos + i] & 0xC0) != 0x80) return 0;
  }
  return len;
}

// Bytes that an invalid sequence at pos spans: the lead byte plus the continuation
// bytes that were still acceptable ("maximal subpart"), at least 1.
static size_t invalid_span(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  unsigned char c = s[pos];
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t i = 1;
  if (pos + 1 < n && s[pos + 1] >= lo && s[pos + 1] <= hi) {
    i = 2;
    while (i < len && pos + i < n && (s[pos + i] & 0xC0) == 0x80) ++i;
  }
  return i;
}

char32_t utf8_next(std::string_view text, size_t& pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t len = utf8_valid_len(text, pos);
  if (len == 0) {
    pos += invalid_span(text, pos);
    return kReplacementChar;
  }
  char32_t cp;
  switch (len) {
    case 1: cp = s[pos]; break;
    case 2: cp = ((s[pos] & 0x1F) << 6) | (s[pos + 1] & 0x3F); break;
    case 3: cp = ((s[pos] & 0x0F) << 12) | ((s[pos + 1] & 0x3F) << 6) | (s[pos + 2] & 0x3F); break;
    default:
      cp = ((s[pos] & 0x07) << 18) | ((s[pos + 1] & 0x3F) << 12) | ((s[pos + 2] & 0x3F) << 6) |
           (s[pos + 3] & 0x3F);
  }
  pos += len;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool utf8_is_valid(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t len = utf8_valid_len(text, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

std::string utf8_sanitize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = utf8_valid_len(text, pos);
    if (len == 0) {
      utf8_append(out, kReplacementChar);
      pos += invalid_span(text, pos);
    } else {
      out.append(text.substr(pos, len));
      pos += len;
    }
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need <= back) return 0;
    // A truncated sequence counts only if what is there is a valid prefix.
    if (invalid_span(text, n - back) == back) return back;
    return 0;
  }
  return 0;
}

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table = [] {
    ByteLevelTable t;
    t.cp_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      t.byte_to_cp[b] = cp;
      utf8_append(t.byte_to_utf8[b], cp);
      t.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

std::string byte_level_encode(std::string_view bytes) {
  const auto& t = byte_level_table();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += t.byte_to_utf8[c];
  return out;
}

bool byte_level_decode(std::string_view text, std::string& out) {
  const auto& t = byte_level_table();
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp = utf8_next(text, pos);
    if (cp >= t.cp_to_byte.size() || t.cp_to_byte[cp] < 0) return false;
    out.push_back(static_cast<char>(t.cp_to_byte[cp]));
  }
  return true;
}

}  // namespace deepinfer::tok
