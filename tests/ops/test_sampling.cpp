// sample on every backend against cpu::sample_row, the rule it must follow
// token for token: random and adversarial logits (ties, -inf, NaN, signed
// zeros), vocabularies from 1 to 262144, every filter alone and combined,
// strided rows. Plus a chi-square check of cpu::sample_row itself against the
// exact filtered distribution.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/cpu/cpu_sampling.h"
#include "core/rng.h"
#include "op_test_util.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

class SamplingTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(SamplingTest);

SamplingRowParams make_params(float temperature, int32_t top_k, float top_p, float min_p) {
  SamplingRowParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

// Every filter alone and in combination; top_k = -2 stands for "the vocabulary".
std::vector<SamplingRowParams> parameter_sets() {
  return {
      make_params(0.0f, 0, 1.0f, 0.0f),    make_params(1.0f, 0, 1.0f, 0.0f),    make_params(0.7f, 0, 1.0f, 0.0f),
      make_params(1.5f, 0, 1.0f, 0.0f),    make_params(1.0f, 1, 1.0f, 0.0f),    make_params(1.0f, 50, 1.0f, 0.0f),
      make_params(1.0f, -2, 1.0f, 0.0f),   make_params(1.0f, 0, 0.1f, 0.0f),    make_params(1.0f, 0, 0.9f, 0.0f),
      make_params(1.0f, 0, 0.0f, 0.05f),   make_params(1.0f, 0, 1.0f, 0.05f),   make_params(0.8f, 0, 1.0f, 0.3f),
      make_params(1.0f, 50, 0.9f, 0.0f),   make_params(0.8f, 50, 0.9f, 0.1f),   make_params(1.2f, 0, 0.95f, 0.05f),
      make_params(1.0f, -2, 0.5f, 0.0f),   make_params(1.0f, 1000, 0.8f, 0.0f), make_params(1e-4f, 0, 1.0f, 0.0f),
      make_params(2.0f, 7, 1.0f, 0.02f),
  };
}

enum class Logits { Uniform, Peaked, Ties, OneFinite, Nans, SignedZeros, AllNegInf, Bf16 };
constexpr Logits kAllLogits[] = {Logits::Uniform,     Logits::Peaked, Logits::Ties,      Logits::OneFinite,
                                 Logits::Nans,        Logits::Bf16,   Logits::SignedZeros, Logits::AllNegInf};

void fill_logits(Rng& rng, Logits kind, float* x, int64_t vocab) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < vocab; ++i) {
    switch (kind) {
      case Logits::Uniform: x[i] = rng.uniform(-4.0f, 4.0f); break;
      case Logits::Peaked: x[i] = rng.uniform(-12.0f, 2.0f) + (rng.uniform_int(0, 999) == 0 ? 12.0f : 0.0f); break;
      case Logits::Ties: x[i] = static_cast<float>(rng.uniform_int(0, 3)) * 0.5f; break;
      case Logits::OneFinite: x[i] = -kInf; break;
      case Logits::Nans: x[i] = rng.uniform_int(0, 3) == 0 ? nan : rng.uniform(-3.0f, 3.0f); break;
      case Logits::SignedZeros: x[i] = rng.uniform_int(0, 1) ? 0.0f : -0.0f; break;
      case Logits::AllNegInf: x[i] = rng.uniform_int(0, 1) ? -kInf : nan; break;
      case Logits::Bf16: {
        // Logits that went through bf16: few distinct values, many exact ties.
        uint32_t bits;
        const float v = rng.uniform(-8.0f, 8.0f);
        std::memcpy(&bits, &v, 4);
        bits &= 0xffff0000u;
        std::memcpy(&x[i], &bits, 4);
        break;
      }
    }
  }
  if (kind == Logits::OneFinite) x[rng.uniform_int(0, static_cast<int>(vocab - 1))] = rng.uniform(-50.0f, 50.0f);
}

struct Batch {
  int64_t rows = 0, vocab = 0, stride = 0, offset = 0;  // row r is logits[r * stride + offset, ... + vocab)
  std::vector<float> logits;
  std::vector<SamplingRowParams> params;
};

// Rows cycle through the logits kinds and the parameter sets with distinct seeds and positions.
Batch make_batch(Rng& rng, int64_t vocab, int64_t rows, bool strided, const std::vector<Logits>& kinds) {
  Batch b;
  b.rows = rows;
  b.vocab = vocab;
  b.offset = strided ? 3 : 0;
  b.stride = vocab + (strided ? 5 : 0);
  b.logits.assign(static_cast<size_t>(rows * b.stride), 123.0f);  // padding must never be read
  const std::vector<SamplingRowParams> sets = parameter_sets();
  for (int64_t r = 0; r < rows; ++r) {
    fill_logits(rng, kinds[static_cast<size_t>(r) % kinds.size()], &b.logits[static_cast<size_t>(r * b.stride + b.offset)],
                vocab);
    SamplingRowParams p = sets[static_cast<size_t>(r / static_cast<int64_t>(kinds.size()) + r) % sets.size()];
    if (p.top_k == -2) p.top_k = static_cast<int32_t>(vocab);
    p.seed = rng::derive_seed(2024, static_cast<uint64_t>(r));
    p.position = r * 7 + 1;
    b.params.push_back(p);
  }
  return b;
}

std::vector<int32_t> reference(const Batch& b) {
  const auto v = static_cast<size_t>(b.vocab);
  std::vector<float> work(v), weights(v);
  std::vector<int32_t> candidates(v);
  std::vector<int32_t> tokens;
  for (int64_t r = 0; r < b.rows; ++r) {
    std::span<const float> row(&b.logits[static_cast<size_t>(r * b.stride + b.offset)], v);
    tokens.push_back(cpu::sample_row(row, b.params[static_cast<size_t>(r)], work, weights, candidates));
  }
  return tokens;
}

std::vector<int32_t> run_sample(Backend& backend, const Batch& b) {
  DeviceTensor logits = upload_f32(backend, {b.rows, b.stride}, b.logits);
  DeviceTensor params = upload(backend, DType::U8, {b.rows, static_cast<int64_t>(sizeof(SamplingRowParams))},
                               b.params.data());
  DeviceTensor tokens = zeros(backend, DType::I32, {b.rows});
  ops::sample(backend, logits.t.narrow(1, b.offset, b.vocab), params.t, tokens.t);
  std::vector<int32_t> out(static_cast<size_t>(b.rows));
  backend.copy(Tensor(out.data(), DType::I32, {b.rows}), tokens.t);
  backend.synchronize();
  return out;
}

void expect_same_tokens(Backend& backend, const Batch& b) {
  const std::vector<int32_t> expected = reference(b);
  const std::vector<int32_t> actual = run_sample(backend, b);
  for (int64_t r = 0; r < b.rows; ++r) {
    const SamplingRowParams& p = b.params[static_cast<size_t>(r)];
    EXPECT_EQ(actual[static_cast<size_t>(r)], expected[static_cast<size_t>(r)])
        << fmt::format("vocab {} row {}: temperature {} top_k {} top_p {} min_p {}", b.vocab, r, p.temperature,
                       p.top_k, p.top_p, p.min_p);
  }
}

TEST_P(SamplingTest, MatchesCpuRuleOnEveryVocabularyAndFilter) {
  Rng rng(7);
  const std::vector<Logits> kinds(std::begin(kAllLogits), std::end(kAllLogits));
  for (int64_t vocab : {1, 7, 32000, 151936, 262144}) {
    SCOPED_TRACE(fmt::format("vocab {}", vocab));
    const int64_t rows = vocab <= 32000 ? 3 * 19 * 8 : 19 * 2;
    expect_same_tokens(backend(), make_batch(rng, vocab, rows, /*strided=*/vocab % 2 == 0, kinds));
  }
}

TEST_P(SamplingTest, ManyDrawsOnRealisticRows) {
  // Many positions on the same kinds of rows: each draw lands elsewhere in the CDF.
  Rng rng(11);
  expect_same_tokens(backend(), make_batch(rng, 128256, 96, true, {Logits::Peaked, Logits::Bf16, Logits::Uniform}));
  expect_same_tokens(backend(), make_batch(rng, 4099, 600, false, {Logits::Uniform, Logits::Ties, Logits::Peaked}));
}

TEST_P(SamplingTest, NoSampleableTokenGivesMinusOne) {
  Batch b;
  b.rows = 2;
  b.vocab = b.stride = 9;
  b.logits.assign(18, -kInf);
  b.logits[3] = std::numeric_limits<float>::quiet_NaN();
  b.params = {make_params(0.0f, 0, 1.0f, 0.0f), make_params(1.0f, 3, 0.5f, 0.0f)};
  EXPECT_EQ(run_sample(backend(), b), (std::vector<int32_t>{-1, -1}));
}

// What the step after a failed row reads on the device: a valid id in place of -1.
TEST_P(SamplingTest, SanitizeIdsReplacesIdsOutsideTheVocabulary) {
  const std::vector<int32_t> ids = {5, -1, 0, 9, 10, -2147483647 - 1, 2147483647, 3};
  DeviceTensor t = upload(backend(), DType::I32, {static_cast<int64_t>(ids.size())}, ids.data());
  ops::sanitize_ids(backend(), t.t, 10);
  std::vector<int32_t> out(ids.size());
  backend().copy(Tensor(out.data(), DType::I32, {static_cast<int64_t>(out.size())}), t.t);
  backend().synchronize();
  EXPECT_EQ(out, (std::vector<int32_t>{5, 0, 0, 9, 0, 0, 0, 3}));
  EXPECT_THROW(ops::sanitize_ids(backend(), t.t, 0), Error);
}

TEST_P(SamplingTest, PlusInfinityGivesMinusOneUnlessGreedy) {
  Batch b;
  b.rows = 1;
  b.vocab = b.stride = 5;
  b.logits = {0.0f, kInf, 1.0f, kInf, 2.0f};
  b.params = {make_params(0.0f, 0, 1.0f, 0.0f)};
  EXPECT_EQ(run_sample(backend(), b), (std::vector<int32_t>{1}));
  b.params = {make_params(1.0f, 0, 1.0f, 0.0f)};
  EXPECT_EQ(run_sample(backend(), b), (std::vector<int32_t>{-1}));
  // The backend is usable afterwards.
  b.logits[1] = b.logits[3] = 0.0f;
  b.params = {make_params(0.0f, 0, 1.0f, 0.0f)};
  EXPECT_EQ(run_sample(backend(), b), (std::vector<int32_t>{4}));
}

TEST_P(SamplingTest, RejectsBadShapes) {
  DeviceTensor logits = zeros(backend(), DType::F32, {2, 8});
  DeviceTensor params = zeros(backend(), DType::U8, {2, 32});
  DeviceTensor short_params = zeros(backend(), DType::U8, {2, 31});
  DeviceTensor tokens = zeros(backend(), DType::I32, {2});
  DeviceTensor tokens_f32 = zeros(backend(), DType::F32, {2});
  DeviceTensor one_token = zeros(backend(), DType::I32, {1});
  EXPECT_THROW(ops::sample(backend(), logits.t, short_params.t, tokens.t), Error);
  EXPECT_THROW(ops::sample(backend(), logits.t, params.t, tokens_f32.t), Error);
  EXPECT_THROW(ops::sample(backend(), logits.t, params.t, one_token.t), Error);
  EXPECT_THROW(ops::sample(backend(), logits.t.reshape({16}), params.t, tokens.t), Error);
  EXPECT_NO_THROW(ops::sample(backend(), logits.t, params.t, tokens.t));
}

// The exact distribution cpu::sample_row draws from, computed with a full
// sort in f64: the kept prefix of the ranking, normalised.
std::vector<double> filtered_distribution(const std::vector<float>& logits, const SamplingRowParams& p) {
  const size_t v = logits.size();
  std::vector<int32_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const double m = logits[static_cast<size_t>(order[0])];
  std::vector<double> w(v);
  for (size_t i = 0; i < v; ++i) w[i] = std::exp((logits[i] - m) / p.temperature);
  const size_t k = p.top_k > 0 ? std::min<size_t>(static_cast<size_t>(p.top_k), v) : v;
  double set_total = 0;
  for (size_t j = 0; j < k; ++j) set_total += w[static_cast<size_t>(order[j])];
  std::vector<double> probs(v, 0.0);
  double kept = 0;
  for (size_t j = 0; j < k; ++j) {
    const double wj = w[static_cast<size_t>(order[j])];
    if (j > 0 && (kept >= p.top_p * set_total || wj < p.min_p)) break;
    probs[static_cast<size_t>(order[j])] = wj;
    kept += wj;
  }
  for (double& x : probs) x /= kept;
  return probs;
}

TEST(CpuSampling, ChiSquareAgainstFilteredDistribution) {
  const std::vector<float> logits{1.0f, 2.5f, 0.3f, -1.0f, 2.0f, 0.9f, 1.7f, -0.5f, 2.2f, 0.0f, 1.1f, 1.4f};
  const auto v = logits.size();
  std::vector<float> work(v), weights(v);
  std::vector<int32_t> candidates(v);
  const SamplingRowParams cases[] = {make_params(1.0f, 0, 1.0f, 0.0f), make_params(0.8f, 6, 1.0f, 0.0f),
                                     make_params(1.3f, 0, 0.7f, 0.0f), make_params(1.0f, 0, 1.0f, 0.2f),
                                     make_params(0.9f, 8, 0.85f, 0.1f)};
  constexpr int kDraws = 40000;
  for (SamplingRowParams p : cases) {
    const std::vector<double> probs = filtered_distribution(logits, p);
    std::vector<int> counts(v, 0);
    p.seed = 99;
    for (int64_t pos = 0; pos < kDraws; ++pos) {
      p.position = pos;
      const int32_t t = cpu::sample_row(logits, p, work, weights, candidates);
      ASSERT_GE(t, 0);
      ++counts[static_cast<size_t>(t)];
    }
    double chi2 = 0;
    int dof = -1;
    for (size_t i = 0; i < v; ++i) {
      if (probs[i] == 0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " is filtered out";
        continue;
      }
      const double e = probs[i] * kDraws;
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      ++dof;
    }
    // Far beyond the 1e-6 quantile for <= 11 degrees of freedom (~45); fixed seed: deterministic.
    EXPECT_LT(chi2, 45.0) << fmt::format("top_k {} top_p {} min_p {} ({} degrees of freedom)", p.top_k, p.top_p,
                                          p.min_p, dof);
    EXPECT_GT(dof, 0);
  }
}

// token_probs: softmax(row)[token] in f64 over the finite logits; 0 for an
// id outside the vocabulary, a non-finite chosen logit or a row of -inf.
TEST_P(SamplingTest, TokenProbs) {
  Rng rng(77);
  for (int64_t vocab : {int64_t{1}, int64_t{37}, int64_t{4099}, int64_t{129280}}) {
    SCOPED_TRACE(fmt::format("vocab {}", vocab));
    const int64_t rows = 6;
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    for (auto& v : logits) v = rng.uniform(-6.0f, 6.0f);
    float* last = logits.data() + (rows - 1) * vocab;
    std::fill(last, last + vocab, -kInf);                       // no finite logit
    if (vocab > 1) logits[static_cast<size_t>(vocab) + 1] = -kInf;  // a masked token elsewhere
    std::vector<int32_t> tokens;
    for (int64_t r = 0; r < rows; ++r) tokens.push_back(static_cast<int32_t>(rng.uniform_int(0, vocab - 1)));
    tokens[1] = vocab > 1 ? 1 : 0;                     // the masked one
    tokens[2] = static_cast<int32_t>(vocab);           // outside the vocabulary
    tokens[3] = -1;                                    // an unsampled row
    DeviceTensor dl = upload_f32(backend(), {rows, vocab}, logits);
    DeviceTensor dt = upload_i32(backend(), tokens);
    DeviceTensor out = zeros(backend(), DType::F32, {rows});
    ops::token_probs(backend(), dl.t, dt.t, out.t);
    std::vector<double> expected;
    for (int64_t r = 0; r < rows; ++r) {
      const float* l = logits.data() + r * vocab;
      const int32_t t = tokens[static_cast<size_t>(r)];
      double max = -INFINITY, sum = 0.0;
      for (int64_t i = 0; i < vocab; ++i) {
        if (std::isfinite(l[i])) max = std::max(max, double(l[i]));
      }
      for (int64_t i = 0; i < vocab; ++i) {
        if (std::isfinite(l[i])) sum += std::exp(double(l[i]) - max);
      }
      const bool valid = std::isfinite(max) && t >= 0 && t < vocab && std::isfinite(l[t]);
      expected.push_back(valid ? std::exp(double(l[t]) - max) / sum : 0.0);
    }
    EXPECT_TRUE(all_close(download_f32(backend(), out.t), expected, 1e-7, 1e-4));
  }
}

}  // namespace
}  // namespace deepinfer::testing
