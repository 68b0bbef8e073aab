#include "spec/verify_length.h"

#include <algorithm>

namespace deepinfer::spec {

VerifyChoice choose_verify_lengths(std::span<const std::vector<double>> accept, int32_t base_tokens,
                                   int32_t base_outputs, const StepTimeCurve& curve,
                                   double drafting_overhead_ms) {
  struct Token {
    double reach;  // probability that this draft and all before it are accepted
    int32_t request;
    int32_t index;
  };
  std::vector<Token> tokens;
  for (size_t i = 0; i < accept.size(); ++i) {
    double reach = 1.0;
    for (size_t j = 0; j < accept[i].size(); ++j) {
      reach *= std::clamp(accept[i][j], 0.0, 1.0);
      tokens.push_back({reach, static_cast<int32_t>(i), static_cast<int32_t>(j)});
    }
  }
  // Reach never grows along a request's drafts, so any count of the best
  // tokens in this order is a prefix of every request's drafts.
  std::stable_sort(tokens.begin(), tokens.end(), [](const Token& a, const Token& b) {
    if (a.reach != b.reach) return a.reach > b.reach;
    if (a.request != b.request) return a.request < b.request;
    return a.index < b.index;
  });
  VerifyChoice choice;
  choice.lengths.assign(accept.size(), 0);
  size_t best_n = tokens.size();
  double expected = base_outputs;
  for (const Token& t : tokens) expected += t.reach;
  choice.expected_tokens = expected;
  if (curve.num_measured_bins() > 0) {
    double running = base_outputs;
    double best_rate = -1.0;
    for (size_t n = 0; n <= tokens.size(); ++n) {
      if (n > 0) running += tokens[n - 1].reach;
      const double ms =
          curve.predict(base_tokens + static_cast<int32_t>(n)) + (n > 0 ? std::max(drafting_overhead_ms, 0.0) : 0.0);
      const double rate = ms > 0.0 ? running / ms : running;
      if (rate > best_rate) {  // strict: an equal rate does not buy more verification
        best_rate = rate;
        best_n = n;
        choice.expected_tokens = running;
        choice.predicted_ms = ms;
      }
    }
  }
  for (size_t n = 0; n < best_n; ++n) ++choice.lengths[static_cast<size_t>(tokens[n].request)];
  return choice;
}

}  // namespace deepinfer::spec
