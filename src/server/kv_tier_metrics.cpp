#include "server/kv_tier_metrics.h"

#include "engine/engine.h"
#include "server/metrics.h"

namespace deepinfer::server {

void render_kv_tier_metrics(MetricsRegistry& m, const EngineStats& e) {
  // Only with --kv-offloading-size, --kv-cache-dir or --kv-transport shared.
  const KvTierStats& t = e.tiers;
  // One series per tier, host then disk.
  auto per_tier = [&](const char* name, const char* help, int64_t host, int64_t disk) {
    m.counter(name, help, {{"tier", "host"}}).set(static_cast<double>(host));
    m.counter(name, help, {{"tier", "disk"}}).set(static_cast<double>(disk));
  };
  m.counter("deepinfer:kv_tier_hit_tokens_total", "Prompt tokens loaded from the KV tiers instead of computed.")
      .set(static_cast<double>(e.tier_hit_tokens));
  per_tier("deepinfer:kv_tier_hits_total", "Blocks found in a KV tier.", t.host.hits, t.disk.hits);
  per_tier("deepinfer:kv_tier_read_bytes_total", "Bytes loaded from a KV tier.", t.loaded_bytes, t.disk.bytes_read);
  per_tier("deepinfer:kv_tier_stored_blocks_total", "Blocks stored in a KV tier.", t.host.stored, t.disk.stored);
  per_tier("deepinfer:kv_tier_evictions_total", "Blocks evicted from a KV tier for room.", t.host.evictions,
           t.disk.evictions);
  per_tier("deepinfer:kv_tier_expirations_total", "Blocks dropped past their time to live.", t.host.expirations,
           t.disk.expirations);
  m.counter("deepinfer:kv_tier_written_bytes_total", "Bytes written to a KV tier.", {{"tier", "disk"}})
      .set(static_cast<double>(t.disk.bytes_written));
  m.counter("deepinfer:kv_tier_rejected_blocks_total", "Block files removed as damaged or not matching.")
      .set(static_cast<double>(t.disk.rejected));
  m.counter("deepinfer:kv_tier_write_errors_total", "Block writes that failed (full disk, vanished directory).")
      .set(static_cast<double>(t.disk.write_errors));
  m.gauge("deepinfer:kv_tier_host_blocks", "Blocks the host KV tier holds now.")
      .set(static_cast<double>(t.host.blocks));
  m.gauge("deepinfer:kv_tier_disk_blocks", "Blocks the disk KV tier holds now.")
      .set(static_cast<double>(t.disk.files));
  m.counter("deepinfer:kv_tier_onload_seconds_total", "Time spent reading prefixes from disk into host memory.")
      .set(t.prefetch_ms_total / 1e3);
  m.counter("deepinfer:kv_tier_onloads_total", "Prefixes read from disk into host memory.")
      .set(static_cast<double>(t.prefetches));
  m.gauge("deepinfer:kv_tier_onload_seconds_max", "Longest read of one prefix from disk.").set(t.prefetch_ms_max / 1e3);
  m.counter("deepinfer:kv_peer_loaded_blocks_total",
            "Blocks loaded from other engines' shared pools (--kv-transport shared).")
      .set(static_cast<double>(t.peer_loaded_blocks));
  m.gauge("deepinfer:kv_peer_pools", "Other engines' shared KV pools this engine has mapped.")
      .set(static_cast<double>(t.peers));
  m.counter("deepinfer:kv_load_timed_bytes_total", "Bytes of the sampled loads into device pages (timed on the device).")
      .set(static_cast<double>(t.timed_load_bytes));
  m.counter("deepinfer:kv_load_timed_seconds_total", "Device time of the sampled loads into device pages.")
      .set(t.timed_load_ms / 1e3);
  if (t.remote_enabled) {  // --kv-transport ucx, decode role
    m.counter("deepinfer:kv_remote_fetches_total", "Prompt prefixes fetched from prefill engines on other nodes.")
        .set(static_cast<double>(t.remote.fetches));
    m.counter("deepinfer:kv_remote_fetch_failures_total",
              "Fetches that brought nothing (refused, timed out, peer lost): those prompts were recomputed.")
        .set(static_cast<double>(t.remote.failed));
    m.counter("deepinfer:kv_remote_fetched_blocks_total", "KV blocks fetched from other nodes.")
        .set(static_cast<double>(t.remote.blocks));
    m.counter("deepinfer:kv_remote_fetched_bytes_total", "Bytes of KV fetched from other nodes.")
        .set(static_cast<double>(t.remote.bytes));
    m.counter("deepinfer:kv_remote_fetch_seconds_total", "Wall time of the fetches that brought blocks.")
        .set(t.remote.seconds);
    m.counter("deepinfer:kv_remote_refused_sources_total",
              "Requests naming a KV source that is malformed or not in --kv-transport-peers.")
        .set(static_cast<double>(t.remote_refused_sources));
    m.gauge("deepinfer:kv_remote_connections", "Prefill engines this engine holds a transport connection to.")
        .set(static_cast<double>(t.remote.connections));
  }
}

void render_kv_export_metrics(MetricsRegistry& m, const EngineStats& e) {
  // --kv-transport ucx, prefill role.
  const KvExportServerStats& x = e.kv_export;
  m.counter("deepinfer:kv_export_requests_total", "Fetch requests from other nodes' decode engines answered.")
      .set(static_cast<double>(x.requests));
  m.counter("deepinfer:kv_export_refused_total", "Fetch requests refused (malformed, another model or KV layout).")
      .set(static_cast<double>(x.refused));
  m.counter("deepinfer:kv_export_sent_blocks_total", "KV blocks sent to other nodes' decode engines.")
      .set(static_cast<double>(x.blocks_sent));
  m.counter("deepinfer:kv_export_sent_bytes_total", "Bytes of KV sent to other nodes' decode engines.")
      .set(static_cast<double>(x.bytes_sent));
  m.gauge("deepinfer:kv_export_connections", "Decode engines connected to this engine's KV transport.")
      .set(static_cast<double>(x.connections));
}

}  // namespace deepinfer::server
