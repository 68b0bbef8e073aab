// KvTiers: the host-memory and disk tiers below the device KV pages, and the
// traffic between them (write-through: every block the prefix cache
// registers is copied down once).
//
//   device page --(copy stream, after the step that writes it)--> host slot
//   host slot   --(I/O thread)--> block file under --kv-cache-dir
//   block file  --(I/O thread, prefetch when a request arrives)--> host slot
//   host slot   --(copy on the op stream, before the step that reads it)--> device page
//
// Offloads run on a copy stream of their own, so they overlap the next
// steps' compute instead of delaying them: each batch waits for the ops
// enqueued before it (the step that writes its blocks), and the manager keeps
// the blocks out of the pool until the batch's event completes, so no later
// step can overwrite a page a copy still reads. About 20 ms of copies are in
// flight at most; the rest wait their turn (a bounded backlog; beyond it new
// blocks are not offloaded). Loads stay on the op stream:
// the step that reads the pages must wait for them anyway. A host slot is
// used (published, written to disk, or unpinned after a load) only once its
// copy is known complete.
// Disk reads happen on a reader thread (several files at once) while the
// engine keeps stepping: a request whose prefix is on disk waits (prefetch /
// prefetch_done) while the others run, then is admitted with its blocks in
// host memory. Writes have a thread of their own.
//
// Between engines (a prefill engine handing KV to a decode engine on the same
// node, `serve --kv-transport shared`): the exporting engine's tier below the
// device is a SharedKvPool (kv/tiers/shared_pool.h) other processes read; an
// importing engine attaches to such pools (attach_peer) and loads from them as
// from its own host tier, device to device where the pool is device memory.
//
// Across nodes (`serve --kv-transport ucx`): the exporting engine serves its
// host tier to others over UCX (kv/transport/ucx_kv_server.h, owned by the
// engine; set_export_source names it); an importing engine fetches a new
// request's prefix from the engine its request names (prefetch_remote) into
// its own host tier, as it reads one from disk, and loads it from there.
//
// A tier is used only where loading beats recomputing (tier_cost_model.h):
// the engine times prefill steps at start-up (set_compute_cost), the tiers
// measure their own bandwidth, and a tier that loses is skipped (re-probed
// now and then).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv/kv_tier_link.h"
#include "kv/tiers/kv_tier_followers.h"
#include "kv/tiers/disk_tier.h"
#include "kv/tiers/host_tier.h"
#include "kv/tiers/shared_pool.h"
#include "kv/tiers/tier_cost_model.h"
#include "kv/transport/remote_kv_fetcher.h"

namespace deepinfer {

class Backend;
class CopyStream;
class DeviceEvent;
class KvStorage;

struct KvTierOptions {
  uint64_t host_bytes = 0;  // --kv-offloading-size
  std::filesystem::path dir;  // --kv-cache-dir; empty = no disk tier
  uint64_t disk_bytes = uint64_t{64} << 30;  // --kv-cache-dir-size
  std::string fingerprint;  // model, weights, KV dtype and layout (see kv_cache_fingerprint)
  int64_t default_ttl_s = 0;  // blocks of requests without cache_ttl; 0 = never expire
  // Disk writes queued at most (each also holds a host slot, which bounds them too).
  size_t max_queued_writes = size_t{1} << 20;
  // Blocks one block index of a sequence stores in the tiers (the tier groups):
  // the bytes a hit of one block index loads, for the cost model.
  int32_t groups_per_block_index = 1;
  // Registered blocks waiting for the copy stream at most (beyond, not
  // offloaded): this many, or half the device's pages when that is more.
  size_t max_pending_offloads = 64;
  // Bytes of a SharedKvPool that replaces the host tier and that other
  // engines on the node read (0: a process-local host tier).
  uint64_t shared_pool_bytes = 0;
  // Whether attach_peer() may map other engines' pools.
  bool import_shared = false;
};

struct KvTierStats {
  HostKvTierStats host;
  DiskKvTierStats disk;
  bool disk_enabled = false;
  int64_t offloaded_blocks = 0;  // device -> host copies
  int64_t offload_skipped = 0;   // registered blocks not copied (host tier full of pinned slots)
  int64_t writes_dropped = 0;    // disk writes dropped (queue full)
  int64_t loaded_blocks = 0;     // host -> device copies (prompt blocks served by the tiers)
  int64_t loaded_bytes = 0;
  int64_t prefetches = 0;        // requests whose prefix was read from disk
  int64_t prefetched_blocks = 0;
  double prefetch_ms_total = 0.0, prefetch_ms_max = 0.0;
  int64_t peer_loaded_blocks = 0;  // of loaded_blocks, those read from other engines' shared pools
  int64_t peers = 0;               // shared pools attached
  // Device time of loads into device pages, sampled (one batch of a step's
  // loads at a time): their bandwidth is timed_load_bytes / timed_load_ms.
  int64_t timed_load_bytes = 0;
  double timed_load_ms = 0.0;
  int64_t skipped_as_slower = 0;  // lookups not made because recomputing was judged faster
  RemoteKvFetchStats remote;      // fetches from other nodes' engines (prefetch_remote)
  bool remote_enabled = false;
  int64_t remote_refused_sources = 0;  // requests naming a source not in the allowed hosts
  TierCostEstimate cost;
};

class KvTiers final : public KvTierLink {
 public:
  KvTiers(Backend& backend, KvStorage& storage, KvTierOptions options);
  // Completes every copy and queued disk write (a clean exit persists the cache).
  ~KvTiers() override;
  KvTiers(const KvTiers&) = delete;
  KvTiers& operator=(const KvTiers&) = delete;

  // KvTierLink (engine thread).
  bool on_registered(const KvBlockRef& ref, int32_t block_id, int64_t ttl_s) override;
  std::vector<int32_t> take_released_blocks() override;
  int32_t acquire(const KvTierQuery& query, int32_t from, int32_t to) override;
  void load(int32_t index, int32_t group, int32_t block_id) override;
  void release() override;

  // After launching step `step`: offloads registered since the previous call
  // start on the copy stream once it has run; loads enqueued before it
  // belong to it.
  void step_launched(uint64_t step);
  // Step `step` has completed: its loads have landed; offloads whose copies
  // have landed are published (and queued for the disk).
  void step_completed(uint64_t step);
  // Nothing is in flight on the device (the backend synchronized): finishes
  // every copy, the ones still to enqueue included.
  void device_idle();

  // Starts reading the prompt's blocks that only the disk holds, from block
  // from_block on, into host memory. False when there is nothing to read.
  bool prefetch(uint64_t request, const KvTierQuery& query, int32_t from_block);
  // Whether the request's prefetch has finished; forgets it when so.
  bool prefetch_done(uint64_t request);

  // The recompute side of the load-or-recompute decision: two prefill steps
  // of `tokens` tokens timed, after no context and after `context` tokens.
  void set_compute_cost(int64_t tokens, double ms_at_zero, int64_t context, double ms_at_context) {
    cost_.set_compute(tokens, ms_at_zero, context, ms_at_context);
  }

  // The export fence (a prefill engine answers only once a finished
  // request's KV is in the shared directory). A ticket covers every block
  // accepted for the disk so far; wait_persisted returns true once each of
  // them is on disk (written, found there, or given up on: a decode engine
  // recomputes what it does not find), false at the timeout. Thread-safe.
  uint64_t persist_ticket() const { return persist_accepted_.load(); }
  bool wait_persisted(uint64_t ticket, std::chrono::milliseconds timeout) const;

  // The shared pool this engine exports its blocks through ("" when none).
  std::string shared_pool_name() const;
  // Where decode engines find this engine's blocks: the shared pool's name,
  // or the transport address set_export_source() gave ("" when neither).
  std::string export_source() const;
  // Whether finished requests' KV leaves this engine (a disk tier, a shared
  // pool or a transport): what the export fence waits for.
  bool exports() const { return disk_enabled() || shared_pool_ != nullptr || !export_source_.empty(); }
  // Cross-node export: the host tier is served at `address` (ucx://host:port)
  // by a transport server that reads export_pool(). Call before requests.
  void set_export_source(std::string address) { export_source_ = std::move(address); }
  std::shared_ptr<KvSlotPool> export_pool() const { return host_; }
  const std::string& fingerprint() const { return options_.fingerprint; }

  // Cross-node import: prefetch_remote fetches through `fetcher`, from
  // engines on the allowed hosts only (the blocks become every request's
  // prefix cache: a source must be trusted). Call before requests.
  void set_remote_fetcher(std::unique_ptr<RemoteKvFetcher> fetcher, std::vector<std::string> allowed_hosts);
  bool fetches_remote() const { return remote_ != nullptr; }
  // Starts fetching the prompt's blocks from block from_block on that the
  // host tier lacks from `source` (ucx://host:port) into host memory; like
  // prefetch(), prefetch_done() tells when it has finished. False when
  // nothing is fetched (a bad or untrusted source, nothing missing, no room,
  // or recomputing judged faster).
  bool prefetch_remote(uint64_t request, const KvTierQuery& query, int32_t from_block, std::string_view source);
  // Maps another engine's shared pool (by the name it answered with) so that
  // acquire() finds its blocks. Thread-safe; a name already attached is kept,
  // one that cannot be attached is refused (logged, false). At most 16 pools;
  // the pools of engines that have ended are let go.
  bool attach_peer(std::string_view name);

  // Tensor parallelism: the other ranks repeat every host-tier copy on their
  // slices of the cache (kv_tier_followers.h). Host tier only: a disk tier
  // or shared pool would have to hold every rank's slice. Call before requests.
  void set_followers(KvTierFollowers* followers);

  KvTierStats stats() const;
  bool disk_enabled() const { return disk_ && disk_->enabled(); }
  // The tier key of a block of `group` (the prefix-cache hash, told apart by group).
  static uint64_t tier_key(BlockHash hash, int32_t group);

 private:
  // A load (host -> device) on the op stream: its slot is unpinned once
  // the step launched after it completes.
  struct Load {
    std::shared_ptr<KvSlotPool> pool;
    int32_t slot;
    uint64_t step = 0;
    bool tagged = false;
  };
  struct Offload {
    int32_t slot;
    int32_t block;
    bool verify_existing = false;  // the disk lists the key: check the file before writing
    uint64_t persist_seq = 0;      // the export fence's number for it (0: not headed for the disk)
  };
  struct OffloadBatch {
    std::unique_ptr<DeviceEvent> done;
    std::vector<Offload> items;
    int64_t bytes = 0;
  };
  struct PrefetchItem {
    uint64_t key = 0, parent_key = 0;
    bool first = false;
    std::vector<int32_t> tokens;
  };
  struct Job {
    // A disk write of a pinned host slot, or a prefetch of a request's blocks.
    int32_t write_slot = -1;
    bool verify_existing = false;  // the disk lists the key: check its file, write only if damaged
    uint64_t persist_seq = 0;
    uint64_t request = 0;
    std::string salt;
    std::vector<PrefetchItem> items;
  };

  void calibrate_host();
  void enqueue_offloads();
  void finish_offload(const Offload& o);
  // Writer threads take write jobs, the reader thread prefetch jobs (so a
  // backlog of writes never delays a waiting request's reads). Writer 0 also
  // sweeps expired files.
  void io_loop(bool writer, bool sweeper);
  void write_to_disk(int32_t slot, bool verify_existing);
  bool is_suspect(uint64_t key);
  void run_prefetch(Job& job);
  // A remote fetch has ended with the first `received` of `slots` filled.
  void finish_remote_fetch(uint64_t request, const std::vector<int32_t>& slots, size_t received,
                           std::chrono::steady_clock::time_point start);
  void enqueue(Job job);

  Backend& backend_;
  KvStorage& storage_;
  KvTierOptions options_;
  // The tier right below the device: process-local host memory, or the
  // shared pool this engine exports through (then shared_pool_ points to it).
  std::shared_ptr<KvSlotPool> host_;
  SharedKvPool* shared_pool_ = nullptr;
  std::unique_ptr<DiskKvTier> disk_;
  TierCostModel cost_;

  std::unique_ptr<CopyStream> copy_stream_;

  // Engine thread only.
  KvTierFollowers* followers_ = nullptr;
  std::vector<KvSlotCopy> follower_loads_;  // made since the last release(), told to the followers there
  std::deque<Load> loads_;
  // Offloads registered but not yet on the copy stream. At most
  // max_inflight_offload_bytes_ of copies are on it at once: device-to-host
  // copies share the copy engine with the steps' own small read-backs
  // (sampled tokens), which would otherwise wait behind a long queue.
  std::deque<Offload> offloads_to_enqueue_;
  int64_t inflight_offload_bytes_ = 0;
  int64_t max_inflight_offload_bytes_ = int64_t{64} << 20;
  std::deque<OffloadBatch> offload_batches_;
  std::vector<int32_t> released_blocks_;
  // (block index, group) -> the pool and its pinned slot.
  std::map<std::pair<int32_t, int32_t>, std::pair<std::shared_ptr<KvSlotPool>, int32_t>> acquired_;
  int64_t peer_loaded_ = 0;
  // Loads from device memory (a peer's shared pool), enqueued together by
  // flush_device_loads() (at release(), before the step that reads them).
  std::vector<std::pair<int32_t, const void*>> device_loads_;
  void flush_device_loads();
  // The load timing's start event, recorded before the first copy of a batch.
  void begin_timed_load();
  // Timing of one batch of loads at a time (events around its copies on the
  // op stream); a batch enqueued while the previous is still measured is not timed.
  enum class LoadTiming : uint8_t { Idle, Recording, Measuring };
  LoadTiming load_timing_ = LoadTiming::Idle;
  std::unique_ptr<DeviceEvent> load_start_, load_end_;
  uint64_t load_timing_step_ = 0;
  int64_t load_timing_bytes_ = 0, timed_load_bytes_ = 0;
  double timed_load_ms_ = 0.0;
  // Other engines' pools (attach_peer), looked in after the host tier.
  std::vector<std::shared_ptr<KvSlotPool>> peer_pools();
  mutable std::mutex peers_mutex_;
  std::vector<std::shared_ptr<SharedKvPool>> peers_;
  int64_t offloaded_ = 0, offload_skipped_ = 0, loaded_ = 0, skipped_as_slower_ = 0;

  // Shared with the I/O thread.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> writes_, prefetch_jobs_;
  std::unordered_map<uint64_t, bool> prefetching_;  // request -> done
  // Keys the disk index lists that a prefetch left unread after a broken
  // chain: when they are computed again, the file is checked and replaced
  // if damaged (else a damaged file would only be found one run at a time).
  std::unordered_set<uint64_t> suspect_;
  bool stop_ = false;
  std::string export_source_;
  std::vector<std::string> remote_allowed_hosts_;
  std::atomic<int64_t> remote_refused_sources_{0};
  int64_t writes_dropped_ = 0, prefetches_ = 0, prefetched_blocks_ = 0;
  double prefetch_ms_total_ = 0.0, prefetch_ms_max_ = 0.0;
  std::vector<std::thread> writers_;
  std::thread reader_;
  // The export fence: blocks accepted for the disk are numbered 1, 2, ...
  // (engine thread); a number is done once its block is written, found
  // there, dropped or failed, in whatever order the writers finish.
  // persist_done_ is the largest n with 1..n all done.
  std::atomic<uint64_t> persist_accepted_{0};
  uint64_t persist_done_ = 0;             // guarded by mutex_
  std::set<uint64_t> persisted_ahead_;    // done numbers above persist_done_ (guarded by mutex_)
  mutable std::condition_variable persisted_;
  void mark_persisted(uint64_t seq);  // takes mutex_
  // Declared last: destroyed first, completing its fetches while the slots
  // and counters they finish into still exist.
  std::unique_ptr<RemoteKvFetcher> remote_;
};

// Names what a block's bytes depend on: the model file(s) (size and sampled
// content), the KV dtype, block size and layout. Blocks under another
// fingerprint are never read.
std::string kv_cache_fingerprint(const std::filesystem::path& model_path, const std::string& kv_layout_description);

}  // namespace deepinfer
