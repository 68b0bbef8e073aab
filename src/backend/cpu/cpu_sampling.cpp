#include "backend/cpu/cpu_sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/rng.h"

namespace deepinfer::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// How many candidates the top-p search sorts first; it grows 4x until the
// nucleus fits, so typical rows never sort the whole vocabulary.
constexpr size_t kTopPInitialCandidates = 256;

// The k best ids of logits into candidates[0, n), best first; returns n = min(k, size).
size_t select_top(std::span<const float> logits, size_t k, std::span<int32_t> candidates) {
  // Highest logit first, lower id first among equals: a total order, so the
  // candidate list does not depend on how it is found.
  auto before = [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)];
    const float lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  // A bounded heap whose top is the worst kept candidate. Ids arrive in
  // increasing order, so a later id beats the top only with a strictly larger
  // logit: one comparison rejects almost every token, and the scan is O(V)
  // instead of the O(V log V) of a sort.
  int32_t* heap = candidates.data();
  size_t n = 0;
  float worst = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (n == k) {
      if (!(logits[i] > worst)) continue;
      std::pop_heap(heap, heap + n, before);
      heap[n - 1] = static_cast<int32_t>(i);
    } else {
      heap[n++] = static_cast<int32_t>(i);
    }
    std::push_heap(heap, heap + n, before);
    if (n == k) worst = logits[static_cast<size_t>(heap[0])];
  }
  std::sort_heap(heap, heap + n, before);
  return n;
}

// The token of the first of weights[0, count) at which the running sum (in
// order, zero weights skipped) exceeds target, or of the last positive weight
// when rounding leaves the sum short; -1 when every weight is zero.
template <typename TokenOf>
int32_t draw(std::span<const float> weights, size_t count, double target, TokenOf token_of) {
  double cumulative = 0.0;
  int32_t last_positive = -1;
  for (size_t j = 0; j < count; ++j) {
    if (weights[j] <= 0.0f) continue;
    cumulative += weights[j];
    last_positive = token_of(j);
    if (cumulative > target) return last_positive;
  }
  return last_positive;
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  int32_t best = -1;
  float best_value = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > best_value) {
      best_value = logits[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

int32_t sample_filtered(std::span<const float> logits, const SamplingRowParams& p, std::span<float> weights,
                        std::span<int32_t> candidates) {
  const size_t v = logits.size();
  DI_CHECK(weights.size() >= v && candidates.size() >= v, "sample_filtered: scratch of {} / {} for {} logits",
           weights.size(), candidates.size(), v);
  float max_logit = kNegInf;
  for (float x : logits) max_logit = std::max(max_logit, x);
  // Nothing to sample, or +inf (no distribution exists): a numerical fault
  // of this row, which the engine reports for its request alone.
  if (max_logit == kNegInf || !std::isfinite(max_logit)) return -1;
  const float inv_t = 1.0f / p.temperature;
  // Relative to the best token, which has weight 1, so min-p is a plain threshold.
  auto weight = [&](size_t i) { return std::exp((logits[i] - max_logit) * inv_t); };
  const double target_fraction = rng::uniform01(p.seed, static_cast<uint64_t>(p.position));

  const size_t k = p.top_k > 0 ? std::min(static_cast<size_t>(p.top_k), v) : v;
  if (k == v && p.top_p >= 1.0f) {
    // No ranking needed: draw over the whole vocabulary in id order.
    double total = 0.0;
    for (size_t i = 0; i < v; ++i) {
      float w = weight(i);
      if (w < p.min_p) w = 0.0f;
      weights[i] = w;
      total += w;
    }
    return draw(weights, v, target_fraction * total, [](size_t i) { return static_cast<int32_t>(i); });
  }

  size_t n = 0;
  double set_total = 0.0;
  if (k < v) {
    n = select_top(logits, k, candidates);
    for (size_t j = 0; j < n; ++j) {
      weights[j] = weight(static_cast<size_t>(candidates[j]));
      set_total += weights[j];
    }
  } else {
    for (size_t i = 0; i < v; ++i) set_total += weight(i);
    // Grow the sorted prefix until it holds the nucleus.
    for (size_t want = std::min(v, kTopPInitialCandidates);; want = std::min(v, want * 4)) {
      n = select_top(logits, want, candidates);
      double cumulative = 0.0;
      for (size_t j = 0; j < n; ++j) {
        weights[j] = weight(static_cast<size_t>(candidates[j]));
        cumulative += weights[j];
      }
      if (n == v || cumulative >= static_cast<double>(p.top_p) * set_total) break;
    }
  }

  // Top-p keeps a token while the mass ranked above it is below top_p; min-p
  // keeps it while its weight is at least min_p of the best one's.
  const double nucleus = static_cast<double>(p.top_p) * set_total;
  double kept_total = 0.0;
  size_t kept = 0;
  for (; kept < n; ++kept) {
    if (kept > 0 && (kept_total >= nucleus || weights[kept] < p.min_p)) break;
    kept_total += weights[kept];
  }
  return draw(weights, kept, target_fraction * kept_total, [&](size_t j) { return candidates[j]; });
}

int32_t sample_row(std::span<const float> logits, const SamplingRowParams& p, std::span<float> work,
                   std::span<float> weights, std::span<int32_t> candidates) {
  if (p.temperature < kSamplingGreedyTemperature) return argmax(logits);
  DI_CHECK(work.size() >= logits.size(), "sample_row: scratch of {} for {} logits", work.size(), logits.size());
  std::transform(logits.begin(), logits.end(), work.begin(), [](float x) { return std::isnan(x) ? kNegInf : x; });
  return sample_filtered(work.first(logits.size()), p, weights, candidates);
}

}  // namespace deepinfer::cpu
