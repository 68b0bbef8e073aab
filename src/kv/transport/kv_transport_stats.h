// Counters of the cross-node KV transport (kv/transport), for /metrics:
// the fetching side's (RemoteKvFetcher) and the serving side's (UcxKvServer).
#pragma once

#include <cstdint>

namespace deepinfer {

struct RemoteKvFetchStats {
  int64_t fetches = 0;       // fetches completed (any outcome)
  int64_t failed = 0;        // of them: refused, timed out, or the peer lost
  int64_t blocks = 0;        // blocks received
  int64_t bytes = 0;
  double seconds = 0.0;      // summed wall time of fetches that received blocks
  int64_t connections = 0;   // endpoints open now
};

struct KvExportServerStats {
  int64_t requests = 0;     // fetch requests answered
  int64_t refused = 0;      // of them: malformed, or another model/layout
  int64_t blocks_sent = 0;
  int64_t bytes_sent = 0;
  int64_t connections = 0;  // endpoints open now
};

}  // namespace deepinfer
