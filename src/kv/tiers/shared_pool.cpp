#include "kv/tiers/shared_pool.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <new>

#include "backend/backend.h"
#include "core/error.h"
#include "core/logging.h"

namespace deepinfer {

namespace {

constexpr char kMagic[8] = {'D', 'I', 'K', 'V', 'P', 'O', 'O', 'L'};
constexpr uint32_t kVersion = 1;
constexpr std::string_view kNamePrefix = "deepinfer-kv-";
constexpr size_t kSaltMax = 128;  // longer salts are not shared (their blocks stay local)
constexpr size_t kFingerprintMax = 1024;
constexpr size_t kHandleMax = 128;
constexpr int64_t kStalePinMs = 120'000;
constexpr int64_t kMaxCapacity = int64_t{1} << 22;
constexpr int32_t kEmpty = -1, kTombstone = -2;

enum SlotState : uint32_t { kFree = 0, kFilling = 1, kReady = 2 };

int64_t monotonic_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

bool process_alive(int32_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

std::atomic<uint32_t> g_pool_counter{0};

}  // namespace

struct SharedKvPool::Header {
  char magic[8];
  uint32_t version;
  uint32_t on_device;  // 1: payload in shared device memory (handle below), 0: in this segment
  uint64_t segment_bytes;
  uint64_t block_bytes;
  uint64_t capacity;
  uint32_t block_tokens;
  uint32_t salt_max;
  uint64_t index_size;  // a power of two, at least twice the capacity
  uint64_t slots_offset, index_offset, salts_offset, tokens_offset, payload_offset;
  int32_t creator_pid;
  uint32_t handle_bytes;
  uint8_t handle[kHandleMax];
  uint32_t fingerprint_bytes;
  char fingerprint[kFingerprintMax];
  pthread_mutex_t mutex;
  uint64_t tick;        // last-use clock for LRU reuse
  uint64_t tombstones;  // index entries of removed keys
};

struct SharedKvPool::SlotRecord {
  uint32_t state;
  int32_t pins;
  uint64_t key, parent_key;
  uint32_t first;
  uint32_t salt_bytes;
  uint32_t n_tokens;
  uint32_t pad;
  int64_t expires_at;  // Unix seconds, 0 = never
  uint64_t last_used;
  int64_t pinned_at_ms;  // steady clock (the node's), last pin
};

// The segment's mutex: robust, so a process that died holding it leaves it
// consistent enough to go on (every update under it is a few stores).
class SharedKvPool::SegmentLock {
 public:
  explicit SegmentLock(Header* h) : mutex_(&h->mutex) {
    const int rc = pthread_mutex_lock(mutex_);
    if (rc == EOWNERDEAD) {
      pthread_mutex_consistent(mutex_);
    } else if (rc != 0) {
      fail("shared KV pool: locking failed: {}", std::strerror(rc));
    }
  }
  ~SegmentLock() { pthread_mutex_unlock(mutex_); }
  SegmentLock(const SegmentLock&) = delete;
  SegmentLock& operator=(const SegmentLock&) = delete;

 private:
  pthread_mutex_t* mutex_;
};

SharedKvPool::SharedKvPool(Backend& backend, std::string name, bool creator)
    : backend_(backend), name_(std::move(name)), creator_(creator) {}

bool SharedKvPool::valid_name(std::string_view name) {
  if (!name.starts_with(kNamePrefix)) return false;
  name.remove_prefix(kNamePrefix.size());
  const size_t dash = name.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash > 10 || name.size() - dash - 1 == 0 ||
      name.size() - dash - 1 > 10) {
    return false;
  }
  auto digits = [](std::string_view s) { return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }); };
  return digits(name.substr(0, dash)) && digits(name.substr(dash + 1));
}

void SharedKvPool::remove_orphaned_segments() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string n = e.path().filename().string();
    if (!valid_name(n)) continue;
    const std::string_view rest = std::string_view(n).substr(kNamePrefix.size());
    int32_t pid = 0;
    std::from_chars(rest.data(), rest.data() + rest.find('-'), pid);
    if (!process_alive(pid)) {
      ::shm_unlink(("/" + n).c_str());
      log_info("shared KV pool: removed {} (its process {} has ended)", n, pid);
    }
  }
}

std::unique_ptr<SharedKvPool> SharedKvPool::create(Backend& backend, const Options& o) {
  DI_CHECK(o.block_bytes > 0 && o.block_tokens > 0, "shared KV pool: empty blocks");
  DI_CHECK(o.capacity_blocks > 0 && o.capacity_blocks <= kMaxCapacity, "shared KV pool: {} blocks is out of range",
           o.capacity_blocks);
  DI_CHECK(o.fingerprint.size() <= kFingerprintMax, "shared KV pool: a fingerprint of {} bytes is too long",
           o.fingerprint.size());
  remove_orphaned_segments();
  std::unique_ptr<SharedKvPool> pool(new SharedKvPool(
      backend, fmt::format("{}{}-{}", kNamePrefix, ::getpid(), g_pool_counter.fetch_add(1)), true));
  const auto capacity = static_cast<size_t>(o.capacity_blocks);

  std::optional<Backend::SharedDeviceMemory> device = backend.allocate_shared_device(capacity * o.block_bytes);
  if (device) {
    DI_CHECK(device->handle.size() <= kHandleMax, "shared KV pool: a device handle of {} bytes", device->handle.size());
    pool->device_memory_ = device->ptr;
  }
  uint64_t index_size = 1;
  while (index_size < 2 * capacity) index_size <<= 1;
  size_t at = align_up(sizeof(Header), 64);
  const size_t slots_offset = at;
  at = align_up(at + capacity * sizeof(SlotRecord), 64);
  const size_t index_offset = at;
  at = align_up(at + index_size * sizeof(int32_t), 64);
  const size_t salts_offset = at;
  at = align_up(at + capacity * kSaltMax, 64);
  const size_t tokens_offset = at;
  at = align_up(at + capacity * static_cast<size_t>(o.block_tokens) * sizeof(int32_t), 4096);
  const size_t payload_offset = at;
  if (!device) at += capacity * o.block_bytes;
  const size_t segment_bytes = at;

  const std::string shm_name = "/" + pool->name_;
  const int fd = ::shm_open(shm_name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    if (device) backend.free_shared_device(device->ptr);
    pool->device_memory_ = nullptr;
    fail("shared KV pool: cannot create {}: {}", shm_name, std::strerror(errno));
  }
  // Reserve the memory now: a tmpfs that runs out later would kill the
  // process with SIGBUS on a store instead of failing here.
  const int falloc = ::posix_fallocate(fd, 0, static_cast<off_t>(segment_bytes));
  void* map = falloc == 0 ? ::mmap(nullptr, segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (map == MAP_FAILED) {
    ::shm_unlink(shm_name.c_str());
    if (device) backend.free_shared_device(device->ptr);
    pool->device_memory_ = nullptr;
    fail("shared KV pool: cannot allocate {:.1f} MiB of shared memory for {}: {}",
         static_cast<double>(segment_bytes) / 1048576.0, shm_name, std::strerror(falloc != 0 ? falloc : errno));
  }
  pool->segment_ = map;
  pool->segment_bytes_ = segment_bytes;
  auto* h = new (map) Header{};
  std::memcpy(h->magic, kMagic, sizeof kMagic);
  h->version = kVersion;
  h->on_device = device ? 1 : 0;
  h->segment_bytes = segment_bytes;
  h->block_bytes = o.block_bytes;
  h->capacity = capacity;
  h->block_tokens = static_cast<uint32_t>(o.block_tokens);
  h->salt_max = kSaltMax;
  h->index_size = index_size;
  h->slots_offset = slots_offset;
  h->index_offset = index_offset;
  h->salts_offset = salts_offset;
  h->tokens_offset = tokens_offset;
  h->payload_offset = payload_offset;
  h->creator_pid = ::getpid();
  if (device) {
    h->handle_bytes = static_cast<uint32_t>(device->handle.size());
    std::memcpy(h->handle, device->handle.data(), device->handle.size());
  }
  h->fingerprint_bytes = static_cast<uint32_t>(o.fingerprint.size());
  std::memcpy(h->fingerprint, o.fingerprint.data(), o.fingerprint.size());
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&h->mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  pool->bind_segment();
  for (size_t s = 0; s < capacity; ++s) new (&pool->slots_[s]) SlotRecord{};
  std::fill(pool->index_, pool->index_ + index_size, kEmpty);
  log_info("shared KV pool: {} holds {} blocks ({:.1f} MiB) in {} memory", pool->name_, capacity,
           static_cast<double>(capacity * o.block_bytes) / 1048576.0, device ? "device (IPC)" : "shared host");
  return pool;
}

std::unique_ptr<SharedKvPool> SharedKvPool::attach(Backend& backend, std::string_view name, const Options& expect) {
  if (!valid_name(name)) {
    log_warn("shared KV pool: '{}' is not a pool name", name.substr(0, 64));
    return nullptr;
  }
  const std::string shm_name = "/" + std::string(name);
  const int fd = ::shm_open(shm_name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    log_warn("shared KV pool: cannot open {}: {}", shm_name, std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Header))) {
    ::close(fd);
    log_warn("shared KV pool: {} is too small to be a pool", shm_name);
    return nullptr;
  }
  const auto size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    log_warn("shared KV pool: cannot map {}: {}", shm_name, std::strerror(errno));
    return nullptr;
  }
  std::unique_ptr<SharedKvPool> pool(new SharedKvPool(backend, std::string(name), false));
  pool->segment_ = map;
  pool->segment_bytes_ = size;
  const Header* h = static_cast<const Header*>(map);
  // Everything the creator wrote is checked before it is used.
  auto refuse = [&](std::string_view why) -> std::unique_ptr<SharedKvPool> {
    log_warn("shared KV pool: {} refused: {}", shm_name, why);
    return nullptr;
  };
  if (std::memcmp(h->magic, kMagic, sizeof kMagic) != 0 || h->version != kVersion) return refuse("not a pool of this version");
  if (h->segment_bytes != size) return refuse("its size does not match its header");
  if (h->fingerprint_bytes > kFingerprintMax ||
      std::string_view(h->fingerprint, h->fingerprint_bytes) != expect.fingerprint) {
    return refuse("made for another model, KV dtype or layout");
  }
  if (h->block_bytes != expect.block_bytes || h->block_tokens != static_cast<uint32_t>(expect.block_tokens)) {
    return refuse("other block sizes");
  }
  if (h->capacity == 0 || h->capacity > static_cast<uint64_t>(kMaxCapacity) || h->salt_max != kSaltMax ||
      h->index_size < 2 * h->capacity || (h->index_size & (h->index_size - 1)) != 0 || h->handle_bytes > kHandleMax) {
    return refuse("a damaged header");
  }
  const uint64_t cap = h->capacity;
  auto fits = [&](uint64_t offset, uint64_t bytes) { return offset <= size && bytes <= size - offset; };
  if (h->slots_offset < sizeof(Header) || !fits(h->slots_offset, cap * sizeof(SlotRecord)) ||
      !fits(h->index_offset, h->index_size * sizeof(int32_t)) || !fits(h->salts_offset, cap * kSaltMax) ||
      !fits(h->tokens_offset, cap * h->block_tokens * sizeof(int32_t)) ||
      (h->on_device == 0 && !fits(h->payload_offset, cap * h->block_bytes)) || h->slots_offset % 64 != 0 ||
      h->index_offset % 4 != 0 || h->tokens_offset % 4 != 0) {
    return refuse("parts outside the segment");
  }
  if (!process_alive(h->creator_pid)) return refuse("its process has ended");
  if (h->on_device != 0) {
    pool->device_memory_ = backend.open_shared_device(std::span(reinterpret_cast<const std::byte*>(h->handle), h->handle_bytes));
    if (pool->device_memory_ == nullptr) return refuse("its device memory cannot be mapped here");
  }
  pool->bind_segment();
  log_info("shared KV pool: attached {} ({} blocks in {} memory)", pool->name_, cap,
           h->on_device ? "device" : "shared host");
  return pool;
}

void SharedKvPool::bind_segment() {
  auto* base = static_cast<char*>(segment_);
  header_ = reinterpret_cast<Header*>(base);
  slots_ = reinterpret_cast<SlotRecord*>(base + header_->slots_offset);
  index_ = reinterpret_cast<int32_t*>(base + header_->index_offset);
  salts_ = base + header_->salts_offset;
  tokens_ = reinterpret_cast<int32_t*>(base + header_->tokens_offset);
  payload_ = device_memory_ != nullptr ? static_cast<std::byte*>(device_memory_)
                                       : reinterpret_cast<std::byte*>(base + header_->payload_offset);
  block_bytes_ = header_->block_bytes;
  capacity_ = static_cast<int64_t>(header_->capacity);
  block_tokens_ = header_->block_tokens;
  index_size_ = header_->index_size;
  stats_.capacity_blocks = capacity_;
}

SharedKvPool::~SharedKvPool() {
  if (device_memory_ != nullptr) {
    if (creator_) {
      backend_.free_shared_device(device_memory_);
    } else {
      backend_.close_shared_device(device_memory_);
    }
  }
  if (segment_ != nullptr) ::munmap(segment_, segment_bytes_);
  if (creator_) ::shm_unlink(("/" + name_).c_str());
}

bool SharedKvPool::creator_alive() const { return process_alive(header_->creator_pid); }

SharedKvPool::SlotRecord& SharedKvPool::record(int32_t slot) const {
  DI_CHECK(slot >= 0 && slot < capacity_, "shared KV pool: slot {} out of range", slot);
  return slots_[slot];
}

char* SharedKvPool::salt_of(int32_t slot) const { return salts_ + static_cast<size_t>(slot) * kSaltMax; }

int32_t* SharedKvPool::tokens_of(int32_t slot) const { return tokens_ + static_cast<size_t>(slot) * block_tokens_; }

int32_t SharedKvPool::index_find(uint64_t key) const {
  const uint64_t mask = index_size_ - 1;
  for (uint64_t i = 0, at = mix(key) & mask; i < index_size_; ++i, at = (at + 1) & mask) {
    const int32_t e = index_[at];
    if (e == kEmpty) return -1;
    if (e >= 0 && e < capacity_ && slots_[e].state != kFree && slots_[e].key == key) return e;
  }
  return -1;
}

void SharedKvPool::index_insert(uint64_t key, int32_t slot) {
  const uint64_t mask = index_size_ - 1;
  for (uint64_t i = 0, at = mix(key) & mask; i < index_size_; ++i, at = (at + 1) & mask) {
    if (index_[at] == kEmpty || index_[at] == kTombstone) {
      if (index_[at] == kTombstone) --header_->tombstones;
      index_[at] = slot;
      return;
    }
  }
  fail("shared KV pool: index full");  // cannot happen: at least half the entries hold no key
}

void SharedKvPool::index_erase(uint64_t key) {
  const uint64_t mask = index_size_ - 1;
  for (uint64_t i = 0, at = mix(key) & mask; i < index_size_; ++i, at = (at + 1) & mask) {
    const int32_t e = index_[at];
    if (e == kEmpty) return;
    if (e >= 0 && e < capacity_ && slots_[e].key == key) {
      index_[at] = kTombstone;
      if (++header_->tombstones > index_size_ / 4) index_rebuild();
      return;
    }
  }
}

void SharedKvPool::index_rebuild() {
  std::fill(index_, index_ + index_size_, kEmpty);
  header_->tombstones = 0;
  for (int32_t s = 0; s < capacity_; ++s) {
    if (slots_[s].state != kFree) index_insert(slots_[s].key, s);
  }
}

void SharedKvPool::drop(int32_t slot) {
  SlotRecord& r = slots_[slot];
  index_erase(r.key);
  r.state = kFree;
  r.pins = 0;
}

std::optional<int32_t> SharedKvPool::reserve(const KvBlockIdentity& id, int64_t expires_at) {
  DI_CHECK(creator_, "shared KV pool: only the creating engine stores blocks");
  if (id.salt.size() > kSaltMax || id.tokens.size() > block_tokens_) return std::nullopt;  // kept local
  SegmentLock lock(header_);
  if (index_find(id.key) >= 0) return std::nullopt;
  // A free slot, else the least recently used one nobody reads (an expired
  // one first; a pin of a process that died long ago does not count).
  const int64_t now_ms = monotonic_ms();
  const int64_t now_s = unix_seconds();
  int32_t pick = -1;
  uint64_t oldest = UINT64_MAX;
  bool pick_expired = false;
  for (int32_t s = 0; s < capacity_; ++s) {
    SlotRecord& r = slots_[s];
    if (r.state == kFree) {
      pick = s;
      break;
    }
    if (r.state != kReady) continue;
    if (r.pins > 0 && now_ms - r.pinned_at_ms < kStalePinMs) continue;
    const bool expired = r.expires_at != 0 && r.expires_at <= now_s;
    if ((expired && !pick_expired) || (expired == pick_expired && r.last_used < oldest)) {
      pick = s;
      oldest = r.last_used;
      pick_expired = expired;
    }
  }
  std::lock_guard stats_lock(stats_mutex_);
  if (pick < 0) {
    ++stats_.full;
    return std::nullopt;
  }
  SlotRecord& r = slots_[pick];
  if (r.state == kReady) {
    if (r.pins > 0) log_warn("shared KV pool: slot {} was pinned for over {} s; reusing it", pick, kStalePinMs / 1000);
    ++(r.expires_at != 0 && r.expires_at <= now_s ? stats_.expirations : stats_.evictions);
    drop(pick);
  }
  r.state = kFilling;
  r.pins = 1;
  r.pinned_at_ms = now_ms;
  r.key = id.key;
  r.parent_key = id.parent_key;
  r.first = id.first ? 1 : 0;
  r.salt_bytes = static_cast<uint32_t>(id.salt.size());
  std::memcpy(salt_of(pick), id.salt.data(), id.salt.size());
  r.n_tokens = static_cast<uint32_t>(id.tokens.size());
  std::copy(id.tokens.begin(), id.tokens.end(), tokens_of(pick));
  r.expires_at = expires_at;
  r.last_used = ++header_->tick;
  index_insert(id.key, pick);
  return pick;
}

std::span<std::byte> SharedKvPool::payload(int32_t slot) {
  DI_CHECK(slot >= 0 && slot < capacity_, "shared KV pool: slot {} out of range", slot);
  return {payload_ + static_cast<size_t>(slot) * block_bytes_, block_bytes_};
}

void SharedKvPool::publish(int32_t slot) {
  SegmentLock lock(header_);
  SlotRecord& r = record(slot);
  DI_CHECK(creator_ && r.state == kFilling && r.pins > 0, "shared KV pool: publishing slot {} that was not reserved",
           slot);
  r.state = kReady;
  --r.pins;
  std::lock_guard stats_lock(stats_mutex_);
  ++stats_.stored;
}

void SharedKvPool::abandon(int32_t slot) {
  SegmentLock lock(header_);
  SlotRecord& r = record(slot);
  DI_CHECK(creator_ && r.state == kFilling, "shared KV pool: abandoning slot {} that was not reserved", slot);
  drop(slot);
}

bool SharedKvPool::matches(int32_t slot, const KvBlockIdentity& id) const {
  const SlotRecord& r = slots_[slot];
  if (r.n_tokens > block_tokens_ || r.salt_bytes > kSaltMax) return false;  // a damaged record
  if ((r.first != 0) != id.first || r.n_tokens != id.tokens.size() ||
      !std::equal(id.tokens.begin(), id.tokens.end(), tokens_of(slot))) {
    return false;
  }
  return id.first ? std::string_view(salt_of(slot), r.salt_bytes) == id.salt : r.parent_key == id.parent_key;
}

int32_t SharedKvPool::find_and_pin(const KvBlockIdentity& id) {
  SegmentLock lock(header_);
  const int32_t slot = index_find(id.key);
  const bool hit = slot >= 0 && slots_[slot].state == kReady && matches(slot, id) &&
                   (slots_[slot].expires_at == 0 || slots_[slot].expires_at > unix_seconds());
  std::lock_guard stats_lock(stats_mutex_);
  if (!hit) {
    ++stats_.misses;
    return -1;
  }
  SlotRecord& r = slots_[slot];
  ++r.pins;
  r.pinned_at_ms = monotonic_ms();
  r.last_used = ++header_->tick;
  ++stats_.hits;
  return slot;
}

void SharedKvPool::pin(int32_t slot) {
  SegmentLock lock(header_);
  SlotRecord& r = record(slot);
  ++r.pins;
  r.pinned_at_ms = monotonic_ms();
}

void SharedKvPool::unpin(int32_t slot) {
  SegmentLock lock(header_);
  SlotRecord& r = record(slot);
  // A pin taken for stale and the slot reused meanwhile: nothing left to undo.
  if (r.pins > 0) --r.pins;
}

bool SharedKvPool::contains(uint64_t key) const {
  SegmentLock lock(header_);
  return index_find(key) >= 0;
}

KvBlockIdentity SharedKvPool::identity(int32_t slot) const {
  SegmentLock lock(header_);
  const SlotRecord& r = record(slot);
  DI_CHECK(r.pins > 0 && r.n_tokens <= block_tokens_ && r.salt_bytes <= kSaltMax,
           "shared KV pool: slot {} must be pinned to read its identity", slot);
  return KvBlockIdentity{r.key, r.parent_key, r.first != 0, std::string_view(salt_of(slot), r.salt_bytes),
                         std::span<const int32_t>(tokens_of(slot), r.n_tokens)};
}

int64_t SharedKvPool::expires_at(int32_t slot) const {
  SegmentLock lock(header_);
  return record(slot).expires_at;
}

HostKvTierStats SharedKvPool::stats() const {
  int64_t ready = 0;
  {
    SegmentLock lock(header_);
    for (int32_t s = 0; s < capacity_; ++s) ready += slots_[s].state == kReady ? 1 : 0;
  }
  std::lock_guard stats_lock(stats_mutex_);
  HostKvTierStats s = stats_;
  s.blocks = ready;
  return s;
}

}  // namespace deepinfer
