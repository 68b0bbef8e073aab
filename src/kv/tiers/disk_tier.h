// DiskKvTier: KV blocks as files under a directory, the slowest and largest
// tier below the device pages (on a cluster the directory is a mount of a
// shared file system, so replicas and restarts share it).
//
// A block is addressed by its prefix-cache chain hash (prefix_cache.h) under
// a model fingerprint (a folder per fingerprint: a model never reads another
// model's, dtype's or layout's blocks). As in the prefix cache, the hash only
// finds the file: a hit is confirmed by content. Each file records the block's
// token ids and its parent block's hash (block 0: the cache salt), so a chain
// of hits verified from block 0 matches the prompt token for token.
//
// Integrity: a checksum over the whole file, written to a temporary name and
// renamed into place (a reader never sees half a block). A file that is torn,
// truncated, corrupted, expired or of another format is a miss and is removed.
// I/O failures (a full disk, a vanished or read-only directory) are logged and
// the block is simply not stored: the tier degrades, the caller carries on.
//
// Capacity: a byte limit with least-recently-used eviction, and a time to live
// per block (expired blocks are misses and are removed).
//
// Thread-safe, and no file is read or written under the lock: contains()
// answers at once while other threads write and read blocks.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace deepinfer {

// What a block's file must hold for a lookup to hit.
struct KvBlockIdentity {
  uint64_t key = 0;         // the block's chain hash
  uint64_t parent_key = 0;  // the previous block's chain hash; unused for block 0
  bool first = false;       // block 0 of its sequence: verified by salt instead of parent
  std::string_view salt;    // the request's cache salt (block 0 only)
  std::span<const int32_t> tokens;
};

struct DiskKvTierStats {
  int64_t hits = 0, misses = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  int64_t stored = 0;        // put() calls that wrote a file
  int64_t evictions = 0;     // files removed for capacity
  int64_t expirations = 0;   // files removed past their time to live
  int64_t rejected = 0;      // files removed as corrupt, truncated or not matching
  int64_t write_errors = 0;  // put() calls that failed on I/O
  int64_t files = 0, bytes = 0;  // what the tier holds now
};

class DiskKvTier {
 public:
  struct Options {
    std::filesystem::path dir;
    std::string fingerprint;  // names the model, its weights, the KV dtype and layout (the caller's words)
    uint64_t capacity_bytes = uint64_t{64} << 30;
  };

  // Creates the directory when missing and indexes the blocks already there
  // (left by earlier processes), removing leftover temporary files. Never
  // throws on I/O: an unusable directory leaves the tier disabled, logged.
  explicit DiskKvTier(Options options);

  bool enabled() const { return enabled_; }
  const std::filesystem::path& folder() const { return folder_; }

  // Stores a block (identity + payload) unless one with the same key is
  // present. ttl 0 = no expiry. Returns whether the block is now stored.
  bool put(const KvBlockIdentity& id, std::span<const std::byte> payload, std::chrono::seconds ttl);

  // Copies the block's payload into `out` when a file for id.key exists, is
  // intact, has not expired, matches id's content and holds out.size() bytes.
  // expires_at (optional) receives the block's expiry (Unix seconds, 0 = never).
  bool get(const KvBlockIdentity& id, std::span<std::byte> out, int64_t* expires_at = nullptr);

  // Whether the index lists the key (no file access, no verification).
  bool contains(uint64_t key) const;
  // contains(), or else whether another process sharing the directory has
  // written the block's file since this one indexed it (one stat; a file
  // found is indexed). How a decode engine finds the KV a prefill engine
  // exported (docs/router.md).
  bool discover(uint64_t key);

  // Reads up to max_files indexed files whole (no verification), timed:
  // {bytes read, milliseconds}, {0, 0} when there are none.
  std::pair<int64_t, double> measure_reads(int max_files) const;

  // Removes every expired block now (get() also removes the ones it meets).
  void remove_expired();

  DiskKvTierStats stats() const;

  // Seconds since the Unix epoch, overridable by tests.
  void set_clock_for_testing(std::chrono::system_clock::time_point (*now)()) { now_ = now; }

 private:
  struct Entry {
    uint64_t bytes = 0;
    int64_t expires_at = 0;  // Unix seconds; 0 = never
    std::list<uint64_t>::iterator lru;
  };

  enum class ReadResult : uint8_t { Missing, Damaged, Expired, Other, Hit };
  struct ReadOutcome {
    ReadResult result = ReadResult::Missing;
    uint64_t file_bytes = 0;
    int64_t expires_at = 0;
  };
  // Reads and verifies the block file (no lock held); the payload lands in
  // `out` when the file's payload has out's size.
  ReadOutcome read_block(const KvBlockIdentity& id, std::span<std::byte> out) const;

  std::filesystem::path path_of(uint64_t key) const;
  int64_t now_seconds() const;
  void index_existing();
  void forget(uint64_t key, bool remove_file);
  void make_room(uint64_t bytes);
  void touch(Entry& e, uint64_t key);

  Options options_;
  std::filesystem::path folder_;  // dir / fingerprint hash
  uint64_t fingerprint_hash_ = 0;
  bool enabled_ = false;
  std::chrono::system_clock::time_point (*now_)() = &std::chrono::system_clock::now;

  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Entry> index_;
  std::unordered_set<uint64_t> writing_;  // keys whose files put() is writing now
  std::list<uint64_t> lru_;  // front = most recently used
  uint64_t bytes_ = 0;
  uint64_t temp_counter_ = 0;
  DiskKvTierStats stats_;
};

}  // namespace deepinfer
