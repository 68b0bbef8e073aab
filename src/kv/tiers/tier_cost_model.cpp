#include "kv/tiers/tier_cost_model.h"

#include <algorithm>

namespace deepinfer {

void TierCostModel::set_compute(int64_t tokens, double ms_at_zero, int64_t context, double ms_at_context) {
  if (tokens <= 0 || ms_at_zero <= 0.0) return;
  const auto n = static_cast<double>(tokens);
  std::lock_guard lock(mutex_);
  // Per token: t(c) = c0 + c1 c at mean context c (n / 2, then context + n / 2).
  e_.compute_ms_per_token_ctx =
      context > 0 && ms_at_context > ms_at_zero ? (ms_at_context - ms_at_zero) / n / static_cast<double>(context) : 0.0;
  e_.compute_ms_per_token = std::max(ms_at_zero / n - e_.compute_ms_per_token_ctx * n / 2.0, 1e-9);
}

void TierCostModel::record_transfer(KvTierKind tier, int64_t bytes, double ms) {
  if (bytes <= 0 || ms <= 0.0) return;
  const double gb_per_s = static_cast<double>(bytes) / (ms * 1e6);
  std::lock_guard lock(mutex_);
  double& bw = bandwidth(tier);
  bw = blend(bw, gb_per_s);
}

double& TierCostModel::bandwidth(KvTierKind tier) {
  switch (tier) {
    case KvTierKind::Host:
      return e_.host_gb_per_s;
    case KvTierKind::Disk:
      return e_.disk_gb_per_s;
    case KvTierKind::Network:
      break;
  }
  return e_.network_gb_per_s;
}

double TierCostModel::recompute_ms_locked(int64_t begin, int64_t end) const {
  const auto a = static_cast<double>(begin), b = static_cast<double>(end);
  return e_.compute_ms_per_token * (b - a) + e_.compute_ms_per_token_ctx * (b * b - a * a) / 2.0;
}

double TierCostModel::recompute_ms(int64_t begin, int64_t end) const {
  std::lock_guard lock(mutex_);
  return recompute_ms_locked(begin, end);
}

bool TierCostModel::worth_loading(KvTierKind tier, int32_t from, int32_t to) {
  if (to <= from) return false;
  std::lock_guard lock(mutex_);
  const double bw = bandwidth(tier);
  if (bw <= 0.0 || e_.compute_ms_per_token <= 0.0) return true;
  const double load_ms = static_cast<double>(to - from) * static_cast<double>(bytes_per_block_) / (bw * 1e6);
  const double recompute = recompute_ms_locked(int64_t{from} * block_size_, int64_t{to} * block_size_);
  int& declined = declined_[static_cast<int>(tier)];
  if (load_ms < recompute) {
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
