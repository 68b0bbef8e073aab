// StepTimeCurve: the device's step time as a function of the tokens in the
// step, measured online. The dynamic verify length weighs a draft's expected
// gain against the time it adds to the step, read off this curve: on a GPU
// at small batches a step of 64 tokens costs about what a step of 1 does
// (weights dominate), at large batches every token costs; on a CPU nearly
// every token costs.
//
// Steps are binned by token count on a roughly geometric grid; each bin keeps
// an exponentially weighted mean of its steps' times. Between measured bins
// the curve is interpolated linearly; beyond the largest it is extended with
// the slope of the last two (flat while fewer than two are measured, which
// makes a fresh engine verify every draft and so measure the large end first).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace deepinfer::spec {

class StepTimeCurve {
 public:
  StepTimeCurve();
  // A completed step of `tokens` query tokens that took `ms` on the device.
  void record(int32_t tokens, double ms);
  // Predicted time of a step of `tokens` tokens in ms; 0 before any record.
  double predict(int32_t tokens) const;
  int32_t num_measured_bins() const;
  // The measured bins as (tokens at the bin's centre, mean ms), smallest first:
  // what the curve has seen, for reports.
  std::vector<std::pair<int32_t, double>> measured() const;

  // The grid: bin i holds steps of [edge(i), edge(i + 1)) tokens.
  static int32_t bin_of(int32_t tokens);
  static int32_t bin_center(int32_t bin);

 private:
  static constexpr double kAlpha = 0.1;  // weight of the newest step in its bin's mean
  std::vector<double> mean_ms_;
  std::vector<int64_t> count_;
};

}  // namespace deepinfer::spec
