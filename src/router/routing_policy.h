// Where the router sends a request among the backends that can take it.
//
// PrefixAffinity estimates what each backend's prefix cache holds: the
// routing text of a request (its messages or prompt, as JSON text) is cut
// into fixed-size chunks, each named by a hash chained over the chunks before
// it, and every backend remembers (least recently used first out, bounded)
// the chunk hashes of the requests it was sent. A new request matches a
// backend by the number of its leading chunks that backend has seen: the
// prompt prefix that backend most likely still caches. Text, not tokens: the
// router never loads a tokenizer, and equal text prefixes give equal token
// prefixes up to the last chunk boundary, which is all an estimate needs.
//
// Policies:
//   round_robin  each request to the next backend in turn;
//   least_load   to the backend with the fewest requests in flight;
//   cache_aware  to the backend with the longest match, unless that backend
//                carries more than `balance_abs` requests over the least
//                loaded one (then the least loaded, longest match first):
//                affinity where it is cheap, balance where it is not.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deepinfer::router {

enum class RoutingPolicy : uint8_t { RoundRobin, LeastLoad, CacheAware };
RoutingPolicy parse_routing_policy(const std::string& name);  // throws deepinfer::Error
const char* routing_policy_name(RoutingPolicy policy);

// The chained chunk hashes of a routing text (full chunks only).
std::vector<uint64_t> prefix_chunk_hashes(std::string_view text, size_t chunk_bytes);

class PrefixAffinity {
 public:
  // capacity: chunk hashes remembered per backend.
  explicit PrefixAffinity(size_t capacity) : capacity_(capacity) {}
  // Leading chunks of `chunks` that backend `backend` has seen.
  size_t match(size_t backend, const std::vector<uint64_t>& chunks) const;
  // Records that `backend` was sent (and so now caches) these chunks.
  void insert(size_t backend, const std::vector<uint64_t>& chunks);
  // Forgets a backend's chunks (it restarted: its cache is empty).
  void clear(size_t backend);

 private:
  struct Seen {
    std::list<uint64_t> lru;  // front = most recent
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
  };
  size_t capacity_;
  std::vector<Seen> seen_;  // per backend index
};

struct Candidate {
  size_t backend = 0;  // the pool's index
  int64_t load = 0;    // requests in flight on it
};

struct RoutingChoice {
  size_t backend = 0;
  size_t matched_chunks = 0;  // of the chosen backend
};

// Chooses among candidates (non-empty) and, for cache_aware, records the
// request's chunks with the chosen backend. Thread-safe.
class Router {
 public:
  Router(RoutingPolicy policy, int64_t balance_abs, size_t affinity_capacity)
      : policy_(policy), balance_abs_(balance_abs), affinity_(affinity_capacity) {}
  RoutingPolicy policy() const { return policy_; }
  RoutingChoice choose(const std::vector<Candidate>& candidates, const std::vector<uint64_t>& chunks);
  void forget_backend(size_t backend);

 private:
  RoutingPolicy policy_;
  int64_t balance_abs_;
  std::mutex mutex_;
  PrefixAffinity affinity_;
  uint64_t next_ = 0;  // round robin
};

}  // namespace deepinfer::router
