// TierCostModel: whether loading a prefix from a tier beats recomputing it.
//
// Both sides are measured: the engine reports each step's device time per
// computed token (prefill-sized steps only: a decode step's time per token
// says nothing about prefill), and each tier reports the bytes it moved and
// the time it took. Loading n blocks costs n * block_bytes / bandwidth;
// recomputing them costs at least n * block_size * time_per_token (attention
// over the prefix only adds to it), so a tier whose per-block load time
// exceeds that is skipped. Until both sides are measured the tier is tried.
// A tier judged slower is still tried every kProbeInterval-th time, so a
// stale estimate (a cold disk cache, a busy file system) can recover.
#pragma once

#include <cstdint>
#include <mutex>

namespace deepinfer {

enum class KvTierKind : uint8_t { Host = 0, Disk = 1 };

struct TierCostEstimate {
  double compute_ms_per_token = 0.0;  // 0 = not measured yet
  double host_gb_per_s = 0.0;
  double disk_gb_per_s = 0.0;
};

class TierCostModel {
 public:
  static constexpr int64_t kMinComputeTokens = 256;
  static constexpr int kProbeInterval = 16;

  TierCostModel(int64_t block_bytes, int32_t block_size) : block_bytes_(block_bytes), block_size_(block_size) {}

  void record_compute(int64_t tokens, double device_ms);
  void record_transfer(KvTierKind tier, int64_t bytes, double ms);
  // Whether to load from the tier now (counts the decision for probing).
  bool worth_loading(KvTierKind tier);
  TierCostEstimate estimate() const;

 private:
  static double blend(double old_value, double sample) { return old_value == 0.0 ? sample : 0.8 * old_value + 0.2 * sample; }

  int64_t block_bytes_;
  int32_t block_size_;
  mutable std::mutex mutex_;
  TierCostEstimate e_;
  int declined_[2] = {0, 0};
};

}  // namespace deepinfer
