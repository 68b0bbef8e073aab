#include "spec/step_time_curve.h"

#include <algorithm>
#include <array>

namespace deepinfer::spec {

namespace {

// Bin edges: exact for small steps, where verify lengths are decided one token
// at a time, then about 1.25x apart up to large prefill steps.
const std::vector<int32_t>& edges() {
  static const std::vector<int32_t> e = [] {
    std::vector<int32_t> v;
    for (int32_t t = 1; t <= 16; ++t) v.push_back(t);
    for (double t = 20; t <= 70000; t *= 1.25) v.push_back(static_cast<int32_t>(t));
    return v;
  }();
  return e;
}

}  // namespace

StepTimeCurve::StepTimeCurve() : mean_ms_(edges().size(), 0.0), count_(edges().size(), 0) {}

int32_t StepTimeCurve::bin_of(int32_t tokens) {
  const auto& e = edges();
  auto it = std::upper_bound(e.begin(), e.end(), std::max(tokens, 1));
  return static_cast<int32_t>(it - e.begin()) - 1;
}

int32_t StepTimeCurve::bin_center(int32_t bin) {
  const auto& e = edges();
  const auto b = static_cast<size_t>(bin);
  if (b + 1 >= e.size()) return e.back();
  return (e[b] + e[b + 1] - 1) / 2;
}

void StepTimeCurve::record(int32_t tokens, double ms) {
  if (tokens <= 0 || !(ms >= 0.0)) return;
  const auto b = static_cast<size_t>(bin_of(tokens));
  mean_ms_[b] = count_[b] == 0 ? ms : (1.0 - kAlpha) * mean_ms_[b] + kAlpha * ms;
  ++count_[b];
}

int32_t StepTimeCurve::num_measured_bins() const {
  return static_cast<int32_t>(std::count_if(count_.begin(), count_.end(), [](int64_t c) { return c > 0; }));
}

std::vector<std::pair<int32_t, double>> StepTimeCurve::measured() const {
  std::vector<std::pair<int32_t, double>> points;
  for (size_t b = 0; b < count_.size(); ++b) {
    if (count_[b] > 0) points.emplace_back(bin_center(static_cast<int32_t>(b)), mean_ms_[b]);
  }
  return points;
}

double StepTimeCurve::predict(int32_t tokens) const {
  // Nearest measured bins at or below and above the query.
  const int32_t want = bin_of(tokens);
  int32_t lo = -1, hi = -1;
  for (int32_t b = want; b >= 0; --b) {
    if (count_[static_cast<size_t>(b)] > 0) {
      lo = b;
      break;
    }
  }
  for (int32_t b = want + (lo == want ? 1 : 0); b < static_cast<int32_t>(count_.size()); ++b) {
    if (count_[static_cast<size_t>(b)] > 0) {
      hi = b;
      break;
    }
  }
  if (lo == want) hi = -1;  // measured exactly
  auto at = [&](int32_t b) { return mean_ms_[static_cast<size_t>(b)]; };
  if (lo < 0 && hi < 0) return 0.0;
  if (lo >= 0 && hi < 0) {
    // At or beyond the largest measured bin: extend with the slope of the two largest.
    int32_t prev = -1;
    for (int32_t b = lo - 1; b >= 0; --b) {
      if (count_[static_cast<size_t>(b)] > 0) {
        prev = b;
        break;
      }
    }
    if (lo == want || prev < 0) return at(lo);
    const double slope = std::max(0.0, (at(lo) - at(prev)) / (bin_center(lo) - bin_center(prev)));
    return at(lo) + slope * (tokens - bin_center(lo));
  }
  if (lo < 0) return at(hi);  // below the smallest measured bin: no cheaper than it is known to be
  const double x0 = bin_center(lo), x1 = bin_center(hi);
  const double f = std::clamp((tokens - x0) / (x1 - x0), 0.0, 1.0);
  return at(lo) + f * (at(hi) - at(lo));
}

}  // namespace deepinfer::spec
