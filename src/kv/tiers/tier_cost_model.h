// TierCostModel: whether loading a prefix from a tier beats recomputing it.
//
// Both sides are measured. Recomputing: the engine times two prefill steps
// at start-up, one at context 0 and one after a long cached context, which
// gives a per-token cost that grows with the context (the attention part):
// t(c) = c0 + c1 * c per token at context c, so recomputing positions
// [a, b) costs c0 (b - a) + c1 (b^2 - a^2) / 2. Loading: n blocks cost
// n * bytes_per_block / bandwidth, the bandwidth of each tier measured (the
// host tier's round trip at start-up, the disk's reads and the network's
// fetches as they happen).
// Until both sides are known the tier is tried. A tier judged slower is
// still tried every kProbeInterval-th time, so a stale estimate (a cold disk
// cache, a busy file system) can recover.
#pragma once

#include <cstdint>
#include <mutex>

namespace deepinfer {

// Network: another engine's host tier over the KV transport (kv/transport).
enum class KvTierKind : uint8_t { Host = 0, Disk = 1, Network = 2 };

struct TierCostEstimate {
  double compute_ms_per_token = 0.0;      // c0; 0 = not measured yet
  double compute_ms_per_token_ctx = 0.0;  // c1: extra per token per token of context
  double host_gb_per_s = 0.0;
  double disk_gb_per_s = 0.0;
  double network_gb_per_s = 0.0;  // whole fetches, their round trips included
};

class TierCostModel {
 public:
  static constexpr int kProbeInterval = 16;

  // bytes_per_block: what loading one block index moves (every tier group).
  TierCostModel(int64_t bytes_per_block, int32_t block_size)
      : bytes_per_block_(bytes_per_block), block_size_(block_size) {}

  // Two timed prefill steps of `tokens` new tokens: after no context, and
  // after `context` cached tokens.
  void set_compute(int64_t tokens, double ms_at_zero, int64_t context, double ms_at_context);
  void record_transfer(KvTierKind tier, int64_t bytes, double ms);
  // Milliseconds to recompute positions [begin, end).
  double recompute_ms(int64_t begin, int64_t end) const;
  // Whether loading blocks [from, to) from the tier beats recomputing them
  // (counts the decision for probing).
  bool worth_loading(KvTierKind tier, int32_t from, int32_t to);
  TierCostEstimate estimate() const;

 private:
  static double blend(double old_value, double sample) { return old_value == 0.0 ? sample : 0.8 * old_value + 0.2 * sample; }
  double recompute_ms_locked(int64_t begin, int64_t end) const;

  int64_t bytes_per_block_;
  int32_t block_size_;
  mutable std::mutex mutex_;
  TierCostEstimate e_;
  double& bandwidth(KvTierKind tier);
  int declined_[3] = {0, 0, 0};
};

}  // namespace deepinfer
