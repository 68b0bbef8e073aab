#include "kv/tiers/kv_tiers.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "backend/backend.h"
#include "core/error.h"
#include "core/logging.h"
#include "kv/kv_storage.h"
#include "kv/tiers/tier_block_identity.h"

namespace deepinfer {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Staging when only a disk tier is asked for: room for the blocks being
// written and a long prompt's prefetch.
constexpr uint64_t kDefaultStagingBytes = uint64_t{256} << 20;

}  // namespace

uint64_t KvTiers::tier_key(BlockHash hash, int32_t group) {
  return hash.value ^ (static_cast<uint64_t>(group) * 0x9e37'79b9'7f4a'7c15ULL);
}


KvTiers::KvTiers(Backend& backend, KvStorage& storage, KvTierOptions options)
    : backend_(backend),
      storage_(storage),
      options_(std::move(options)),
      cost_(static_cast<int64_t>(storage.bytes_per_block()) * std::max(options_.groups_per_block_index, 1),
            storage.page_size()) {
  const size_t block_bytes = storage_.bytes_per_block();
  const uint64_t host_bytes = options_.shared_pool_bytes > 0 ? options_.shared_pool_bytes
                              : options_.host_bytes > 0      ? options_.host_bytes
                                                             : kDefaultStagingBytes;
  const auto host_blocks = static_cast<int64_t>(std::max<uint64_t>(host_bytes / block_bytes, 2 * storage.layout().num_groups()));
  if (options_.shared_pool_bytes > 0) {
    auto pool = SharedKvPool::create(
        backend_, SharedKvPool::Options{options_.fingerprint, block_bytes, host_blocks, storage.page_size()});
    DI_CHECK(!pool->payload_on_device() || options_.dir.empty(),
             "kv tiers: a shared pool in device memory cannot feed a disk tier (drop --kv-cache-dir)");
    shared_pool_ = pool.get();
    host_ = std::move(pool);
  } else {
    host_ = std::make_shared<HostKvTier>(backend_, block_bytes, host_blocks);
    log_info("kv tiers: host tier of {} blocks ({:.1f} MiB{})", host_blocks,
             static_cast<double>(host_blocks) * static_cast<double>(block_bytes) / 1048576.0,
             options_.host_bytes > 0 ? "" : ", staging for the disk tier");
  }
  if (!options_.dir.empty()) {
    disk_ = std::make_unique<DiskKvTier>(
        DiskKvTier::Options{options_.dir, options_.fingerprint, options_.disk_bytes});
    if (disk_->enabled()) {
      const DiskKvTierStats d = disk_->stats();
      log_info("kv tiers: disk tier at {} holds {} blocks ({:.1f} MiB) of this model, limit {:.1f} GiB",
               disk_->folder().string(), d.files, static_cast<double>(d.bytes) / 1048576.0,
               static_cast<double>(options_.disk_bytes) / 1073741824.0);
    }
  }
  copy_stream_ = backend_.create_copy_stream();
  calibrate_host();
  const double host_gb_per_s = cost_.estimate().host_gb_per_s;
  max_inflight_offload_bytes_ = std::max<int64_t>(int64_t{64} << 20, static_cast<int64_t>(host_gb_per_s * 1e9 * 0.02));
  // Pending offloads keep their blocks out of the pool: at most half of it.
  options_.max_pending_offloads =
      std::max<size_t>(options_.max_pending_offloads, static_cast<size_t>(storage_.num_pages()) / 2);
  if (disk_enabled()) {
    // The disk side of the decision before the first request: a timed read
    // of a few of the files already there (through the page cache as it is).
    const auto [bytes, ms] = disk_->measure_reads(16);
    if (bytes > 0) {
      cost_.record_transfer(KvTierKind::Disk, bytes, ms);
      log_info("kv tiers: disk reads at {:.2f} GB/s ({} files timed)", static_cast<double>(bytes) / (ms * 1e6),
               std::min<int64_t>(16, disk_->stats().files));
    }
  }
  // Several writers: each block file is checksummed and written whole, and
  // one thread alone makes the export of a long prompt (a prefill engine's
  // answer waits for it) slower than the host link.
  constexpr int kWriters = 4;
  for (int i = 0; i < kWriters; ++i) writers_.emplace_back([this, i] { io_loop(true, i == 0); });
  reader_ = std::thread([this] { io_loop(false, false); });
}

void KvTiers::calibrate_host() {
  // A few round trips of one block through a host slot, timed: the host
  // side of the load-or-recompute decision. Block 0 gets its own bytes back.
  const std::optional<int32_t> slot = host_->reserve(KvBlockIdentity{~uint64_t{0}, 0, false, {}, {}}, 0);
  if (!slot) return;
  backend_.synchronize();
  constexpr int kRounds = 4;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    storage_.save_block(0, host_->payload(*slot).data());
    storage_.load_block(0, host_->payload(*slot).data());
  }
  backend_.synchronize();
  cost_.record_transfer(KvTierKind::Host, 2 * kRounds * static_cast<int64_t>(host_->block_bytes()), ms_since(t0));
  host_->abandon(*slot);
}

KvTiers::~KvTiers() {
  remote_.reset();  // its last fetches finish (empty) into the host tier first
  try {
    backend_.synchronize();
    device_idle();
  } catch (const std::exception& e) {
    log_error("kv tiers: device copies failed at shutdown: {}", e.what());
  }
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& w : writers_) w.join();
  reader_.join();
}

bool KvTiers::on_registered(const KvBlockRef& ref, int32_t block_id, int64_t ttl_s) {
  const KvBlockIdentity id = block_identity(ref.hash, ref.parent, ref.index, ref.group, ref.salt, ref.tokens);
  const uint64_t key = id.key;
  if (host_->contains(key)) return false;
  const bool verify = disk_ && disk_->contains(key);
  if (verify && !is_suspect(key)) return false;
  const int64_t ttl = ttl_s > 0 ? ttl_s : options_.default_ttl_s;
  if (offloads_to_enqueue_.size() >= options_.max_pending_offloads) {
    ++offload_skipped_;
    return false;
  }
  const std::optional<int32_t> slot = host_->reserve(id, ttl > 0 ? unix_now() + ttl : 0);
  if (!slot) {
    ++offload_skipped_;
    return false;
  }
  const uint64_t seq = exports() ? persist_accepted_.fetch_add(1) + 1 : 0;
  offloads_to_enqueue_.push_back({*slot, block_id, verify, seq});
  ++offloaded_;
  return true;
}

std::vector<int32_t> KvTiers::take_released_blocks() {
  std::vector<int32_t> out;
  out.swap(released_blocks_);
  return out;
}

void KvTiers::enqueue_offloads() {
  const auto block_bytes = static_cast<int64_t>(host_->block_bytes());
  size_t take = 0;
  while (take < offloads_to_enqueue_.size() &&
         (inflight_offload_bytes_ + static_cast<int64_t>(take + 1) * block_bytes <= max_inflight_offload_bytes_ ||
          (inflight_offload_bytes_ == 0 && take == 0))) {
    ++take;
  }
  if (take == 0) return;
  copy_stream_->wait_for_ops();
  std::vector<Offload> items(offloads_to_enqueue_.begin(), offloads_to_enqueue_.begin() + static_cast<ptrdiff_t>(take));
  offloads_to_enqueue_.erase(offloads_to_enqueue_.begin(), offloads_to_enqueue_.begin() + static_cast<ptrdiff_t>(take));
  for (const Offload& o : items) storage_.save_block(o.block, host_->payload(o.slot).data(), *copy_stream_);
  if (followers_ != nullptr) {
    std::vector<KvSlotCopy> copies;
    copies.reserve(items.size());
    for (const Offload& o : items) copies.push_back({o.block, o.slot});
    followers_->offload(static_cast<int32_t>(host_->capacity_blocks()), copies);
  }
  const int64_t bytes = static_cast<int64_t>(take) * block_bytes;
  inflight_offload_bytes_ += bytes;
  offload_batches_.push_back({copy_stream_->record(), std::move(items), bytes});
}

std::vector<std::shared_ptr<KvSlotPool>> KvTiers::peer_pools() {
  std::lock_guard lock(peers_mutex_);
  // An engine that has ended took its pool's device memory with it.
  std::erase_if(peers_, [](const std::shared_ptr<SharedKvPool>& p) {
    if (p->creator_alive()) return false;
    log_info("kv tiers: the engine of shared pool {} has ended; letting it go", p->name());
    return true;
  });
  return {peers_.begin(), peers_.end()};
}

bool KvTiers::attach_peer(std::string_view name) {
  if (!options_.import_shared) return false;
  std::lock_guard lock(peers_mutex_);
  for (const auto& p : peers_) {
    if (p->name() == name) return true;
  }
  constexpr size_t kMaxPeers = 16;
  if (peers_.size() >= kMaxPeers) {
    log_warn("kv tiers: already {} shared pools attached; not attaching {}", kMaxPeers, name.substr(0, 64));
    return false;
  }
  std::shared_ptr<SharedKvPool> pool = SharedKvPool::attach(
      backend_, name, SharedKvPool::Options{options_.fingerprint, storage_.bytes_per_block(), 0, storage_.page_size()});
  if (!pool) return false;
  peers_.push_back(std::move(pool));
  return true;
}

std::string KvTiers::shared_pool_name() const { return shared_pool_ ? shared_pool_->name() : std::string(); }

std::string KvTiers::export_source() const { return shared_pool_ ? shared_pool_->name() : export_source_; }

int32_t KvTiers::acquire(const KvTierQuery& q, int32_t from, int32_t to) {
  DI_CHECK(acquired_.empty(), "kv tiers: acquire() while an earlier one is not released");
  const auto bs = static_cast<size_t>(q.block_size);
  // The host tier first, then other engines' shared pools.
  std::vector<std::shared_ptr<KvSlotPool>> pools = {host_};
  if (options_.import_shared) {
    for (auto& p : peer_pools()) pools.push_back(std::move(p));
  }
  int32_t n = 0;
  bool from_peer = false;
  for (int32_t i = from; i < to; ++i) {
    const auto tokens = q.tokens.subspan(static_cast<size_t>(i) * bs, bs);
    bool all = true;
    for (size_t k = 0; k < q.groups.size() && all; ++k) {
      const int32_t g = q.groups[k];
      const KvBlockIdentity id =
          block_identity(q.hashes[static_cast<size_t>(i)], parent_hash(q, i), i, g, q.salt, tokens);
      all = false;
      for (size_t p = 0; p < pools.size() && !all; ++p) {
        const int32_t slot = pools[p]->find_and_pin(id);
        if (slot >= 0) {
          acquired_[{i, g}] = {pools[p], slot};
          from_peer = from_peer || p > 0;
          all = true;
        }
      }
    }
    if (!all) break;
    ++n;
  }
  // Blocks another engine computed for this one to continue from are loaded
  // whatever the cost model says: that engine's answer already waited for them.
  if (n > 0 && !from_peer && !cost_.worth_loading(KvTierKind::Host, from, from + n)) {
    ++skipped_as_slower_;
    release();
    return 0;
  }
  return n;
}

void KvTiers::load(int32_t index, int32_t group, int32_t block_id) {
  auto it = acquired_.find({index, group});
  DI_CHECK(it != acquired_.end(), "kv tiers: block {} of group {} was not acquired", index, group);
  auto& [pool, slot] = it->second;
  if (pool->payload_on_device()) {
    device_loads_.emplace_back(block_id, pool->payload(slot).data());
  } else {
    begin_timed_load();
    storage_.load_block(block_id, pool->payload(slot).data());
    if (load_timing_ == LoadTiming::Recording) {
      load_end_->record();
      load_timing_bytes_ += static_cast<int64_t>(storage_.bytes_per_block());
    }
  }
  if (pool != host_) ++peer_loaded_;
  if (followers_ != nullptr) follower_loads_.push_back({block_id, slot});
  loads_.push_back({std::move(pool), slot});
  acquired_.erase(it);
  ++loaded_;
}

void KvTiers::begin_timed_load() {
  if (load_timing_ != LoadTiming::Idle) return;
  if (!load_start_) {
    load_start_ = backend_.create_event();
    load_end_ = backend_.create_event();
  }
  load_start_->record();
  load_timing_ = LoadTiming::Recording;
  load_timing_bytes_ = 0;
}

void KvTiers::flush_device_loads() {
  if (device_loads_.empty()) return;
  begin_timed_load();
  storage_.load_blocks(device_loads_);
  if (load_timing_ == LoadTiming::Recording) {
    load_end_->record();
    load_timing_bytes_ += static_cast<int64_t>(device_loads_.size() * storage_.bytes_per_block());
  }
  device_loads_.clear();
}

void KvTiers::set_followers(KvTierFollowers* followers) {
  DI_CHECK(followers == nullptr || (!disk_enabled() && shared_pool_ == nullptr && !options_.import_shared &&
                                    remote_ == nullptr && export_source_.empty()),
           "kv tiers: with tensor parallelism only the host tier (--kv-offloading-size) keeps every rank's slice");
  followers_ = followers;
}

void KvTiers::release() {
  if (followers_ != nullptr && !follower_loads_.empty()) {
    followers_->load(static_cast<int32_t>(host_->capacity_blocks()), follower_loads_);
    follower_loads_.clear();
  }
  flush_device_loads();
  for (const auto& [where, held] : acquired_) held.first->unpin(held.second);
  acquired_.clear();
}

void KvTiers::step_launched(uint64_t step) {
  // Enqueued after the step, they would land after it read the pages.
  DI_CHECK(device_loads_.empty(), "kv tiers: loads from a shared pool were not ended by release() before the step");
  if (load_timing_ == LoadTiming::Recording) {
    load_timing_ = LoadTiming::Measuring;
    load_timing_step_ = step;
  }
  for (auto it = loads_.rbegin(); it != loads_.rend() && !it->tagged; ++it) {
    it->step = step;
    it->tagged = true;
  }
  enqueue_offloads();
}

void KvTiers::step_completed(uint64_t step) {
  if (load_timing_ == LoadTiming::Measuring && load_timing_step_ <= step) {
    timed_load_ms_ += load_end_->elapsed_ms_since(*load_start_);
    timed_load_bytes_ += load_timing_bytes_;
    load_timing_ = LoadTiming::Idle;
  }
  while (!loads_.empty() && loads_.front().tagged && loads_.front().step <= step) {
    loads_.front().pool->unpin(loads_.front().slot);
    loads_.pop_front();
  }
  while (!offload_batches_.empty() && offload_batches_.front().done->ready()) {
    for (const Offload& o : offload_batches_.front().items) finish_offload(o);
    inflight_offload_bytes_ -= offload_batches_.front().bytes;
    offload_batches_.pop_front();
  }
  enqueue_offloads();  // room freed for the backlog
}

void KvTiers::device_idle() {
  flush_device_loads();
  if (load_timing_ != LoadTiming::Idle) {
    load_end_->synchronize();
    timed_load_ms_ += load_end_->elapsed_ms_since(*load_start_);
    timed_load_bytes_ += load_timing_bytes_;
    load_timing_ = LoadTiming::Idle;
  }
  while (!offloads_to_enqueue_.empty()) {
    enqueue_offloads();
    copy_stream_->synchronize();
    for (const OffloadBatch& b : offload_batches_) {
      for (const Offload& o : b.items) finish_offload(o);
    }
    offload_batches_.clear();
    inflight_offload_bytes_ = 0;
  }
  copy_stream_->synchronize();
  for (const Load& l : loads_) l.pool->unpin(l.slot);
  loads_.clear();
  for (const OffloadBatch& b : offload_batches_) {
    for (const Offload& o : b.items) finish_offload(o);
  }
  offload_batches_.clear();
  inflight_offload_bytes_ = 0;
}

void KvTiers::finish_offload(const Offload& o) {
  released_blocks_.push_back(o.block);
  if (!disk_enabled()) {
    host_->publish(o.slot);
    if (o.persist_seq != 0) mark_persisted(o.persist_seq);  // in the shared pool: exported
    return;
  }
  host_->pin(o.slot);  // held for the disk write
  host_->publish(o.slot);
  Job job;
  job.write_slot = o.slot;
  job.verify_existing = o.verify_existing;
  job.persist_seq = o.persist_seq;
  enqueue(std::move(job));
}

void KvTiers::enqueue(Job job) {
  uint64_t dropped_seq = 0;
  {
    std::lock_guard lock(mutex_);
    if (writes_.size() < options_.max_queued_writes) {
      writes_.push_back(std::move(job));
    } else {
      ++writes_dropped_;
      host_->unpin(job.write_slot);
      dropped_seq = job.persist_seq;
    }
  }
  if (dropped_seq != 0) mark_persisted(dropped_seq);  // dropped: done with, as far as the fence goes
  wake_.notify_all();
}

bool KvTiers::prefetch(uint64_t request, const KvTierQuery& q, int32_t from_block) {
  if (!disk_enabled()) return false;
  const auto total = static_cast<int32_t>(q.tokens.size());
  const int32_t usable = std::min<int32_t>(static_cast<int32_t>(q.hashes.size()), (total - 1) / q.block_size);
  const auto bs = static_cast<size_t>(q.block_size);
  Job job;
  job.request = request;
  job.salt.assign(q.salt);
  // Blocks [from_block, end) are in a tier (each group in host memory or on
  // disk); the ones only on disk are read.
  int32_t end = from_block;
  int32_t first_read = -1;
  for (bool missing = false; end < usable && !missing;) {
    const size_t before = job.items.size();
    for (const int32_t g : q.groups) {
      const auto tokens = q.tokens.subspan(static_cast<size_t>(end) * bs, bs);
      const KvBlockIdentity id =
          block_identity(q.hashes[static_cast<size_t>(end)], parent_hash(q, end), end, g, q.salt, tokens);
      if (host_->contains(id.key)) continue;
      if (!disk_->discover(id.key)) {
        missing = true;
        break;
      }
      job.items.push_back({id.key, id.parent_key, id.first, std::vector<int32_t>(tokens.begin(), tokens.end())});
    }
    if (missing) {
      job.items.resize(before);
      break;
    }
    if (job.items.size() > before && first_read < 0) first_read = end;
    ++end;
  }
  // Files of blocks after a missing one cannot serve this request, which
  // recomputes them: check them then (on_registered).
  {
    std::lock_guard lock(mutex_);
    if (suspect_.size() > (size_t{1} << 20)) suspect_.clear();  // of requests that never came back
    for (int32_t i = end + 1; i < usable; ++i) {
      for (const int32_t g : q.groups) {
        const uint64_t key = tier_key(q.hashes[static_cast<size_t>(i)], g);
        if (disk_->contains(key)) suspect_.insert(key);
      }
    }
  }
  if (job.items.empty()) return false;
  if (!cost_.worth_loading(KvTierKind::Disk, first_read, end)) {
    ++skipped_as_slower_;
    return false;
  }
  {
    std::lock_guard lock(mutex_);
    prefetching_[request] = false;
    prefetch_jobs_.push_back(std::move(job));
  }
  wake_.notify_all();
  return true;
}

bool KvTiers::prefetch_done(uint64_t request) {
  std::lock_guard lock(mutex_);
  auto it = prefetching_.find(request);
  if (it == prefetching_.end()) return true;
  if (!it->second) return false;
  prefetching_.erase(it);
  return true;
}

void KvTiers::io_loop(bool writer, bool sweeper) {
  std::deque<Job>& queue = writer ? writes_ : prefetch_jobs_;
  // The writer also sweeps expired block files: at start and every ten minutes.
  constexpr auto kSweepInterval = std::chrono::minutes(10);
  auto next_sweep = std::chrono::steady_clock::now();
  for (;;) {
    if (sweeper && disk_enabled() && std::chrono::steady_clock::now() >= next_sweep) {
      disk_->remove_expired();
      next_sweep = std::chrono::steady_clock::now() + kSweepInterval;
    }
    Job job;
    {
      std::unique_lock lock(mutex_);
      if (sweeper) {
        wake_.wait_until(lock, next_sweep, [&] { return stop_ || !queue.empty(); });
      } else {
        wake_.wait(lock, [&] { return stop_ || !queue.empty(); });
      }
      if (queue.empty()) {
        if (stop_) return;  // stopping, everything done
        continue;           // time to sweep
      }
      job = std::move(queue.front());
      queue.pop_front();
    }
    try {
      if (writer) {
        write_to_disk(job.write_slot, job.verify_existing);
      } else {
        run_prefetch(job);
      }
    } catch (const std::exception& e) {
      // The tiers are a cache: a failure costs hits, never the engine.
      log_error("kv tiers: I/O job failed: {}", e.what());
      if (writer) host_->unpin(job.write_slot);
      std::lock_guard lock(mutex_);
      if (!writer) prefetching_[job.request] = true;
    }
    if (writer && job.persist_seq != 0) mark_persisted(job.persist_seq);
  }
}

void KvTiers::mark_persisted(uint64_t seq) {
  {
    std::lock_guard lock(mutex_);
    persisted_ahead_.insert(seq);
    while (!persisted_ahead_.empty() && *persisted_ahead_.begin() == persist_done_ + 1) {
      persisted_ahead_.erase(persisted_ahead_.begin());
      ++persist_done_;
    }
  }
  persisted_.notify_all();
}

bool KvTiers::wait_persisted(uint64_t ticket, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  return persisted_.wait_for(lock, timeout, [&] { return persist_done_ >= ticket; });
}

bool KvTiers::is_suspect(uint64_t key) {
  std::lock_guard lock(mutex_);
  return suspect_.erase(key) > 0;
}

void KvTiers::write_to_disk(int32_t slot, bool verify_existing) {
  const int64_t expires = host_->expires_at(slot);
  const int64_t now = unix_now();
  if (verify_existing) {
    // get() removes the file when it is damaged; an intact one stays.
    std::vector<std::byte> scratch(host_->block_bytes());
    if (disk_->get(host_->identity(slot), scratch)) {
      host_->unpin(slot);
      return;
    }
  }
  if (expires == 0 || expires > now) {
    disk_->put(host_->identity(slot), host_->payload(slot), std::chrono::seconds(expires == 0 ? 0 : expires - now));
  }
  host_->unpin(slot);
}

void KvTiers::run_prefetch(Job& job) {
  const auto t0 = std::chrono::steady_clock::now();
  // Several files at once: a file system (a local SSD, a distributed one)
  // serves parallel reads far faster than one at a time.
  constexpr size_t kReaders = 4;
  std::atomic<int64_t> blocks{0};
  auto read_some = [&](size_t first) {
    for (size_t i = first; i < job.items.size(); i += kReaders) {
      const PrefetchItem& item = job.items[i];
      const KvBlockIdentity id{item.key, item.parent_key, item.first, job.salt, item.tokens};
      const std::optional<int32_t> slot = host_->reserve(id, 0);
      if (!slot) {
        if (host_->contains(item.key)) continue;  // another prefetch or an offload got there first
        return;                                     // every host slot is pinned
      }
      int64_t expires = 0;
      if (!disk_->get(id, host_->payload(*slot), &expires)) {
        // Missing or damaged (and then removed): the request recomputes it.
        host_->abandon(*slot);
        continue;
      }
      host_->publish(*slot);
      ++blocks;
    }
  };
  std::vector<std::thread> helpers;
  for (size_t r = 1; r < std::min(kReaders, job.items.size()); ++r) helpers.emplace_back(read_some, r);
  read_some(0);
  for (std::thread& t : helpers) t.join();
  const double ms = ms_since(t0);
  if (blocks > 0) cost_.record_transfer(KvTierKind::Disk, blocks * static_cast<int64_t>(host_->block_bytes()), ms);
  std::lock_guard lock(mutex_);
  prefetching_[job.request] = true;
  ++prefetches_;
  prefetched_blocks_ += blocks;
  prefetch_ms_total_ += ms;
  prefetch_ms_max_ = std::max(prefetch_ms_max_, ms);
}

KvTierStats KvTiers::stats() const {
  KvTierStats s;
  s.host = host_->stats();
  if (disk_) {
    s.disk = disk_->stats();
    s.disk_enabled = disk_->enabled();
  }
  s.offloaded_blocks = offloaded_;
  s.offload_skipped = offload_skipped_;
  s.loaded_blocks = loaded_;
  s.loaded_bytes = loaded_ * static_cast<int64_t>(host_->block_bytes());
  s.skipped_as_slower = skipped_as_slower_;
  s.peer_loaded_blocks = peer_loaded_;
  s.timed_load_bytes = timed_load_bytes_;
  s.timed_load_ms = timed_load_ms_;
  {
    std::lock_guard lock(peers_mutex_);
    s.peers = static_cast<int64_t>(peers_.size());
  }
  s.cost = cost_.estimate();
  if (remote_) {
    s.remote_enabled = true;
    s.remote = remote_->stats();
  }
  s.remote_refused_sources = remote_refused_sources_.load();
  std::lock_guard lock(mutex_);
  s.writes_dropped = writes_dropped_;
  s.prefetches = prefetches_;
  s.prefetched_blocks = prefetched_blocks_;
  s.prefetch_ms_total = prefetch_ms_total_;
  s.prefetch_ms_max = prefetch_ms_max_;
  return s;
}

std::string kv_cache_fingerprint(const std::filesystem::path& model_path, const std::string& kv_layout_description) {
  // Size plus the first and last MiB of every model file: cheap, and any
  // other checkpoint (or a re-quantisation) differs in them.
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  if (std::filesystem::is_directory(model_path, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(model_path, ec)) {
      const std::string ext = e.path().extension().string();
      if (ext == ".safetensors" || ext == ".gguf" || e.path().filename() == "config.json") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(model_path);
  }
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buf(size_t{1} << 20);
  for (const auto& f : files) {
    const std::string name = f.filename().string();
    XXH3_64bits_update(state, name.data(), name.size());
    std::FILE* file = std::fopen(f.c_str(), "rb");
    if (file == nullptr) continue;
    std::fseek(file, 0, SEEK_END);
    const long size = std::ftell(file);
    XXH3_64bits_update(state, &size, sizeof size);
    for (long at : {0L, std::max(0L, size - static_cast<long>(buf.size()))}) {
      std::fseek(file, at, SEEK_SET);
      const size_t got = std::fread(buf.data(), 1, buf.size(), file);
      XXH3_64bits_update(state, buf.data(), got);
    }
    std::fclose(file);
  }
  const uint64_t weights = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(weights));
  return std::string("weights ") + hex + "; " + kv_layout_description;
}

}  // namespace deepinfer
