#include "router/routing_policy.h"

#include <xxhash.h>

#include <algorithm>

#include "core/error.h"

namespace deepinfer::router {

RoutingPolicy parse_routing_policy(const std::string& name) {
  if (name == "round_robin") return RoutingPolicy::RoundRobin;
  if (name == "least_load") return RoutingPolicy::LeastLoad;
  if (name == "cache_aware") return RoutingPolicy::CacheAware;
  fail("unknown routing policy '{}' (round_robin, least_load, cache_aware)", name);
}

const char* routing_policy_name(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::RoundRobin: return "round_robin";
    case RoutingPolicy::LeastLoad: return "least_load";
    case RoutingPolicy::CacheAware: break;
  }
  return "cache_aware";
}

std::vector<uint64_t> prefix_chunk_hashes(std::string_view text, size_t chunk_bytes) {
  std::vector<uint64_t> out;
  if (chunk_bytes == 0) return out;
  out.reserve(text.size() / chunk_bytes);
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t at = 0; at + chunk_bytes <= text.size(); at += chunk_bytes) {
    h = XXH3_64bits_withSeed(text.data() + at, chunk_bytes, h);
    out.push_back(h);
  }
  return out;
}

size_t PrefixAffinity::match(size_t backend, const std::vector<uint64_t>& chunks) const {
  if (backend >= seen_.size()) return 0;
  const Seen& s = seen_[backend];
  size_t n = 0;
  while (n < chunks.size() && s.where.count(chunks[n]) != 0) ++n;
  return n;
}

void PrefixAffinity::insert(size_t backend, const std::vector<uint64_t>& chunks) {
  if (backend >= seen_.size()) seen_.resize(backend + 1);
  Seen& s = seen_[backend];
  // Later chunks first, so the leading ones end most recent: a prefix shared by
  // many requests outlives their tails.
  for (auto it = chunks.rbegin(); it != chunks.rend(); ++it) {
    auto found = s.where.find(*it);
    if (found != s.where.end()) s.lru.erase(found->second);
    s.lru.push_front(*it);
    s.where[*it] = s.lru.begin();
  }
  while (s.lru.size() > capacity_) {
    s.where.erase(s.lru.back());
    s.lru.pop_back();
  }
}

void PrefixAffinity::clear(size_t backend) {
  if (backend < seen_.size()) seen_[backend] = Seen{};
}

RoutingChoice Router::choose(const std::vector<Candidate>& candidates, const std::vector<uint64_t>& chunks) {
  DI_CHECK(!candidates.empty(), "routing among no backends");
  std::lock_guard lock(mutex_);
  if (policy_ == RoutingPolicy::RoundRobin) {
    const Candidate& c = candidates[next_++ % candidates.size()];
    return {c.backend, 0};
  }
  int64_t min_load = candidates.front().load;
  for (const Candidate& c : candidates) min_load = std::min(min_load, c.load);
  // Scanned from a rotating start, so equal candidates (no match, same load:
  // new conversations on an idle pool) take turns instead of piling on one.
  const size_t start = next_++ % candidates.size();
  size_t best = start;
  size_t best_match = 0;
  for (size_t k = 0; k < candidates.size(); ++k) {
    const size_t i = (start + k) % candidates.size();
    const Candidate& c = candidates[i];
    const size_t m = policy_ == RoutingPolicy::CacheAware ? affinity_.match(c.backend, chunks) : 0;
    // Affinity only within the load budget; among equals, the lighter backend.
    const bool within = c.load <= min_load + balance_abs_;
    const Candidate& b = candidates[best];
    const bool best_within = b.load <= min_load + balance_abs_;
    bool better;
    if (within != best_within) {
      better = within;
    } else if (m != best_match) {
      better = m > best_match;
    } else {
      better = c.load < b.load;
    }
    if (k == 0 || better) {
      best = i;
      best_match = m;
    }
  }
  const size_t chosen = candidates[best].backend;
  if (policy_ == RoutingPolicy::CacheAware) affinity_.insert(chosen, chunks);
  return {chosen, best_match};
}

void Router::forget_backend(size_t backend) {
  std::lock_guard lock(mutex_);
  affinity_.clear(backend);
}

}  // namespace deepinfer::router
