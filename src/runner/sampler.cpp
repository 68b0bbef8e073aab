#include "runner/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "ops/ops.h"
#include "runner/penalty_state.h"

namespace deepinfer {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

static_assert(SamplingParams::kGreedyTemperature == kSamplingGreedyTemperature,
              "the backends' greedy threshold is the public one");

// A host struct as the u8[1, sizeof(T)] record tensor the ops take.
template <typename T>
Tensor record(T& value) {
  return Tensor(&value, DType::U8, {1, static_cast<int64_t>(sizeof(T))});
}

}  // namespace

Sampler::Sampler(int32_t vocab_size) : vocab_size_(vocab_size) {
  DI_CHECK(vocab_size > 0, "Sampler: vocabulary size must be positive, got {}", vocab_size);
  BackendOptions one_thread;
  one_thread.num_threads = 1;
  host_ = create_backend(DeviceType::CPU, one_thread);
  work_.resize(static_cast<size_t>(vocab_size));
}

Sampler::~Sampler() = default;

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
  // The processing edits a copy; NaN never wins a greedy choice and has no
  // weight in a draw, as -inf.
  std::transform(logits.begin(), logits.end(), work_.begin(), [](float x) { return std::isnan(x) ? kNegInf : x; });
  const Tensor work(work_.data(), DType::F32, {1, vocab_size_});
  if (PenaltyState::needed(p)) {
    for (const auto ids : {row.prompt_ids, row.output_ids}) {
      for (int32_t id : ids) {
        DI_CHECK(id >= 0 && id < vocab_size_, "sampler: history token id {} outside the vocabulary [0, {})", id,
                 vocab_size_);
      }
    }
    const PenaltyState history(p, row.prompt_ids, row.eos_ids, row.output_ids);
    PenaltyRowParams params = history.row_params(row.position, 0, -1);
    const auto entries = history.entries();
    const Tensor entry_records(const_cast<PenaltyEntry*>(entries.data()), DType::U8,
                               {static_cast<int64_t>(entries.size()), static_cast<int64_t>(sizeof(PenaltyEntry))});
    ops::apply_penalties(*host_, work, record(params), entry_records, Tensor());
  }
  if (row.processor != nullptr) row.processor->apply(row, work_);

  SamplingRowParams params{.temperature = p.temperature,
                           .top_p = p.top_p,
                           .min_p = p.min_p,
                           .top_k = p.top_k,
                           .seed = row.seed,
                           .position = row.position};
  SampleResult result;
  ops::sample(*host_, work, record(params), Tensor(&result.token, DType::I32, {1}));
  if (result.token < 0) return result;  // no token can be sampled: the caller reports the fault
  if (p.logprobs) compute_logprobs(logits, result.token, *p.logprobs, result);
  return result;
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
