#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace deepinfer::server {

void Counter::inc(double v) {
  std::lock_guard lock(mutex_);
  value_ += v;
}
void Counter::set(double v) {
  std::lock_guard lock(mutex_);
  value_ = v;
}
double Counter::value() const {
  std::lock_guard lock(mutex_);
  return value_;
}
void Gauge::set(double v) {
  std::lock_guard lock(mutex_);
  value_ = v;
}
double Gauge::value() const {
  std::lock_guard lock(mutex_);
  return value_;
}

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  DI_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()), "histogram bounds must be sorted");
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double v) {
  if (!std::isfinite(v)) return;
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  std::lock_guard lock(mutex_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::assign(std::vector<uint64_t> bucket_counts, double sum) {
  DI_CHECK(bucket_counts.size() == counts_.size(), "histogram: {} bucket counts for {} buckets", bucket_counts.size(),
           counts_.size());
  std::lock_guard lock(mutex_);
  counts_ = std::move(bucket_counts);
  count_ = 0;
  for (uint64_t c : counts_) count_ += c;
  sum_ = sum;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard lock(mutex_);
  Snapshot s;
  s.bounds = bounds_;
  uint64_t acc = 0;
  for (uint64_t c : counts_) {
    acc += c;
    s.cumulative.push_back(acc);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::string escape_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

namespace {

std::string render_labels(const std::vector<std::pair<std::string, std::string>>& labels) {
  std::string out;
  for (const auto& [k, v] : labels) {
    if (!out.empty()) out += ',';
    out += k + "=\"" + escape_label_value(v) + "\"";
  }
  return out;
}

std::string join_labels(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "," + b;
}

std::string series(const std::string& name, const std::string& labels) {
  return labels.empty() ? name : name + "{" + labels + "}";
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  return fmt::format("{}", v);
}

}  // namespace

MetricsRegistry::MetricsRegistry(std::vector<std::pair<std::string, std::string>> const_labels)
    : const_labels_(render_labels(const_labels)) {}

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, Type type, const std::string& help) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    it->second.help = help;
  }
  DI_CHECK(it->second.type == type, "metric {} registered with two types", name);
  return it->second;
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help,
                                  const std::vector<std::pair<std::string, std::string>>& labels) {
  std::lock_guard lock(mutex_);
  Family& f = family(name, Type::Counter, help);
  auto& slot = f.counters[render_labels(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help) {
  std::lock_guard lock(mutex_);
  Family& f = family(name, Type::Gauge, help);
  if (!f.gauge) f.gauge = std::make_unique<Gauge>();
  return *f.gauge;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help, std::vector<double> bounds) {
  std::lock_guard lock(mutex_);
  Family& f = family(name, Type::Histogram, help);
  if (!f.histogram) f.histogram = std::make_unique<Histogram>(std::move(bounds));
  return *f.histogram;
}

std::string MetricsRegistry::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [name, f] : families_) {
    const char* type = f.type == Type::Counter ? "counter" : f.type == Type::Gauge ? "gauge" : "histogram";
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, f.help, name, type);
    switch (f.type) {
      case Type::Counter:
        for (const auto& [labels, c] : f.counters) {
          out += series(name, join_labels(const_labels_, labels)) + " " + number(c->value()) + "\n";
        }
        break;
      case Type::Gauge:
        out += series(name, const_labels_) + " " + number(f.gauge->value()) + "\n";
        break;
      case Type::Histogram: {
        const Histogram::Snapshot s = f.histogram->snapshot();
        for (size_t i = 0; i <= s.bounds.size(); ++i) {
          const std::string le = i < s.bounds.size() ? number(s.bounds[i]) : "+Inf";
          out += series(name + "_bucket", join_labels(const_labels_, "le=\"" + le + "\"")) + " " +
                 std::to_string(s.cumulative[i]) + "\n";
        }
        out += series(name + "_sum", const_labels_) + " " + number(s.sum) + "\n";
        out += series(name + "_count", const_labels_) + " " + std::to_string(s.count) + "\n";
        break;
      }
    }
  }
  return out;
}

}  // namespace deepinfer::server
