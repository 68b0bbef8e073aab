#include "kv/tiers/tier_cost_model.h"

namespace deepinfer {

void TierCostModel::record_compute(int64_t tokens, double device_ms) {
  if (tokens < kMinComputeTokens || device_ms <= 0.0) return;
  std::lock_guard lock(mutex_);
  e_.compute_ms_per_token = blend(e_.compute_ms_per_token, device_ms / static_cast<double>(tokens));
}

void TierCostModel::record_transfer(KvTierKind tier, int64_t bytes, double ms) {
  if (bytes <= 0 || ms <= 0.0) return;
  const double gb_per_s = static_cast<double>(bytes) / (ms * 1e6);
  std::lock_guard lock(mutex_);
  double& bw = tier == KvTierKind::Host ? e_.host_gb_per_s : e_.disk_gb_per_s;
  bw = blend(bw, gb_per_s);
}

bool TierCostModel::worth_loading(KvTierKind tier) {
  std::lock_guard lock(mutex_);
  const double bw = tier == KvTierKind::Host ? e_.host_gb_per_s : e_.disk_gb_per_s;
  if (bw <= 0.0 || e_.compute_ms_per_token <= 0.0) return true;
  const double load_ms = static_cast<double>(block_bytes_) / (bw * 1e6);
  const double recompute_ms = e_.compute_ms_per_token * block_size_;
  int& declined = declined_[static_cast<int>(tier)];
  if (load_ms < recompute_ms) {
    declined = 0;
    return true;
  }
  if (++declined >= kProbeInterval) {
    declined = 0;
    return true;
  }
  return false;
}

TierCostEstimate TierCostModel::estimate() const {
  std::lock_guard lock(mutex_);
  return e_;
}

}  // namespace deepinfer
