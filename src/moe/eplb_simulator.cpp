#include "moe/eplb_simulator.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <numbers>
#include <random>

#include "core/error.h"
#include "moe/deepseek_eplb.h"

namespace deepinfer::moe {
namespace {

constexpr int32_t kMaxTraceExperts = 1 << 16;
constexpr size_t kMaxTraceCounts = size_t{1} << 28;
constexpr int64_t kMaxTraceCount = int64_t{1} << 40;

// Distributions written out here because the standard library's normal and
// Poisson distributions differ between implementations; traces must be the
// same everywhere for a given seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double uniform() { return (static_cast<double>(engine_() >> 11) + 0.5) * 0x1p-53; }
  double normal() {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    return r * std::cos(2.0 * std::numbers::pi * uniform());
  }
  int64_t poisson(double mean) {
    if (mean <= 0.0) return 0;
    if (mean < 30.0) {
      const double limit = std::exp(-mean);
      int64_t k = 0;
      for (double p = uniform(); p > limit; p *= uniform()) ++k;
      return k;
    }
    return std::max<int64_t>(0, std::llround(mean + std::sqrt(mean) * normal()));
  }
  uint64_t below(uint64_t n) { return static_cast<uint64_t>(uniform() * static_cast<double>(n)) % n; }

 private:
  std::mt19937_64 engine_;
};

// Top-k routing picks k distinct experts per token, so an expert's share of
// tokens is at most 1: scale weights to sum k, capping at 1 and handing the
// excess to the rest.
void inclusion_probabilities(const std::vector<double>& weight, int32_t k, std::vector<double>& q) {
  const size_t n = weight.size();
  std::vector<bool> capped(n, false);
  double budget = k;
  for (size_t round = 0; round < n; ++round) {
    double free_weight = 0.0;
    for (size_t e = 0; e < n; ++e) {
      if (!capped[e]) free_weight += weight[e];
    }
    bool changed = false;
    for (size_t e = 0; e < n; ++e) {
      if (capped[e]) continue;
      q[e] = free_weight > 0.0 ? budget * weight[e] / free_weight : 0.0;
      if (q[e] > 1.0) {
        capped[e] = true;
        q[e] = 1.0;
        budget -= 1.0;
        changed = true;
      }
    }
    if (!changed) return;
  }
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

void accumulate_lb(LbFigures& f, double interval_lb, double weight) {
  f.interval += interval_lb * weight;
  f.interval_worst = std::max(f.interval_worst, interval_lb);
}

void normalize(LbFigures& f, double steps) {
  if (steps <= 0.0) return;
  f.interval /= steps;
  f.step /= steps;
}

}  // namespace

std::span<const int64_t> RoutingTrace::step(int64_t s) const {
  DI_CHECK(s >= 0 && s < num_steps(), "routing trace: step {} out of range (trace has {} steps)", s, num_steps());
  return {counts.data() + static_cast<size_t>(s) * num_experts, static_cast<size_t>(num_experts)};
}

RoutingTrace read_routing_trace(const std::string& path) {
  std::ifstream in(path);
  DI_CHECK(in.good(), "cannot read routing trace '{}'", path);
  RoutingTrace trace;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::string_view rest = trim(line);
    if (rest.empty() || rest.front() == '#') continue;
    int32_t fields = 0;
    while (true) {
      const size_t comma = rest.find(',');
      const std::string_view field = trim(rest.substr(0, comma));
      int64_t value = -1;
      const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
      DI_CHECK(ec == std::errc() && end == field.data() + field.size() && !field.empty(),
               "{}:{}: field {} '{}' is not an integer", path, line_no, fields + 1, field);
      DI_CHECK(value >= 0 && value <= kMaxTraceCount, "{}:{}: count {} out of range (0..{})", path, line_no, value,
               kMaxTraceCount);
      DI_CHECK(trace.counts.size() < kMaxTraceCounts, "{}: trace has more than {} counts", path, kMaxTraceCounts);
      DI_CHECK(fields < kMaxTraceExperts, "{}:{}: more than {} experts", path, line_no, kMaxTraceExperts);
      trace.counts.push_back(value);
      ++fields;
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
    if (trace.num_experts == 0) trace.num_experts = fields;
    DI_CHECK(fields == trace.num_experts, "{}:{}: {} counts, earlier lines have {}", path, line_no, fields,
             trace.num_experts);
  }
  DI_CHECK(trace.num_experts > 0, "routing trace '{}' has no steps", path);
  return trace;
}

void write_routing_trace(const RoutingTrace& trace, const std::string& path) {
  std::ofstream out(path);
  DI_CHECK(out.good(), "cannot write routing trace '{}'", path);
  out << "# deepinfer routing trace: one step per line, tokens per expert (" << trace.num_experts << " experts)\n";
  for (int64_t s = 0; s < trace.num_steps(); ++s) {
    std::span<const int64_t> row = trace.step(s);
    for (size_t e = 0; e < row.size(); ++e) out << (e ? "," : "") << row[e];
    out << '\n';
  }
  DI_CHECK(out.good(), "failed writing routing trace '{}'", path);
}

void SyntheticTraceOptions::validate() const {
  DI_CHECK(num_experts >= 1 && num_experts <= kMaxTraceExperts, "synthetic trace: {} experts", num_experts);
  DI_CHECK(top_k >= 1 && top_k <= num_experts, "synthetic trace: top-k {} with {} experts", top_k, num_experts);
  DI_CHECK(tokens_per_step >= 1, "synthetic trace: tokens per step must be >= 1");
  DI_CHECK(num_steps >= 1 && static_cast<size_t>(num_steps) * num_experts <= kMaxTraceCounts,
           "synthetic trace: {} steps x {} experts is out of range", num_steps, num_experts);
  DI_CHECK(zipf_exponent >= 0.0 && zipf_exponent <= 4.0, "synthetic trace: zipf exponent {} (valid 0..4)",
           zipf_exponent);
  DI_CHECK(drift_std >= 0.0 && drift_std <= 4.0 && drift_steps >= 1.0, "synthetic trace: bad drift settings");
  DI_CHECK(step_noise >= 0.0 && step_noise <= 4.0, "synthetic trace: step noise {} (valid 0..4)", step_noise);
  DI_CHECK(burst_rate >= 0.0 && burst_rate <= 1.0 && burst_factor > 0.0 && burst_factor <= 1e3 && burst_steps >= 1,
           "synthetic trace: bad burst settings");
}

RoutingTrace synthetic_trace(const SyntheticTraceOptions& o) {
  o.validate();
  Rng rng(o.seed);
  const int32_t n = o.num_experts;
  // Popularity rank -> expert id: hot experts land anywhere in the id space.
  std::vector<int32_t> expert_of_rank(n);
  for (int32_t i = 0; i < n; ++i) expert_of_rank[i] = i;
  for (int32_t i = n - 1; i > 0; --i) std::swap(expert_of_rank[i], expert_of_rank[rng.below(i + 1)]);
  std::vector<double> base(n);
  for (int32_t i = 0; i < n; ++i) base[expert_of_rank[i]] = std::pow(static_cast<double>(i + 1), -o.zipf_exponent);

  const double keep = std::exp(-1.0 / o.drift_steps);
  const double innovation = o.drift_std * std::sqrt(1.0 - keep * keep);
  std::vector<double> drift(n);
  for (double& d : drift) d = o.drift_std * rng.normal();
  std::vector<int64_t> burst_end(n, -1);

  RoutingTrace trace;
  trace.num_experts = n;
  trace.counts.resize(static_cast<size_t>(o.num_steps) * n);
  std::vector<double> weight(n), q(n);
  const double noise_bias = 0.5 * o.step_noise * o.step_noise;
  for (int64_t s = 0; s < o.num_steps; ++s) {
    if (rng.uniform() < o.burst_rate) burst_end[rng.below(n)] = s + o.burst_steps;
    for (int32_t e = 0; e < n; ++e) {
      drift[e] = keep * drift[e] + innovation * rng.normal();
      weight[e] = base[e] * std::exp(drift[e]) * (s < burst_end[e] ? o.burst_factor : 1.0);
    }
    inclusion_probabilities(weight, o.top_k, q);
    int64_t* row = trace.counts.data() + static_cast<size_t>(s) * n;
    for (int32_t e = 0; e < n; ++e) {
      const double mean = o.tokens_per_step * q[e] * std::exp(o.step_noise * rng.normal() - noise_bias);
      row[e] = std::min<int64_t>(o.tokens_per_step, rng.poisson(mean));
    }
  }
  return trace;
}

double SimulationResult::fraction_of_perfect(double before, double after, double perfect) {
  const double room = before - perfect;
  if (room <= 1e-12) return 1.0;
  return (before - after) / room;
}

SimulationResult simulate_eplb(const RoutingTrace& trace, const SimulationOptions& options) {
  DI_CHECK(trace.num_experts > 0 && trace.counts.size() == static_cast<size_t>(trace.num_steps()) * trace.num_experts,
           "routing trace is empty or malformed");
  DI_CHECK(options.ranks_per_node >= 0, "EPLB simulation: ranks per node must be >= 0");
  EplbConfig config;
  config.num_ranks = options.num_ranks;
  config.redundant_slots_per_rank = options.schedule.redundant_slots_per_rank;
  config.num_groups = options.num_groups;
  if (options.ranks_per_node > 0) {
    DI_CHECK(options.num_ranks % options.ranks_per_node == 0, "EPLB simulation: {} ranks are not whole nodes of {}",
             options.num_ranks, options.ranks_per_node);
    config.num_nodes = options.num_ranks / options.ranks_per_node;
  }
  const ExpertPlacement contiguous = contiguous_placement(trace.num_experts, options.num_ranks);
  ExpertLoadStats stats(trace.num_experts, options.schedule);

  SimulationResult result;
  result.num_ranks = options.num_ranks;
  const int64_t steps = trace.num_steps();
  std::vector<double> row(trace.num_experts), future(trace.num_experts);
  for (int64_t s = 0; s < steps; ++s) {
    if (!stats.record_step(trace.step(s))) continue;
    const int64_t begin = s + 1;
    const int64_t end = std::min(steps, begin + options.schedule.interval_steps);
    if (begin >= end) break;
    const std::vector<double> window = stats.window_load();
    const ExpertPlacement policy = place_experts(window, config);
    const ExpertPlacement deepseek = deepseek_eplb_placement(window, config);
    std::fill(future.begin(), future.end(), 0.0);
    for (int64_t t = begin; t < end; ++t) {
      std::span<const int64_t> counts = trace.step(t);
      for (int32_t e = 0; e < trace.num_experts; ++e) future[e] += static_cast<double>(counts[e]);
    }
    const ExpertPlacement offline = place_experts(future, config);
    const double weight = static_cast<double>(end - begin);
    accumulate_lb(result.contiguous, moe_lb(future, contiguous), weight);
    accumulate_lb(result.policy, moe_lb(future, policy), weight);
    accumulate_lb(result.deepseek, moe_lb(future, deepseek), weight);
    accumulate_lb(result.offline, moe_lb(future, offline), weight);
    for (int64_t t = begin; t < end; ++t) {
      std::span<const int64_t> counts = trace.step(t);
      std::copy(counts.begin(), counts.end(), row.begin());
      result.contiguous.step += moe_lb(row, contiguous);
      result.policy.step += moe_lb(row, policy);
      result.deepseek.step += moe_lb(row, deepseek);
      result.offline.step += moe_lb(row, offline);
    }
    ++result.replacements;
    result.evaluated_steps += end - begin;
  }
  DI_CHECK(result.replacements > 0,
           "EPLB simulation: trace of {} steps is too short for a re-placement every {} steps and an evaluation "
           "after it",
           steps, options.schedule.interval_steps);
  const double evaluated = static_cast<double>(result.evaluated_steps);
  for (LbFigures* f : {&result.contiguous, &result.policy, &result.deepseek, &result.offline}) normalize(*f, evaluated);
  return result;
}

}  // namespace deepinfer::moe
