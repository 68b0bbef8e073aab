#include "runner/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "runner/rng.h"

namespace deepinfer {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// How many candidates the top-p search sorts first; it grows 4x until the
// nucleus fits, so typical rows never sort the whole vocabulary.
constexpr size_t kTopPInitialCandidates = 256;

bool needs_processing(const SamplingRow& row) {
  const SamplingParams& p = *row.params;
  return row.eos_masked || !p.logit_bias.empty() || p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f ||
         p.presence_penalty != 0.0f || row.processor != nullptr;
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

Sampler::Sampler(int32_t vocab_size) : vocab_size_(vocab_size) {
  DI_CHECK(vocab_size > 0, "Sampler: vocabulary size must be positive, got {}", vocab_size);
  const auto v = static_cast<size_t>(vocab_size);
  work_.resize(v);
  weights_.resize(v);
  candidates_.resize(v);
  counts_.assign(v, 0);
}

void Sampler::sample(std::span<const float> logits, std::span<const SamplingRow> rows, std::span<SampleResult> out) {
  const auto v = static_cast<size_t>(vocab_size_);
  DI_CHECK(logits.size() == rows.size() * v, "Sampler: {} logits for {} rows of vocabulary {}", logits.size(),
           rows.size(), v);
  DI_CHECK(out.size() == rows.size(), "Sampler: {} result slots for {} rows", out.size(), rows.size());
  for (size_t r = 0; r < rows.size(); ++r) out[r] = sample_row(logits.subspan(r * v, v), rows[r]);
}

SampleResult Sampler::sample_row(std::span<const float> logits, const SamplingRow& row) {
  DI_CHECK(row.params != nullptr, "Sampler: row without sampling parameters");
  DI_CHECK(logits.size() == static_cast<size_t>(vocab_size_), "Sampler: row of {} logits, vocabulary is {}",
           logits.size(), vocab_size_);
  const SamplingParams& p = *row.params;
  std::span<const float> view = logits;
  if (!p.greedy() || needs_processing(row)) {
    std::transform(logits.begin(), logits.end(), work_.begin(),
                   [](float x) { return std::isnan(x) ? kNegInf : x; });
    const std::span<float> work(work_);
    if (row.eos_masked) {
      if (!p.ignore_eos) mask_tokens(work, row.eos_ids);
      mask_tokens(work, p.stop_token_ids);
    }
    if (!p.logit_bias.empty()) apply_logit_bias(work, p.logit_bias);
    apply_penalties(work, p, row.prompt_ids, row.output_ids, counts_);
    if (row.processor != nullptr) row.processor->apply(row, work);
    view = work;
  }

  SampleResult result;
  result.token = p.greedy() ? argmax(view) : sample_filtered(view, p, row.seed, row.position);
  DI_CHECK(result.token >= 0, "Sampler: no token can be sampled (every logit is -inf or NaN)");
  if (p.logprobs) compute_logprobs(logits, result.token, *p.logprobs, result);
  return result;
}

int32_t Sampler::select_top(std::span<const float> logits, size_t k) {
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
  int32_t* heap = candidates_.data();
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
  return static_cast<int32_t>(n);
}

int32_t Sampler::sample_filtered(std::span<const float> logits, const SamplingParams& p, uint64_t seed,
                                 int64_t position) {
  const size_t v = logits.size();
  float max_logit = kNegInf;
  for (float x : logits) max_logit = std::max(max_logit, x);
  if (max_logit == kNegInf) return -1;
  DI_CHECK(std::isfinite(max_logit), "Sampler: logits contain +inf");
  const float inv_t = 1.0f / p.temperature;
  // Relative to the best token, which has weight 1, so min-p is a plain threshold.
  auto weight = [&](size_t i) { return std::exp((logits[i] - max_logit) * inv_t); };
  const double target_fraction = rng::uniform01(seed, static_cast<uint64_t>(position));

  const size_t k = p.top_k_enabled() ? std::min(static_cast<size_t>(p.top_k), v) : v;
  if (k == v && p.top_p >= 1.0f) {
    // No ranking needed: draw over the whole vocabulary in id order.
    double total = 0.0;
    for (size_t i = 0; i < v; ++i) {
      float w = weight(i);
      if (w < p.min_p) w = 0.0f;
      weights_[i] = w;
      total += w;
    }
    const double target = target_fraction * total;
    double cumulative = 0.0;
    int32_t last_positive = -1;
    for (size_t i = 0; i < v; ++i) {
      if (weights_[i] <= 0.0f) continue;
      cumulative += weights_[i];
      last_positive = static_cast<int32_t>(i);
      if (cumulative > target) return last_positive;
    }
    return last_positive;
  }

  size_t n = 0;
  double set_total = 0.0;
  if (k < v) {
    n = static_cast<size_t>(select_top(logits, k));
    for (size_t j = 0; j < n; ++j) {
      weights_[j] = weight(static_cast<size_t>(candidates_[j]));
      set_total += weights_[j];
    }
  } else {
    for (size_t i = 0; i < v; ++i) set_total += weight(i);
    // Grow the sorted prefix until it holds the nucleus.
    for (size_t want = std::min(v, kTopPInitialCandidates);; want = std::min(v, want * 4)) {
      n = static_cast<size_t>(select_top(logits, want));
      double cumulative = 0.0;
      for (size_t j = 0; j < n; ++j) {
        weights_[j] = weight(static_cast<size_t>(candidates_[j]));
        cumulative += weights_[j];
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
    if (kept > 0 && (kept_total >= nucleus || weights_[kept] < p.min_p)) break;
    kept_total += weights_[kept];
  }
  const double target = target_fraction * kept_total;
  double cumulative = 0.0;
  int32_t last_positive = -1;
  for (size_t j = 0; j < kept; ++j) {
    if (weights_[j] <= 0.0f) continue;
    cumulative += weights_[j];
    last_positive = candidates_[j];
    if (cumulative > target) return last_positive;
  }
  return last_positive;
}

void Sampler::compute_logprobs(std::span<const float> logits, int32_t token, int32_t top_n, SampleResult& out) {
  DI_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size(), "Sampler: token {} outside the vocabulary [0, {})",
           token, logits.size());
  DI_CHECK(top_n >= 0 && top_n <= SamplingParams::kMaxLogprobs, "Sampler: top_n {} outside [0, {}]", top_n,
           SamplingParams::kMaxLogprobs);
  float max_logit = kNegInf;
  for (float x : logits) {
    if (x > max_logit) max_logit = x;
  }
  DI_CHECK(std::isfinite(max_logit), "Sampler: logits have no finite maximum");
  double sum = 0.0;
  for (float x : logits) {
    if (x > kNegInf) sum += std::exp(static_cast<double>(x) - max_logit);
  }
  const double log_z = max_logit + std::log(sum);
  auto logprob = [&](int32_t id) {
    const float x = logits[static_cast<size_t>(id)];
    return std::isnan(x) ? kNegInf : static_cast<float>(static_cast<double>(x) - log_z);
  };

  const float chosen = logits[static_cast<size_t>(token)];
  int32_t higher = 0;
  for (float x : logits) higher += x > chosen ? 1 : 0;
  out.logprob = logprob(token);
  out.rank = higher + 1;

  // Insertion into a short sorted list: top_n <= 20, and most logits fail the
  // first comparison with the current last entry.
  out.n_top = 0;
  if (top_n == 0) return;
  auto& top = out.top;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (std::isnan(x)) continue;
    if (out.n_top == top_n && !(x > logits[static_cast<size_t>(top[static_cast<size_t>(top_n - 1)].token)])) continue;
    auto pos = static_cast<size_t>(out.n_top == top_n ? top_n - 1 : out.n_top++);
    while (pos > 0 && x > logits[static_cast<size_t>(top[pos - 1].token)]) {
      top[pos] = top[pos - 1];
      --pos;
    }
    top[pos].token = static_cast<int32_t>(i);
  }
  for (int32_t j = 0; j < out.n_top; ++j) top[static_cast<size_t>(j)].logprob = logprob(top[static_cast<size_t>(j)].token);
}

}  // namespace deepinfer
