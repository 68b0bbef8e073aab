// Splits a template into text and tag tokens, applying Jinja's whitespace rules
// (`-`/`+` markers, trim_blocks, lstrip_blocks, dropping one trailing newline).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::jinja {

enum class TokenKind : uint8_t {
  Text,
  VarBegin,
  VarEnd,
  BlockBegin,
  BlockEnd,
  Name,
  String,
  Int,
  Float,
  Op,
  Eof,
};

struct Token {
  TokenKind kind;
  std::string text;  // Text: the literal; Name/Op: spelling; String: unescaped value; numbers: digits
  int line;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws deepinfer::Error with the line number on malformed input.
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options);

}  // namespace deepinfer::jinja
