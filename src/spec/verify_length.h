// DSpark's dynamic verify length: how many of each request's drafts the next
// step verifies. Verifying a draft token costs step time (StepTimeCurve) and
// pays off only if it and every draft before it are accepted. With the
// calibrated chance of each token, the expected tokens a step yields are
// (one per decoding request) + the sum, over verified drafts, of the
// probability that the draft and all before it are accepted. The step's
// verified drafts are chosen to maximise expected tokens per unit of step
// time for the whole batch — so as the batch grows and steps become
// compute-bound, speculation shrinks on its own.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "spec/step_time_curve.h"

namespace deepinfer::spec {

struct VerifyChoice {
  std::vector<int32_t> lengths;  // drafts to verify, per request
  double expected_tokens = 0;    // expected outputs of the step
  double predicted_ms = 0;       // predicted step time (0 when the curve is unmeasured)
};

// accept[i][j]: calibrated probability that request i's draft j is accepted
// given drafts 0..j-1 were. base_tokens: query tokens of the step besides
// drafts (decode tokens, prompt chunks); base_outputs: tokens the step yields
// without drafts. drafting_overhead_ms: time a step that verifies drafts
// costs beyond its device time (the host work the pipelined loop would have
// hidden). Before the curve has any measurement every draft is verified.
VerifyChoice choose_verify_lengths(std::span<const std::vector<double>> accept, int32_t base_tokens,
                                   int32_t base_outputs, const StepTimeCurve& curve,
                                   double drafting_overhead_ms = 0.0);

}  // namespace deepinfer::spec
