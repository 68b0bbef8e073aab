#include "kv/tiers/disk_tier.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/logging.h"

namespace deepinfer {

namespace {

constexpr char kMagic[8] = {'D', 'I', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr const char* kSuffix = ".kvb";
constexpr const char* kTempPrefix = ".tmp-";
constexpr uint32_t kFirstBlock = 1;
// Bounds a header may claim before anything is allocated for it.
constexpr uint32_t kMaxSaltBytes = 1 << 16;
constexpr uint32_t kMaxTokens = 1 << 20;

// The file's first 72 bytes (little-endian; the engine only runs on
// little-endian hosts).
struct FileHeader {
  char magic[8];
  uint64_t fingerprint;
  uint64_t key;
  uint64_t parent_key;
  uint32_t flags;
  uint32_t n_tokens;
  uint32_t salt_bytes;
  uint32_t reserved;
  uint64_t payload_bytes;
  int64_t expires_at;
  uint64_t checksum;  // XXH3-64 of the whole file with this field zero
};
static_assert(sizeof(FileHeader) == 72);

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool parse_hex16(std::string_view s, uint64_t& out) {
  if (s.size() != 16) return false;
  out = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    out = out << 4 | static_cast<uint64_t>(d);
  }
  return true;
}

uint64_t file_checksum(const std::vector<std::byte>& file) {
  FileHeader h;
  std::memcpy(&h, file.data(), sizeof h);
  h.checksum = 0;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, &h, sizeof h);
  XXH3_64bits_update(state, file.data() + sizeof h, file.size() - sizeof h);
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}

}  // namespace

DiskKvTier::DiskKvTier(Options options) : options_(std::move(options)) {
  fingerprint_hash_ = XXH3_64bits(options_.fingerprint.data(), options_.fingerprint.size());
  folder_ = options_.dir / hex16(fingerprint_hash_);
  std::error_code ec;
  std::filesystem::create_directories(folder_, ec);
  if (ec || !std::filesystem::is_directory(folder_, ec)) {
    log_error("kv disk tier: cannot use {} ({}); the tier is off", folder_.string(), ec.message());
    return;
  }
  enabled_ = true;
  index_existing();
}

std::filesystem::path DiskKvTier::path_of(uint64_t key) const { return folder_ / (hex16(key) + kSuffix); }

int64_t DiskKvTier::now_seconds() const {
  return std::chrono::duration_cast<std::chrono::seconds>(now_().time_since_epoch()).count();
}

void DiskKvTier::index_existing() {
  std::lock_guard lock(mutex_);
  std::vector<std::tuple<std::filesystem::file_time_type, uint64_t, uint64_t>> found;  // mtime, key, bytes
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder_, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code fec;
    if (name.rfind(kTempPrefix, 0) == 0) {
      // Left by a writer that died before its rename: never a block.
      std::filesystem::remove(entry.path(), fec);
      continue;
    }
    uint64_t key;
    if (name.size() != 16 + std::strlen(kSuffix) || name.substr(16) != kSuffix || !parse_hex16(name.substr(0, 16), key)) {
      continue;
    }
    const uint64_t bytes = entry.file_size(fec);
    const auto mtime = entry.last_write_time(fec);
    if (!fec) found.emplace_back(mtime, key, bytes);
  }
  if (ec) log_error("kv disk tier: listing {} failed ({})", folder_.string(), ec.message());
  std::sort(found.begin(), found.end());
  for (const auto& [mtime, key, bytes] : found) {  // oldest first, so the newest ends at the front
    lru_.push_front(key);
    index_[key] = Entry{bytes, -1, lru_.begin()};  // expiry read when first met
    bytes_ += bytes;
  }
  make_room(0);
  if (!found.empty()) log_info("kv disk tier: {} blocks ({:.1f} MiB) found in {}", index_.size(), bytes_ / 1048576.0, folder_.string());
}

void DiskKvTier::touch(Entry& e, uint64_t key) {
  lru_.erase(e.lru);
  lru_.push_front(key);
  e.lru = lru_.begin();
}

void DiskKvTier::forget(uint64_t key, bool remove_file) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    bytes_ -= it->second.bytes;
    lru_.erase(it->second.lru);
    index_.erase(it);
  }
  if (remove_file) {
    std::error_code ec;
    std::filesystem::remove(path_of(key), ec);
  }
}

void DiskKvTier::make_room(uint64_t bytes) {
  while (!lru_.empty() && bytes_ + bytes > options_.capacity_bytes) {
    forget(lru_.back(), true);
    ++stats_.evictions;
  }
}

bool DiskKvTier::put(const KvBlockIdentity& id, std::span<const std::byte> payload, std::chrono::seconds ttl) {
  if (!enabled_) return false;
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.fingerprint = fingerprint_hash_;
  h.key = id.key;
  h.parent_key = id.first ? 0 : id.parent_key;
  h.flags = id.first ? kFirstBlock : 0;
  h.n_tokens = static_cast<uint32_t>(id.tokens.size());
  h.salt_bytes = id.first ? static_cast<uint32_t>(id.salt.size()) : 0;
  h.payload_bytes = payload.size();
  if (h.salt_bytes > kMaxSaltBytes || h.n_tokens > kMaxTokens) return false;
  const uint64_t file_bytes = sizeof h + h.salt_bytes + id.tokens.size_bytes() + payload.size();
  if (file_bytes > options_.capacity_bytes) return false;
  uint64_t serial = 0;
  {
    // File I/O happens outside the lock: lookups (contains, the engine
    // thread) never wait for a write.
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(id.key); it != index_.end()) {
      touch(it->second, id.key);
      return true;
    }
    if (!writing_.insert(id.key).second) return true;  // another thread is writing it
    h.expires_at = ttl.count() > 0 ? now_seconds() + ttl.count() : 0;
    serial = temp_counter_++;
  }
  std::vector<std::byte> file(file_bytes);
  std::byte* p = file.data() + sizeof h;
  if (h.salt_bytes) std::memcpy(p, id.salt.data(), h.salt_bytes);
  p += h.salt_bytes;
  if (!id.tokens.empty()) std::memcpy(p, id.tokens.data(), id.tokens.size_bytes());
  p += id.tokens.size_bytes();
  if (!payload.empty()) std::memcpy(p, payload.data(), payload.size());
  std::memcpy(file.data(), &h, sizeof h);
  h.checksum = file_checksum(file);
  std::memcpy(file.data(), &h, sizeof h);

  // Written under a temporary name and renamed: readers (this process or
  // another sharing the directory) see the whole block or none of it.
  const std::filesystem::path temp =
      folder_ / (kTempPrefix + hex16(id.key) + "-" + std::to_string(getpid()) + "-" + std::to_string(serial));
  std::FILE* f = std::fopen(temp.c_str(), "wb");
  bool ok = f != nullptr;
  int err = ok ? 0 : errno;
  if (ok) {
    ok = std::fwrite(file.data(), 1, file.size(), f) == file.size();
    if (!ok) err = errno;
    if (std::fclose(f) != 0 && ok) ok = false, err = errno;
  }
  std::error_code ec;
  if (ok) {
    std::filesystem::rename(temp, path_of(id.key), ec);
    ok = !ec;
  }
  if (!ok) std::filesystem::remove(temp, ec);
  std::lock_guard lock(mutex_);
  writing_.erase(id.key);
  if (!ok) {
    // The first failure and then one in a thousand: a full disk fails every write.
    if (stats_.write_errors++ % 1000 == 0) {
      log_error("kv disk tier: writing a block to {} failed ({}); the block stays uncached", folder_.string(),
                err ? std::strerror(err) : ec.message());
    }
    return false;
  }
  make_room(file.size());
  lru_.push_front(id.key);
  index_[id.key] = Entry{file.size(), h.expires_at, lru_.begin()};
  bytes_ += file.size();
  ++stats_.stored;
  stats_.bytes_written += static_cast<int64_t>(file.size());
  return true;
}

bool DiskKvTier::get(const KvBlockIdentity& id, std::span<std::byte> out, int64_t* expires_at) {
  if (!enabled_) return false;
  {
    std::lock_guard lock(mutex_);
    auto it = index_.find(id.key);
    if (it != index_.end() && it->second.expires_at > 0 && now_seconds() >= it->second.expires_at) {
      forget(id.key, true);
      ++stats_.expirations;
      ++stats_.misses;
      return false;
    }
  }
  // Read without the lock (a key missing from the index may still have been
  // written by another process sharing the directory: the file decides).
  const ReadOutcome r = read_block(id, out);
  std::lock_guard lock(mutex_);
  auto it = index_.find(id.key);
  switch (r.result) {
    case ReadResult::Missing:
      if (it != index_.end()) forget(id.key, false);  // deleted behind our back
      ++stats_.misses;
      return false;
    case ReadResult::Damaged:
      forget(id.key, true);
      ++stats_.rejected;
      ++stats_.misses;
      log_warn("kv disk tier: removed a damaged block file {}", path_of(id.key).string());
      return false;
    case ReadResult::Expired:
      forget(id.key, true);
      ++stats_.expirations;
      ++stats_.misses;
      return false;
    case ReadResult::Other:
    case ReadResult::Hit:
      break;
  }
  if (it == index_.end()) {
    lru_.push_front(id.key);
    it = index_.emplace(id.key, Entry{r.file_bytes, r.expires_at, lru_.begin()}).first;
    bytes_ += r.file_bytes;
    make_room(0);
    it = index_.find(id.key);
    if (it == index_.end()) {  // evicted at once: the tier is smaller than this block
      ++stats_.misses;
      return false;
    }
  }
  it->second.expires_at = r.expires_at;
  if (r.result == ReadResult::Other) {  // a hash collision or another layout: not ours, but not damaged either
    ++stats_.misses;
    return false;
  }
  if (expires_at != nullptr) *expires_at = r.expires_at;
  touch(it->second, id.key);
  ++stats_.hits;
  stats_.bytes_read += static_cast<int64_t>(r.file_bytes);
  return true;
}

DiskKvTier::ReadOutcome DiskKvTier::read_block(const KvBlockIdentity& id, std::span<std::byte> out) const {
  ReadOutcome r;
  std::FILE* f = std::fopen(path_of(id.key).c_str(), "rb");
  if (f == nullptr) return r;  // Missing
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  r.result = ReadResult::Damaged;
  if (std::fseek(f, 0, SEEK_END) != 0) return r;
  const long size = std::ftell(f);
  if (size < 0 || std::fseek(f, 0, SEEK_SET) != 0) return r;
  r.file_bytes = static_cast<uint64_t>(size);
  FileHeader h;
  if (r.file_bytes < sizeof h || std::fread(&h, 1, sizeof h, f) != sizeof h) return r;
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.fingerprint != fingerprint_hash_ || h.key != id.key ||
      h.salt_bytes > kMaxSaltBytes || h.n_tokens > kMaxTokens || h.payload_bytes > r.file_bytes ||  // no wrap below
      r.file_bytes != sizeof h + h.salt_bytes + uint64_t{h.n_tokens} * sizeof(int32_t) + h.payload_bytes) {
    return r;
  }
  // Identity and payload: the payload straight into `out` when its size is
  // the caller's, else into scratch (another layout: checked, never returned).
  std::vector<std::byte> meta(h.salt_bytes + uint64_t{h.n_tokens} * sizeof(int32_t));
  std::vector<std::byte> scratch;
  std::span<std::byte> payload = out;
  if (h.payload_bytes != out.size()) {
    scratch.resize(h.payload_bytes);
    payload = scratch;
  }
  if (std::fread(meta.data(), 1, meta.size(), f) != meta.size() ||
      std::fread(payload.data(), 1, payload.size(), f) != payload.size()) {
    return r;
  }
  FileHeader zeroed = h;
  zeroed.checksum = 0;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, &zeroed, sizeof zeroed);
  XXH3_64bits_update(state, meta.data(), meta.size());
  XXH3_64bits_update(state, payload.data(), payload.size());
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (sum != h.checksum) return r;  // Damaged (out may hold garbage: the caller discards it)
  r.expires_at = h.expires_at;
  if (h.expires_at > 0 && now_seconds() >= h.expires_at) {
    r.result = ReadResult::Expired;
    return r;
  }
  // The content check: the same tokens after the same parent (or salt).
  const std::byte* salt = meta.data();
  const std::byte* tokens = salt + h.salt_bytes;
  const bool first = (h.flags & kFirstBlock) != 0;
  const bool same = first == id.first && h.n_tokens == id.tokens.size() && h.payload_bytes == out.size() &&
                    (first ? h.salt_bytes == id.salt.size() && std::memcmp(salt, id.salt.data(), id.salt.size()) == 0
                           : h.parent_key == id.parent_key) &&
                    (id.tokens.empty() || std::memcmp(tokens, id.tokens.data(), id.tokens.size_bytes()) == 0);
  r.result = same ? ReadResult::Hit : ReadResult::Other;
  return r;
}

std::pair<int64_t, double> DiskKvTier::measure_reads(int max_files) const {
  if (!enabled_) return {0, 0.0};
  std::vector<uint64_t> keys;
  {
    // Spread over the whole index, not only the most recent files (the ones
    // most likely still in the page cache).
    std::lock_guard lock(mutex_);
    const size_t stride = std::max<size_t>(1, lru_.size() / static_cast<size_t>(std::max(max_files, 1)));
    size_t i = 0;
    for (auto it = lru_.begin(); it != lru_.end() && static_cast<int>(keys.size()) < max_files; ++it, ++i) {
      if (i % stride == 0) keys.push_back(*it);
    }
  }
  std::vector<char> buf(size_t{1} << 20);
  int64_t bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t key : keys) {
    std::FILE* f = std::fopen(path_of(key).c_str(), "rb");
    if (f == nullptr) continue;
    for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), f)) > 0;) bytes += static_cast<int64_t>(n);
    std::fclose(f);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return {bytes, ms};
}

bool DiskKvTier::contains(uint64_t key) const {
  std::lock_guard lock(mutex_);
  return index_.count(key) != 0;
}

bool DiskKvTier::discover(uint64_t key) {
  if (!enabled_) return false;
  if (contains(key)) return true;
  std::error_code ec;
  const std::filesystem::path path = path_of(key);
  const uint64_t bytes = std::filesystem::file_size(path, ec);  // no lock held: one stat
  if (ec) return false;
  std::lock_guard lock(mutex_);
  if (index_.count(key) != 0) return true;
  lru_.push_front(key);
  index_[key] = Entry{bytes, -1, lru_.begin()};  // expiry read when first met, as for indexed files
  bytes_ += bytes;
  make_room(0);
  return index_.count(key) != 0;
}

void DiskKvTier::remove_expired() {
  if (!enabled_) return;
  // Expiries not known yet (files indexed at start-up) are read from the
  // headers without the lock held.
  std::vector<uint64_t> unknown;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, e] : index_) {
      if (e.expires_at < 0) unknown.push_back(key);
    }
  }
  std::vector<std::pair<uint64_t, int64_t>> read;
  read.reserve(unknown.size());
  for (uint64_t key : unknown) {
    FileHeader h;
    std::FILE* f = std::fopen(path_of(key).c_str(), "rb");
    const bool ok = f != nullptr && std::fread(&h, 1, sizeof h, f) == sizeof h;
    if (f != nullptr) std::fclose(f);
    read.emplace_back(key, ok ? h.expires_at : 0);
  }
  std::lock_guard lock(mutex_);
  for (const auto& [key, expires_at] : read) {
    if (auto it = index_.find(key); it != index_.end() && it->second.expires_at < 0) it->second.expires_at = expires_at;
  }
  const int64_t now = now_seconds();
  std::vector<uint64_t> expired;
  for (const auto& [key, e] : index_) {
    if (e.expires_at > 0 && now >= e.expires_at) expired.push_back(key);
  }
  for (uint64_t key : expired) forget(key, true);
  stats_.expirations += static_cast<int64_t>(expired.size());
}

DiskKvTierStats DiskKvTier::stats() const {
  std::lock_guard lock(mutex_);
  DiskKvTierStats s = stats_;
  s.files = static_cast<int64_t>(index_.size());
  s.bytes = static_cast<int64_t>(bytes_);
  return s;
}

}  // namespace deepinfer
