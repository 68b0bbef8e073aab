#include "sched/cost_model.h"

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_parse.h"

namespace deepinfer {

StepCostModel StepCostModel::fit(const std::vector<StepSample>& samples) {
  DI_CHECK(samples.size() >= 4, "cost model fit needs at least 4 samples, got {}", samples.size());
  // Normal equations for features (q^2, q*c, q, 1), solved by Gaussian elimination
  // with partial pivoting. Features are scaled to keep the system well conditioned.
  double qs = 1, cs = 1;
  for (const auto& s : samples) {
    qs = std::max(qs, s.q);
    cs = std::max(cs, s.c);
  }
  std::array<std::array<double, 5>, 4> m{};
  for (const auto& s : samples) {
    const double q = s.q / qs, c = s.c / cs;
    const std::array<double, 4> f = {q * q, q * c, q, 1.0};
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) m[i][j] += f[i] * f[j];
      m[i][4] += f[i] * s.seconds;
    }
  }
  // A tiny ridge keeps the system solvable when a feature has no variation (e.g. c = 0 everywhere).
  for (int i = 0; i < 4; ++i) m[i][i] += 1e-9 * (m[i][i] + 1);
  for (int col = 0; col < 4; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 4; ++r) {
      if (std::abs(m[r][col]) > std::abs(m[pivot][col])) pivot = r;
    }
    std::swap(m[col], m[pivot]);
    DI_CHECK(std::abs(m[col][col]) > 1e-30, "cost model fit: samples do not determine the model");
    for (int r = 0; r < 4; ++r) {
      if (r == col) continue;
      const double k = m[r][col] / m[col][col];
      for (int j = col; j < 5; ++j) m[r][j] -= k * m[col][j];
    }
  }
  std::array<double, 4> w{};
  for (int i = 0; i < 4; ++i) w[i] = m[i][4] / m[i][i];
  return StepCostModel(w[0] / (qs * qs), w[1] / (qs * cs), w[2] / qs, w[3]);
}

int32_t StepCostModel::max_chunk(double c, double budget_seconds) const {
  const double lin = b_ * c + d_;
  const double rest = e_ - budget_seconds;
  double q;
  if (std::abs(a_) < 1e-18) {
    q = lin > 0 ? -rest / lin : kMaxChunk;
  } else {
    const double disc = lin * lin - 4 * a_ * rest;
    q = disc < 0 ? 1 : (-lin + std::sqrt(disc)) / (2 * a_);
  }
  if (!std::isfinite(q)) q = kMaxChunk;
  return static_cast<int32_t>(std::clamp(std::floor(q), 1.0, static_cast<double>(kMaxChunk)));
}

std::string StepCostModel::to_json() const {
  return nlohmann::json{{"a", a_}, {"b", b_}, {"d", d_}, {"e", e_}}.dump();
}

StepCostModel StepCostModel::from_json(const std::string& text) {
  const nlohmann::json j = parse_json(text, "cost model");
  DI_CHECK(j.is_object(), "cost model: not a JSON object");
  auto num = [&](const char* k) {
    DI_CHECK(j.contains(k) && j[k].is_number(), "cost model: missing number '{}'", k);
    double v = j[k].get<double>();
    DI_CHECK(std::isfinite(v), "cost model: '{}' is not finite", k);
    return v;
  };
  return StepCostModel(num("a"), num("b"), num("d"), num("e"));
}

}  // namespace deepinfer
