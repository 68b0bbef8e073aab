// Sampler: turns rows of logits into tokens on the host, with the backend
// ops every device runs (ops::apply_penalties, ops::sample) on a CPU backend
// of its own, so a host-sampled row is processed and drawn by exactly the
// arithmetic of a device-sampled one.
//
// Per row, in vLLM's order: min_tokens mask (EOS + stop_token_ids), logit_bias,
// repetition / frequency / presence penalties (a PenaltyState of the row's
// history), the row's own LogitsProcessor (grammar mask, ...), then greedy
// argmax (temperature ~0, lowest index wins ties) or temperature, top-k, top-p,
// min-p and a draw from a counter-based RNG keyed on (seed, position). Each
// row is computed alone, so a row's token never depends on the other rows of
// the batch.
//
// Logprobs are those of the raw model logits (log-softmax before any
// processing), as vLLM returns by default.
//
// The engine samples most rows on the device instead (ModelRunner); rows come
// here when the host needs their raw logits anyway: logprobs together with
// penalties, or a LogitsProcessor.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "deepinfer/sampling_params.h"
#include "runner/logits_processors.h"

namespace deepinfer {

struct SamplingRow {
  const SamplingParams* params = nullptr;
  std::span<const int32_t> prompt_ids;
  std::span<const int32_t> output_ids;
  // Request-level seed: params.seed if given, else derived by the engine from
  // the request id (rng::derive_seed); n > 1 children get distinct seeds.
  uint64_t seed = 0;
  int64_t position = 0;  // index of the token being sampled within the output (min_tokens counts it)
  std::span<const int32_t> eos_ids;
  LogitsProcessor* processor = nullptr;  // optional, request-specific
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = -1;
  // Filled when params.logprobs is set: the chosen token's raw logprob, its
  // rank (1 + number of tokens with a strictly higher logit) and the top
  // params.logprobs alternatives, most likely first (ties: lower id first).
  float logprob = 0.0f;
  int32_t rank = 0;
  int32_t n_top = 0;
  std::array<TokenLogprob, SamplingParams::kMaxLogprobs> top{};

  std::span<const TokenLogprob> top_logprobs() const { return {top.data(), static_cast<size_t>(n_top)}; }
};

class Sampler {
 public:
  explicit Sampler(int32_t vocab_size);
  ~Sampler();

  // logits: f32[rows.size(), vocab_size], row-major; out: rows.size() results.
  void sample(std::span<const float> logits, std::span<const SamplingRow> rows, std::span<SampleResult> out);
  SampleResult sample_row(std::span<const float> logits, const SamplingRow& row);

  // Raw log-softmax facts about `token` in one row of logits (logprob, rank,
  // top_n alternatives); also what prompt_logprobs are made of.
  static void compute_logprobs(std::span<const float> logits, int32_t token, int32_t top_n, SampleResult& out);

  int32_t vocab_size() const { return vocab_size_; }

 private:
  int32_t vocab_size_;
  std::unique_ptr<Backend> host_;  // a one-thread CPU backend the ops run on
  // Scratch reused across calls so steady-state sampling does not allocate.
  std::vector<float> work_;
};

}  // namespace deepinfer
