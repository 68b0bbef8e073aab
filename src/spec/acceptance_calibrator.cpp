#include "spec/acceptance_calibrator.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace deepinfer::spec {

int AcceptanceCalibrator::bin_of(double raw) {
  const int b = static_cast<int>(std::clamp(raw, 0.0, 1.0) * kBins);
  return std::min(b, kBins - 1);
}

double AcceptanceCalibrator::calibrated(double raw) const {
  const double r = std::clamp(raw, 0.0, 1.0);
  const int b = bin_of(r);
  const double p = (static_cast<double>(accepted_[b]) + kPriorWeight * r) /
                   (static_cast<double>(verified_[b]) + kPriorWeight);
  // Never certain either way: a bin that has only seen rejections still
  // lets a draft through when verifying is nearly free.
  return std::clamp(p, 0.005, 0.995);
}

double AcceptanceCalibrator::optimistic(double raw) const {
  const double n = static_cast<double>(verified_[bin_of(raw)]);
  return std::clamp(calibrated(raw) + kExploreBonus / std::sqrt(1.0 + n), 0.005, 0.995);
}

void AcceptanceCalibrator::observe(double raw, bool accepted) {
  const int b = bin_of(raw);
  ++verified_[b];
  if (accepted) ++accepted_[b];
}

int64_t AcceptanceCalibrator::observations() const {
  return std::accumulate(verified_.begin(), verified_.end(), int64_t{0});
}

}  // namespace deepinfer::spec
