// UTF-8 helpers shared by the tokenizer: decoding with replacement of invalid
// sequences, encoding, and the GPT-2 byte <-> printable-character table.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length of the longest valid UTF-8 sequence at text[pos] (1-4), or 0 when the
// bytes there do not start a valid, complete sequence.
size_t utf8_valid_len(std::string_view text, size_t pos);

// Decodes the code point at text[pos] and advances pos. Invalid bytes decode to
// U+FFFD and advance by the "maximal subpart" rule (as Rust's from_utf8_lossy and
// Python's decode(errors="replace") do).
char32_t utf8_next(std::string_view text, size_t& pos);

void utf8_append(std::string& out, char32_t cp);

bool utf8_is_valid(std::string_view text);

// The text with every invalid sequence replaced by U+FFFD; returns text unchanged
// (no copy made by callers that check utf8_is_valid first) when it is valid.
std::string utf8_sanitize(std::string_view text);

// Number of bytes at the end of text that form an incomplete (but so far valid)
// UTF-8 sequence, 0 if the text ends on a character boundary.
size_t utf8_incomplete_tail(std::string_view text);

// GPT-2's byte-level alphabet: every byte maps to one printable code point.
struct ByteLevelTable {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8;
  // Inverse: code point -> byte, -1 for code points outside the alphabet (all < 324).
  std::array<int16_t, 324> cp_to_byte{};
};
const ByteLevelTable& byte_level_table();

// Maps every byte of text to its byte-level character.
std::string byte_level_encode(std::string_view bytes);
// Inverse of byte_level_encode; returns false (and leaves out unspecified) when a
// character is outside the byte-level alphabet.
bool byte_level_decode(std::string_view text, std::string& out);

}  // namespace deepinfer::tok
