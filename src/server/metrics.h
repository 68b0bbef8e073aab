// Metrics in the Prometheus text exposition format (version 0.0.4), written
// here because no Prometheus client library is packaged for Debian 12.
// Counters, gauges and histograms, each optionally labelled; every series also
// carries the registry's constant labels (model_name). Thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace deepinfer::server {

class Counter {
 public:
  void inc(double v = 1.0);
  // For totals mirrored from the engine's own monotonic counters.
  void set(double v);
  double value() const;

 private:
  mutable std::mutex mutex_;
  double value_ = 0;
};

class Gauge {
 public:
  void set(double v);
  double value() const;

 private:
  mutable std::mutex mutex_;
  double value_ = 0;
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // Replaces the contents with counts kept elsewhere: per bucket (not
  // cumulative, the last one +Inf) and their sum.
  void assign(std::vector<uint64_t> bucket_counts, double sum);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class MetricsRegistry {
 public:
  // const_labels: e.g. {{"model_name", "x"}}, added to every series.
  explicit MetricsRegistry(std::vector<std::pair<std::string, std::string>> const_labels = {});

  // labels: extra label pairs for this series. The same name and labels give the same object.
  Counter& counter(const std::string& name, const std::string& help,
                   const std::vector<std::pair<std::string, std::string>>& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help);
  Histogram& histogram(const std::string& name, const std::string& help, std::vector<double> bounds);

  std::string render() const;

 private:
  enum class Type : uint8_t { Counter, Gauge, Histogram };
  struct Family {
    Type type;
    std::string help;
    std::map<std::string, std::unique_ptr<Counter>> counters;  // by rendered label set
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  Family& family(const std::string& name, Type type, const std::string& help);

  mutable std::mutex mutex_;
  std::string const_labels_;  // rendered: k="v",k2="v2"
  std::map<std::string, Family> families_;
};

// Escapes a label value for the exposition format.
std::string escape_label_value(const std::string& v);

}  // namespace deepinfer::server
