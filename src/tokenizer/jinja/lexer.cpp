#include "tokenizer/jinja/lexer.h"

#include <cctype>

#include "core/error.h"
#include "tokenizer/jinja/text_util.h"

namespace deepinfer::jinja {

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Jinja normalises every newline sequence to "\n" and drops one trailing newline.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view src, const LexerOptions& options) : src_(src), opt_(options) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) lex_text_and_tag();
    tokens_.push_back({TokenKind::Eof, "", line_});
    return tokens_;
  }

 private:
  [[noreturn]] void error(const std::string& msg) const { fail("chat template: line {}: {}", line_, msg); }

  void advance(size_t n) {
    for (size_t i = 0; i < n && pos_ < src_.size(); ++i) {
      if (src_[pos_] == '\n') ++line_;
      ++pos_;
    }
  }

  void emit_text(std::string text, int line) {
    if (!text.empty()) tokens_.push_back({TokenKind::Text, std::move(text), line});
  }

  void lex_text_and_tag() {
    size_t start = pos_;
    int start_line = line_;
    size_t open = src_.find('{', pos_);
    while (open != std::string_view::npos && open + 1 < src_.size() && src_[open + 1] != '{' &&
           src_[open + 1] != '%' && src_[open + 1] != '#') {
      open = src_.find('{', open + 1);
    }
    if (open == std::string_view::npos || open + 1 >= src_.size()) {
      std::string text(src_.substr(start));
      apply_pending_strip(text);
      emit_text(std::move(text), start_line);
      advance(src_.size() - pos_);
      return;
    }
    char kind = src_[open + 1];
    char marker = open + 2 < src_.size() ? src_[open + 2] : '\0';
    std::string text(src_.substr(start, open - start));
    if (marker == '-') {
      while (!text.empty() && is_ws(text.back())) text.pop_back();
    } else if (marker != '+' && kind != '{' && opt_.lstrip_blocks) {
      size_t q = text.size();
      while (q > 0 && (text[q - 1] == ' ' || text[q - 1] == '\t')) --q;
      size_t abs = start + q;
      if (abs == 0 || src_[abs - 1] == '\n') text.resize(q);
    }
    apply_pending_strip(text);
    emit_text(std::move(text), start_line);
    advance(open - pos_);
    advance((marker == '-' || marker == '+') ? 3 : 2);
    if (kind == '#') {
      lex_comment();
    } else if (kind == '%' && is_raw_block()) {
      lex_raw();
    } else {
      lex_tag(kind == '{');
    }
  }

  void apply_pending_strip(std::string& text) {
    if (strip_next_ws_) {
      size_t i = 0;
      while (i < text.size() && is_ws(text[i])) ++i;
      text.erase(0, i);
    } else if (trim_next_newline_ && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    }
    strip_next_ws_ = false;
    trim_next_newline_ = false;
  }

  // Records what the closing marker of a tag asks of the following text.
  void close_tag(char marker, bool is_block) {
    strip_next_ws_ = marker == '-';
    trim_next_newline_ = marker != '-' && marker != '+' && is_block && opt_.trim_blocks;
  }

  void lex_comment() {
    size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) error("unterminated comment");
    char marker = end > pos_ ? src_[end - 1] : '\0';
    advance(end + 2 - pos_);
    close_tag(marker == '-' || marker == '+' ? marker : '\0', true);
  }

  bool is_raw_block() const {
    size_t p = pos_;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0 || src_.compare(p, 3, "+%}") == 0;
  }

  void lex_raw() {
    size_t close = src_.find("%}", pos_);
    char marker = src_[close - 1];
    advance(close + 2 - pos_);
    close_tag(marker == '-' || marker == '+' ? marker : '\0', true);
    // Find "{% endraw %}" (with optional markers).
    size_t search = pos_;
    while (true) {
      size_t open = src_.find("{%", search);
      if (open == std::string_view::npos) error("unterminated raw block");
      size_t p = open + 2;
      char open_marker = p < src_.size() ? src_[p] : '\0';
      if (open_marker == '-' || open_marker == '+') ++p;
      while (p < src_.size() && is_ws(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") == 0) {
        size_t q = p + 6;
        while (q < src_.size() && is_ws(src_[q])) ++q;
        char end_marker = '\0';
        if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_marker = src_[q++];
        if (src_.compare(q, 2, "%}") == 0) {
          std::string text(src_.substr(pos_, open - pos_));
          apply_pending_strip(text);
          if (open_marker == '-') {
            while (!text.empty() && is_ws(text.back())) text.pop_back();
          }
          emit_text(std::move(text), line_);
          advance(q + 2 - pos_);
          close_tag(end_marker, true);
          return;
        }
      }
      search = open + 2;
    }
  }

  void lex_tag(bool is_var) {
    int begin_line = line_;
    tokens_.push_back({is_var ? TokenKind::VarBegin : TokenKind::BlockBegin, "", begin_line});
    std::vector<char> brackets;
    const char close = is_var ? '}' : '%';
    while (true) {
      while (pos_ < src_.size() && is_ws(src_[pos_])) advance(1);
      if (pos_ >= src_.size()) error(is_var ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      char c = src_[pos_];
      if (brackets.empty()) {
        char marker = '\0';
        size_t p = pos_;
        if ((c == '-' || c == '+') && p + 1 < src_.size()) {
          marker = c;
          ++p;
        }
        if (p + 1 < src_.size() && src_[p] == close && src_[p + 1] == '}') {
          advance(p + 2 - pos_);
          tokens_.push_back({is_var ? TokenKind::VarEnd : TokenKind::BlockEnd, "", line_});
          close_tag(marker, !is_var);
          return;
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        tokens_.push_back({TokenKind::Name, std::string(src_.substr(pos_, e - pos_)), line_});
        advance(e - pos_);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        lex_operator(brackets);
      }
    }
  }

  void lex_number() {
    size_t e = pos_;
    bool is_float = false;
    auto digits = [&] {
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    };
    digits();
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t f = e + 1;
      if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
      if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
        is_float = true;
        e = f;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos_; i < e; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    tokens_.push_back({is_float ? TokenKind::Float : TokenKind::Int, text, line_});
    advance(e - pos_);
  }

  void lex_string(char quote) {
    int begin_line = line_;
    std::string value;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) error("unterminated string literal");
      char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        value.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) error("unterminated string literal");
      char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n': value.push_back('\n'); break;
        case 't': value.push_back('\t'); break;
        case 'r': value.push_back('\r'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'v': value.push_back('\v'); break;
        case 'a': value.push_back('\a'); break;
        case '0': value.push_back('\0'); break;
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p + n > src_.size()) error("truncated \\" + std::string(1, e) + " escape in string literal");
          char32_t cp = 0;
          for (size_t i = 0; i < n; ++i) {
            char h = src_[p + i];
            if (!std::isxdigit(static_cast<unsigned char>(h))) error("invalid \\" + std::string(1, e) + " escape in string literal");
            cp = cp * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10FFFF) error("escape out of Unicode range in string literal");
          utf8_append(value, cp);
          p += n;
          break;
        }
        default:
          value.push_back('\\');
          value.push_back(e);
      }
    }
    advance(p + 1 - pos_);
    tokens_.push_back({TokenKind::String, std::move(value), begin_line});
  }

  void lex_operator(std::vector<char>& brackets) {
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~",
                                       "<",  ">",  "=",  "(",  ")",  "[", "]", "{", "}", ",", ".", ":",
                                       "|",  ";"};
    for (const char* op : kOps) {
      std::string_view o(op);
      if (src_.compare(pos_, o.size(), o) != 0) continue;
      char c = o[0];
      if (o.size() == 1 && (c == '(' || c == '[' || c == '{')) {
        brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
        if (brackets.size() > 256) error("brackets nested too deeply");
      } else if (o.size() == 1 && (c == ')' || c == ']' || c == '}')) {
        if (brackets.empty() || brackets.back() != c) error(std::string("unexpected '") + c + "'");
        brackets.pop_back();
      }
      tokens_.push_back({TokenKind::Op, std::string(o), line_});
      advance(o.size());
      return;
    }
    error(std::string("unexpected character '") + src_[pos_] + "'");
  }

  std::string_view src_;
  LexerOptions opt_;
  size_t pos_ = 0;
  int line_ = 1;
  bool strip_next_ws_ = false;
  bool trim_next_newline_ = false;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  std::string normalized = normalize_newlines(source);
  return Lexer(normalized, options).run();
}

}  // namespace deepinfer::jinja
