#include "tokenizer/added_tokens.h"

#include <utf8proc.h>

#include <algorithm>

#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tok {

namespace {

bool is_word_char(char32_t cp) {
  if (cp == '_') return true;
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
         (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

// Code point ending at byte offset end (text is valid UTF-8).
char32_t char_before(std::string_view text, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  return utf8_next(text, begin);
}

}  // namespace

int32_t AddedTokenMatcher::child(int32_t node, unsigned char c) const {
  const auto& ch = nodes_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), c, [](const auto& p, unsigned char v) { return p.first < v; });
  return it != ch.end() && it->first == c ? it->second : -1;
}

void AddedTokenMatcher::add(const AddedToken& token) {
  if (token.content.empty()) return;
  int32_t node = 0;
  for (unsigned char c : token.content) {
    int32_t next = child(node, c);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{});
      auto& ch = nodes_[node].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), c, [](const auto& p, unsigned char v) { return p.first < v; });
      ch.insert(it, {c, next});
    }
    node = next;
  }
  if (nodes_[node].token >= 0) {
    tokens_[nodes_[node].token] = token;  // the later definition of the same text wins
  } else {
    nodes_[node].token = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(token);
  }
  first_byte_[static_cast<unsigned char>(token.content[0])] = true;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t plain_begin = 0;  // start of the pending plain segment
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t node = 0, found = -1;
    size_t found_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        found = nodes_[node].token;
        found_end = i + 1;
      }
    }
    // Matches must start and end on character boundaries of the text.
    bool boundary = found >= 0 && (static_cast<unsigned char>(text[pos]) & 0xC0) != 0x80 &&
                    (found_end == text.size() || (static_cast<unsigned char>(text[found_end]) & 0xC0) != 0x80);
    if (!boundary) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[found];
    if (tok.single_word) {
      bool left_ok = pos == 0 || !is_word_char(char_before(text, pos));
      size_t p = found_end;
      bool right_ok = found_end == text.size() || !is_word_char(utf8_next(text, p));
      if (!left_ok || !right_ok) {
        ++pos;
        continue;
      }
    }
    size_t begin = pos, end = found_end;
    if (tok.lstrip) {
      while (begin > plain_begin) {
        size_t prev = begin - 1;
        while (prev > plain_begin && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
        size_t p = prev;
        if (!is_unicode_whitespace(utf8_next(text, p))) break;
        begin = prev;
      }
    }
    if (tok.rstrip) {
      while (end < text.size()) {
        size_t p = end;
        if (!is_unicode_whitespace(utf8_next(text, p))) break;
        end = p;
      }
    }
    if (begin > plain_begin) out.push_back({text.substr(plain_begin, begin - plain_begin), -1});
    out.push_back({text.substr(begin, end - begin), tok.id});
    plain_begin = pos = end;
  }
  if (plain_begin < text.size()) out.push_back({text.substr(plain_begin), -1});
}

}  // namespace deepinfer::tok
