// Prompt lookup (n-gram) drafting for one sequence: the draft is what followed
// the most recent earlier occurrence of the sequence's last n tokens, for the
// longest n in [min_n, max_n] that occurred before. Input-grounded work
// (editing code, quoting a document) repeats long spans of the prompt, which
// this finds without a draft model.
//
// The index is incremental: appending a token updates one hash table per n,
// and a proposal is a lookup per n, so the cost does not grow with the
// sequence (a scan of a 100k-token context per step would).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "spec/draft.h"

namespace deepinfer::spec {

struct NgramConfig {
  int32_t min_n = 2;  // shortest suffix that may match
  int32_t max_n = 4;  // longest suffix tried (first)
};

class NgramIndex {
 public:
  explicit NgramIndex(NgramConfig config);
  // Throws deepinfer::Error unless 1 <= min_n <= max_n <= 64.
  static void check_config(const NgramConfig& config);

  // Extends the sequence (prompt first, then each accepted output token).
  void append(std::span<const int32_t> tokens);
  void append(int32_t token) { append(std::span<const int32_t>(&token, 1)); }
  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }

  // Up to max_tokens draft tokens (none when no suffix of length >= min_n
  // occurred before). Confidence is a prior by match length and draft
  // position, before any calibration against observed acceptance.
  void propose(int32_t max_tokens, Draft& out) const;
  // The longest n in [min_n, max_n] whose suffix occurred before (0: none):
  // the match a proposal continues.
  int32_t matched_length() const;

 private:
  // End position of the most recent earlier occurrence of the last n tokens, or -1.
  int32_t previous_end(int32_t n) const;
  uint64_t hash_ending_at(int32_t end, int32_t n) const;
  bool same_ngram(int32_t end_a, int32_t end_b, int32_t n) const;

  NgramConfig config_;
  std::vector<int32_t> tokens_;
  // Per n (index n - min_n): hash of the n tokens ending at p -> the latest
  // such p that has a following token. The sequence's own last n-gram is
  // entered only when the next token arrives, so a lookup never finds itself.
  std::vector<std::unordered_map<uint64_t, int32_t>> latest_end_;
};

}  // namespace deepinfer::spec
