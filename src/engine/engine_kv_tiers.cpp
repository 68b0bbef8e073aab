// The Engine's part in the KV tiers (kv/tiers/kv_tiers.h): timing the
// recompute side of their load-or-recompute decision at start-up, and
// starting the disk read (or the fetch from another node) of a new request's
// prefix (Engine::poll_kv_prefetches lets it go once read).
#include <algorithm>

#include "core/logging.h"
#include "engine/engine.h"
#include "kv/kv_cache_manager.h"
#include "kv/tiers/kv_tiers.h"

namespace deepinfer {

void Engine::calibrate_kv_tiers() {
  // The recompute side of the tiers' load-or-recompute decision, measured
  // before the first request: a prefill step after no context and one after
  // four times its length of context.
  const int32_t bs = parts_.config.block_size;
  // The steps' pages must fit in the cache (a small one on the CPU).
  const int64_t free_tokens =
      int64_t{parts_.kv_manager->pool().num_free()} * bs / parts_.kv_manager->layout().num_groups() - 2 * bs;
  const auto n = static_cast<int32_t>(std::min<int64_t>(
      {2048, parts_.config.max_num_batched_tokens, parts_.max_model_len - 1, free_tokens}));
  if (n < 64) {
    log_warn("kv tiers: the KV cache is too small to time a prefill step; loads are tried until measured");
    return;
  }
  const int32_t room = parts_.max_model_len - n;
  int32_t context = std::min(room - 1, 4 * n) / bs * bs;
  context = static_cast<int32_t>(std::min<int64_t>(context, (free_tokens - n) / bs * bs));
  // A GPU's first step of a shape pays for library warm-up: the second is timed.
  const int reps = parts_.backend->memory_info() ? 2 : 1;
  auto timed = [&](int32_t cached) {
    double secs = 0.0;
    for (int i = 0; i < reps; ++i) secs = time_step(1, n, cached, 1);
    return secs * 1e3;
  };
  const double ms0 = timed(0);
  const double ms1 = context > 0 ? timed(context) : 0.0;
  parts_.kv_tiers->set_compute_cost(n, ms0, context, ms1);
  log_info("kv tiers: recomputing costs {:.4f} ms per token at no context, {:.4f} after {} tokens ({}-token steps)",
           ms0 / n, ms1 / n, context, n);
}

void Engine::start_kv_prefetch(Request& r, std::string_view kv_source) {
  KvTiers* tiers = parts_.kv_tiers.get();
  const bool remote = !kv_source.empty() && tiers != nullptr && tiers->fetches_remote();
  if (tiers == nullptr || !(tiers->disk_enabled() || remote) || parts_.kv_manager->tier_groups().empty()) return;
  const int32_t bs = parts_.config.block_size;
  const std::vector<BlockHash> hashes = PrefixCache::compute_block_hashes(r.prompt_ids(), bs, r.cache_salt());
  const KvTierQuery query{hashes, r.prompt_ids(), r.cache_salt(), bs, parts_.kv_manager->tier_groups()};
  // Blocks on the device already need no read.
  const int32_t on_device = parts_.kv_manager->num_cached_blocks(hashes, r.prompt_ids(), r.cache_salt());
  // The engine the request names (a prefill engine on another node) first;
  // else the disk.
  const bool started = (remote && tiers->prefetch_remote(r.id(), query, on_device, kv_source)) ||
                       (tiers->disk_enabled() && tiers->prefetch(r.id(), query, on_device));
  if (started) {
    r.kv_loading = true;
    kv_loading_.push_back(r.id());
  }
}

}  // namespace deepinfer
