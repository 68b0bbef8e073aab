// The KV tiers' counters and gauges on /metrics (with --kv-offloading-size,
// --kv-cache-dir or --kv-transport shared): hits, bytes, evictions per tier,
// disk reads, loads from other engines' shared pools.
#pragma once

namespace deepinfer {
struct EngineStats;
}

namespace deepinfer::server {

class MetricsRegistry;

void render_kv_tier_metrics(MetricsRegistry& metrics, const EngineStats& engine);
// The serving side of the cross-node KV transport (--kv-transport ucx, prefill role).
void render_kv_export_metrics(MetricsRegistry& metrics, const EngineStats& engine);

}  // namespace deepinfer::server
