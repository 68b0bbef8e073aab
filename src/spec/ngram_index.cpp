#include "spec/ngram_index.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer::spec {

namespace {

uint64_t mix(uint64_t h, int32_t token) {
  // splitmix64-style step: cheap, and collisions are verified against the tokens anyway.
  h ^= static_cast<uint64_t>(static_cast<uint32_t>(token)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}

// A prior until acceptance is measured: a longer matched suffix predicts its
// continuation better, and each further draft token is less likely to survive.
float prior_confidence(int32_t matched_n, int32_t position) {
  const float first = std::min(0.9f, 0.45f + 0.1f * static_cast<float>(matched_n));
  float c = first;
  for (int32_t i = 0; i < position; ++i) c *= 0.85f;
  return std::clamp(c, 0.01f, 0.99f);
}

}  // namespace

void NgramIndex::check_config(const NgramConfig& config) {
  DI_CHECK(config.min_n >= 1 && config.max_n >= config.min_n && config.max_n <= 64,
           "n-gram drafting: need 1 <= min_n <= max_n <= 64, got {} and {}", config.min_n, config.max_n);
}

NgramIndex::NgramIndex(NgramConfig config) : config_(config) {
  check_config(config_);
  latest_end_.resize(static_cast<size_t>(config_.max_n - config_.min_n + 1));
}

uint64_t NgramIndex::hash_ending_at(int32_t end, int32_t n) const {
  uint64_t h = static_cast<uint64_t>(n);
  for (int32_t i = end - n + 1; i <= end; ++i) h = mix(h, tokens_[static_cast<size_t>(i)]);
  return h;
}

bool NgramIndex::same_ngram(int32_t end_a, int32_t end_b, int32_t n) const {
  for (int32_t i = 0; i < n; ++i) {
    if (tokens_[static_cast<size_t>(end_a - i)] != tokens_[static_cast<size_t>(end_b - i)]) return false;
  }
  return true;
}

void NgramIndex::append(std::span<const int32_t> tokens) {
  for (int32_t token : tokens) {
    // The n-grams ending at the current last position gain a following token.
    const int32_t end = size() - 1;
    for (int32_t n = config_.min_n; n <= config_.max_n && n <= end + 1; ++n) {
      latest_end_[static_cast<size_t>(n - config_.min_n)][hash_ending_at(end, n)] = end;
    }
    tokens_.push_back(token);
  }
}

int32_t NgramIndex::previous_end(int32_t n) const {
  const int32_t last = size() - 1;
  if (n > last) return -1;  // an earlier occurrence needs at least n + 1 tokens
  const auto& table = latest_end_[static_cast<size_t>(n - config_.min_n)];
  auto it = table.find(hash_ending_at(last, n));
  if (it == table.end() || !same_ngram(it->second, last, n)) return -1;  // absent, or a hash collision
  return it->second;
}

int32_t NgramIndex::matched_length() const {
  for (int32_t n = config_.max_n; n >= config_.min_n; --n) {
    if (previous_end(n) >= 0) return n;
  }
  return 0;
}

void NgramIndex::propose(int32_t max_tokens, Draft& out) const {
  out.clear();
  if (max_tokens <= 0) return;
  const int32_t n = matched_length();
  if (n == 0) return;
  const int32_t end = previous_end(n);
  // The continuation may run into the suffix itself (a repeating pattern).
  for (int32_t i = 1; i <= max_tokens && end + i < size(); ++i) {
    out.tokens.push_back(tokens_[static_cast<size_t>(end + i)]);
    out.confidence.push_back(prior_confidence(n, i - 1));
  }
}

}  // namespace deepinfer::spec
