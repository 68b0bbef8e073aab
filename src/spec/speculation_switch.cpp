#include "spec/speculation_switch.h"

#include <algorithm>
#include <bit>

#include "core/error.h"

namespace deepinfer::spec {

SpeculationSwitch::SpeculationSwitch(SwitchConfig config) : config_(config) {
  DI_CHECK(config.window_steps > 0 && config.plain_window_steps > 0 && config.min_explore > 0 &&
               config.max_explore >= config.min_explore && config.alpha > 0.0 && config.alpha <= 1.0 &&
               config.plain_margin >= 0.0,
           "speculation switch: invalid configuration");
}

int SpeculationSwitch::bucket_of(int32_t running) {
  const auto n = static_cast<uint32_t>(std::max(running, 1));
  return std::min(kBuckets - 1, static_cast<int>(std::bit_width(n)) - 1);
}

bool SpeculationSwitch::speculation_wins(const Bucket& b) const {
  return b.rate[0] <= b.rate[1] * (1.0 + config_.plain_margin);
}

const SpeculationSwitch::Bucket* SpeculationSwitch::larger_measured(int bucket) const {
  for (int i = bucket + 1; i < kBuckets; ++i) {
    const Bucket& b = buckets_[i];
    if (b.rate[0] > 0.0 && b.rate[1] > 0.0 && !b.plain_estimated) return &b;
  }
  return nullptr;
}

void SpeculationSwitch::open_window(int64_t output_tokens, int64_t prompt_tokens, double now_s, int32_t running) {
  window_open_ = true;
  window_one_time_s_ = 0.0;
  steps_in_window_ = 0;
  window_tokens_ = output_tokens;
  window_prompt_tokens_ = prompt_tokens;
  window_start_s_ = now_s;
  window_bucket_ = bucket_of(running);
  Bucket& b = buckets_[window_bucket_];
  if (b.explore == 0) b.explore = config_.min_explore;
  // A mode this batch size has not measured goes first (speculation before
  // plain), unless a larger batch found speculation winning (see the header).
  exploring_ = false;
  if (b.rate[1] > 0.0 && b.rate[0] <= 0.0) {
    const Bucket* larger = larger_measured(window_bucket_);
    if (larger != nullptr && speculation_wins(*larger)) {
      b.rate[0] = b.rate[1] * larger->rate[0] / larger->rate[1];
      b.plain_estimated = true;
    }
  }
  if (b.rate[1] <= 0.0) {
    speculating_ = true;
  } else if (b.rate[0] <= 0.0) {
    speculating_ = false;
  } else {
    const bool better = speculation_wins(b);
    if (++b.since_explore >= b.explore) {
      b.since_explore = 0;
      exploring_ = true;
      speculating_ = !better;
    } else {
      speculating_ = better;
    }
  }
  ++windows_;
  if (speculating_) ++speculative_windows_;
}

void SpeculationSwitch::end_window(int64_t output_tokens, int64_t prompt_tokens, double now_s) {
  window_open_ = false;
  const int64_t produced = output_tokens - window_tokens_;
  const double seconds = now_s - window_start_s_ - window_one_time_s_;
  // Nothing to compare: idle, or mostly prompt processing.
  if (produced <= 0 || seconds <= 0.0 || prompt_tokens - window_prompt_tokens_ > kPrefillRatio * produced) return;
  Bucket& b = buckets_[window_bucket_];
  double& mean = b.rate[speculating_ ? 1 : 0];
  const double rate = static_cast<double>(produced) / seconds;
  // A measured plain window replaces an estimate rather than blending with it.
  const bool replaces = !speculating_ && b.plain_estimated;
  if (!speculating_) b.plain_estimated = false;
  mean = mean <= 0.0 || replaces ? rate : config_.alpha * rate + (1.0 - config_.alpha) * mean;
  if (!exploring_ || b.rate[0] <= 0.0 || b.rate[1] <= 0.0) return;
  // The re-checked mode lost again: wait longer before the next check; it
  // won: check often again.
  const bool explored_wins = speculating_ == speculation_wins(b);
  b.explore = explored_wins ? config_.min_explore : std::min(config_.max_explore, b.explore * 2);
}

void SpeculationSwitch::record_step(int64_t output_tokens, int64_t prompt_tokens, double now_s, int32_t running,
                                    double one_time_s) {
  if (!window_open_) {
    open_window(output_tokens, prompt_tokens, now_s, running);
    return;
  }
  if (one_time_s > 0.0) window_one_time_s_ += one_time_s;
  if (++steps_in_window_ < (speculating_ ? config_.window_steps : config_.plain_window_steps)) return;
  end_window(output_tokens, prompt_tokens, now_s);
  open_window(output_tokens, prompt_tokens, now_s, running);
}

}  // namespace deepinfer::spec
