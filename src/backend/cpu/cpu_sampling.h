// The sampling rules every backend reproduces, on one row of logits.
//
// Greedy rows take the argmax. Other rows weigh each token by
// w = exp((logit - max) / temperature) (f32; the best token weighs exactly 1),
// rank the tokens by logit, highest first and lower id first among equals,
// and keep a prefix of that ranking: the first token always, then a token
// while it is among the top_k, the mass ranked above it is below
// top_p * (mass of the top_k, or of the whole vocabulary without top_k) and
// w >= min_p. The token is drawn by inverse CDF over the kept prefix in rank
// order: the first token whose running mass (f64) exceeds
// rng::uniform01(seed, position) * kept mass. Without top_k and top_p the
// draw walks the vocabulary in id order instead, with min-p applied as a
// zero weight. CpuBackend::sample (which the host Sampler runs too) calls
// these functions; the CUDA kernel is tested against them.
#pragma once

#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace deepinfer::cpu {

// Index of the largest logit, lowest index on ties; NaN never wins; -1 if no
// logit is above -inf.
int32_t argmax(std::span<const float> logits);

// The non-greedy draw over logits that hold no NaN (the caller maps NaN to
// -inf). weights and candidates: scratch of at least logits.size() entries.
// Returns -1 if every logit is -inf; throws deepinfer::Error on a +inf logit.
int32_t sample_filtered(std::span<const float> logits, const SamplingRowParams& p, std::span<float> weights,
                        std::span<int32_t> candidates);

// Backend::sample's rule for one row: argmax when greedy, else NaN -> -inf into
// `work` and sample_filtered. work, weights, candidates: scratch of at least
// logits.size() entries.
int32_t sample_row(std::span<const float> logits, const SamplingRowParams& p, std::span<float> work,
                   std::span<float> weights, std::span<int32_t> candidates);

}  // namespace deepinfer::cpu
