// KvTiers' cross-node import (kv/tiers/kv_tiers.h): a decode engine fetches
// a new request's prefix from the prefill engine the request names, over
// the KV transport (kv/transport), into host slots it reserves; the blocks
// are published when they have landed, and loaded to the device like any
// host-tier hit when the request is scheduled.
#include <algorithm>

#include "core/error.h"
#include "core/logging.h"
#include "kv/tiers/kv_tiers.h"
#include "kv/tiers/tier_block_identity.h"

namespace deepinfer {

void KvTiers::set_remote_fetcher(std::unique_ptr<RemoteKvFetcher> fetcher, std::vector<std::string> allowed_hosts) {
  remote_ = std::move(fetcher);
  remote_allowed_hosts_ = std::move(allowed_hosts);
}

bool KvTiers::prefetch_remote(uint64_t request, const KvTierQuery& q, int32_t from_block, std::string_view source) {
  if (!remote_) return false;
  KvSourceAddress address;
  try {
    address = parse_kv_source_address(source);
  } catch (const Error& e) {
    ++remote_refused_sources_;
    log_warn("kv tiers: ignoring the request's KV source: {}", e.what());
    return false;
  }
  if (std::find(remote_allowed_hosts_.begin(), remote_allowed_hosts_.end(), address.host) ==
      remote_allowed_hosts_.end()) {
    ++remote_refused_sources_;
    log_warn("kv tiers: ignoring KV source host '{}': not in --kv-transport-peers", address.host);
    return false;
  }
  const auto total = static_cast<int32_t>(q.tokens.size());
  const int32_t usable = std::min<int32_t>(static_cast<int32_t>(q.hashes.size()), (total - 1) / q.block_size);
  if (usable <= from_block || !cost_.worth_loading(KvTierKind::Network, from_block, usable)) return false;
  const auto bs = static_cast<size_t>(q.block_size);
  KvFetchRequest fetch;
  fetch.block_bytes = host_->block_bytes();
  fetch.fingerprint = options_.fingerprint;
  fetch.salt.assign(q.salt);
  std::vector<int32_t> slots;
  std::vector<std::span<std::byte>> dests;
  // Every block of [from_block, usable) the host tier lacks, in prompt
  // order, each in a slot reserved (hidden from lookups) until it lands.
  bool full = false;
  for (int32_t i = from_block; i < usable && !full; ++i) {
    for (const int32_t g : q.groups) {
      const auto tokens = q.tokens.subspan(static_cast<size_t>(i) * bs, bs);
      const KvBlockIdentity id = block_identity(q.hashes[static_cast<size_t>(i)], parent_hash(q, i), i, g, q.salt, tokens);
      if (host_->contains(id.key)) continue;
      const std::optional<int32_t> slot = host_->reserve(id, 0);
      if (!slot) {
        full = true;  // every host slot is pinned: fetch what fits
        break;
      }
      slots.push_back(*slot);
      dests.push_back(host_->payload(*slot));
      fetch.blocks.push_back({id.key, id.parent_key, id.first, std::vector<int32_t>(tokens.begin(), tokens.end())});
    }
  }
  if (slots.empty()) return false;
  {
    std::lock_guard lock(mutex_);
    prefetching_[request] = false;
  }
  const auto start = std::chrono::steady_clock::now();
  remote_->fetch(address, std::move(fetch), std::move(dests),
                 [this, request, slots, start](size_t received) { finish_remote_fetch(request, slots, received, start); });
  return true;
}

void KvTiers::finish_remote_fetch(uint64_t request, const std::vector<int32_t>& slots, size_t received,
                                  std::chrono::steady_clock::time_point start) {
  for (size_t i = 0; i < slots.size(); ++i) {
    if (i < received) {
      host_->publish(slots[i]);
    } else {
      host_->abandon(slots[i]);
    }
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (received > 0) {
    cost_.record_transfer(KvTierKind::Network, static_cast<int64_t>(received * host_->block_bytes()), ms);
  }
  std::lock_guard lock(mutex_);
  prefetching_[request] = true;
}

}  // namespace deepinfer
