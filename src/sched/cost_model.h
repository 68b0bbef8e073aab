// StepCostModel: predicted time of a prefill chunk of q new tokens over c
// cached tokens, cost(q, c) = a*q^2 + b*q*c + d*q + e (seconds). Fitted by
// least squares from measured steps (`deepinfer bench`), then solved for the
// largest chunk that fits a step's time budget.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace deepinfer {

struct StepSample {
  double q = 0;        // new tokens
  double c = 0;        // cached prefix tokens
  double seconds = 0;  // measured step time
};

class StepCostModel {
 public:
  static constexpr int32_t kMaxChunk = 32768;

  StepCostModel() = default;
  StepCostModel(double a, double b, double d, double e) : a_(a), b_(b), d_(d), e_(e) {}

  // Least-squares fit; throws deepinfer::Error with fewer than 4 distinct samples.
  static StepCostModel fit(const std::vector<StepSample>& samples);

  double cost(double q, double c) const { return a_ * q * q + b_ * q * c + d_ * q + e_; }
  // Largest q in [1, kMaxChunk] with cost(q, c) <= budget_seconds (at least 1).
  int32_t max_chunk(double c, double budget_seconds) const;

  std::string to_json() const;
  static StepCostModel from_json(const std::string& text);

  double a() const { return a_; }
  double b() const { return b_; }
  double d() const { return d_; }
  double e() const { return e_; }

 private:
  double a_ = 0, b_ = 0, d_ = 0, e_ = 0;
};

}  // namespace deepinfer
