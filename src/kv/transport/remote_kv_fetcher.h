// RemoteKvFetcher: how a decode engine's tiers read a prompt's KV blocks from
// the engine that computed them on another node (KvTiers::prefetch_remote).
// The one implementation is UcxKvClient (kv/transport/ucx_kv_client.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kv/transport/kv_transport_stats.h"
#include "kv/transport/kv_wire.h"

namespace deepinfer {

class RemoteKvFetcher {
 public:
  virtual ~RemoteKvFetcher() = default;
  // Asks `source` for request.blocks and writes what it answers into dests
  // (one per block, request.block_bytes each), which must stay valid until
  // done(n) has been called: exactly once, from any thread, with n the
  // number of leading blocks written in full (0 on any failure). The
  // request's fetch_id is assigned here.
  virtual void fetch(const KvSourceAddress& source, KvFetchRequest request, std::vector<std::span<std::byte>> dests,
                     std::function<void(size_t)> done) = 0;
  virtual RemoteKvFetchStats stats() const = 0;
};

}  // namespace deepinfer
