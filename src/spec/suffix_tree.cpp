#include "spec/suffix_tree.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace deepinfer::spec {

void check_propose_config(const SuffixProposeConfig& c) {
  DI_CHECK(c.min_match >= 1 && c.max_match >= c.min_match,
           "suffix drafting: need 1 <= min_match <= max_match, got {} and {}", c.min_match, c.max_match);
  DI_CHECK(c.max_tokens >= 0, "suffix drafting: max_tokens must be >= 0, got {}", c.max_tokens);
  DI_CHECK(c.min_prob >= 0.0f && c.min_prob <= 1.0f, "suffix drafting: min_prob must be in [0, 1], got {}",
           c.min_prob);
}

SuffixTree::SuffixTree(int32_t max_depth) : max_depth_(max_depth) {
  DI_CHECK(max_depth >= 2 && max_depth <= 256, "suffix tree: max_depth must be in [2, 256], got {}", max_depth);
  nodes_.emplace_back();  // the root
}

void SuffixTree::check_handle(int32_t seq) const {
  DI_CHECK(seq >= 0 && static_cast<size_t>(seq) < sequences_.size() && sequences_[static_cast<size_t>(seq)].live,
           "suffix tree: no sequence with handle {}", seq);
}

SuffixTree::Sequence& SuffixTree::live_sequence(int32_t seq) {
  check_handle(seq);
  return sequences_[static_cast<size_t>(seq)];
}

const SuffixTree::Sequence& SuffixTree::live_sequence(int32_t seq) const {
  check_handle(seq);
  return sequences_[static_cast<size_t>(seq)];
}

std::span<const int32_t> SuffixTree::tokens(int32_t seq) const { return live_sequence(seq).tokens; }

int32_t SuffixTree::add_sequence() {
  int32_t seq;
  if (!free_handles_.empty()) {
    seq = free_handles_.back();
    free_handles_.pop_back();
  } else {
    DI_CHECK(sequences_.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
             "suffix tree: too many sequences");
    seq = static_cast<int32_t>(sequences_.size());
    sequences_.emplace_back();
  }
  sequences_[static_cast<size_t>(seq)].live = true;
  ++live_sequences_;
  return seq;
}

int32_t SuffixTree::child_or_new(int32_t parent, int32_t token) {
  if (const int32_t existing = children_.find(parent, token); existing != kNone) return existing;
  int32_t node;
  if (free_head_ != kNone) {
    node = free_head_;
    free_head_ = nodes_[static_cast<size_t>(node)].next_sibling;
    --free_nodes_;
  } else {
    DI_CHECK(nodes_.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
             "suffix tree: node limit reached");
    node = static_cast<int32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = nodes_[static_cast<size_t>(node)];
  Node& p = nodes_[static_cast<size_t>(parent)];
  n = Node{.token = token, .parent = parent, .count = 0, .first_child = kNone, .next_sibling = p.first_child,
           .prev_sibling = kNone};
  if (p.first_child != kNone) nodes_[static_cast<size_t>(p.first_child)].prev_sibling = node;
  p.first_child = node;
  children_.insert(parent, token, node);
  return node;
}

void SuffixTree::free_node(int32_t node) {
  Node& n = nodes_[static_cast<size_t>(node)];
  // Callers free children before parents, so a node at count 0 has none left.
  children_.erase(n.parent, n.token);
  if (n.prev_sibling != kNone) {
    nodes_[static_cast<size_t>(n.prev_sibling)].next_sibling = n.next_sibling;
  } else {
    nodes_[static_cast<size_t>(n.parent)].first_child = n.next_sibling;
  }
  if (n.next_sibling != kNone) nodes_[static_cast<size_t>(n.next_sibling)].prev_sibling = n.prev_sibling;
  n = Node{};
  n.next_sibling = free_head_;
  free_head_ = node;
  ++free_nodes_;
}

void SuffixTree::append(int32_t seq, std::span<const int32_t> tokens) {
  Sequence& s = live_sequence(seq);
  for (int32_t token : tokens) {
    // The substrings ending at the new token are the old suffixes (and the
    // empty one, the root) extended by it. Going from the longest down lets
    // suffix_nodes be updated in place: slot L - 1 is read before it is overwritten.
    const int32_t kept = static_cast<int32_t>(s.suffix_nodes.size());
    if (kept < max_depth_ - 1) s.suffix_nodes.push_back(kNone);
    for (int32_t len = kept + 1; len >= 1; --len) {
      const int32_t parent = len == 1 ? kRoot : s.suffix_nodes[static_cast<size_t>(len - 2)];
      const int32_t node = child_or_new(parent, token);
      ++nodes_[static_cast<size_t>(node)].count;
      if (len <= max_depth_ - 1) s.suffix_nodes[static_cast<size_t>(len - 1)] = node;
    }
    s.tokens.push_back(token);
    ++num_tokens_;
  }
}

void SuffixTree::remove_sequence(int32_t seq) {
  Sequence& s = live_sequence(seq);
  // Every occurrence the sequence added is (start p, length L <= max_depth):
  // the path from the root along tokens[p..]. Undo one start at a time,
  // deepest node first; a child's count never exceeds its parent's, so a node
  // that reaches 0 has already lost all its children.
  std::vector<int32_t> path;
  path.reserve(static_cast<size_t>(max_depth_));
  const size_t size = s.tokens.size();
  for (size_t p = 0; p < size; ++p) {
    path.clear();
    int32_t node = kRoot;
    for (size_t i = p; i < size && path.size() < static_cast<size_t>(max_depth_); ++i) {
      node = child(node, s.tokens[i]);
      path.push_back(node);
    }
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      if (--nodes_[static_cast<size_t>(*it)].count == 0) free_node(*it);
    }
  }
  num_tokens_ -= static_cast<int64_t>(size);
  s = Sequence{};
  free_handles_.push_back(seq);
  --live_sequences_;
}

int32_t SuffixTree::count(std::span<const int32_t> substring) const {
  if (substring.empty() || substring.size() > static_cast<size_t>(max_depth_)) return 0;
  int32_t node = kRoot;
  for (int32_t token : substring) {
    node = child(node, token);
    if (node == kNone) return 0;
  }
  return nodes_[static_cast<size_t>(node)].count;
}

template <typename NodeOf>
std::pair<int32_t, int32_t> SuffixTree::longest_continued(int32_t min_match, int32_t longest, NodeOf node_of) const {
  // "Suffix of length L occurred followed by some t" implies the same for
  // every shorter suffix (it occurs inside that run, still within max_depth),
  // so the lengths that qualify form a prefix [1, best]: binary search for
  // best instead of a lookup per length.
  int32_t lo = min_match, hi = longest, best = 0, node = kNone;
  while (lo <= hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    const int32_t found = node_of(mid);
    if (found != kNone && nodes_[static_cast<size_t>(found)].first_child != kNone) {
      best = mid;
      node = found;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return {best, node};
}

int32_t SuffixTree::propose(std::span<const int32_t> context, const SuffixProposeConfig& config,
                            Draft& out) const {
  check_propose_config(config);
  out.clear();
  const int32_t n = static_cast<int32_t>(context.size());
  const int32_t longest = std::min({config.max_match, max_depth_ - 1, n});
  if (longest < config.min_match) return 0;
  const auto [best, node] = longest_continued(config.min_match, longest, [&](int32_t len) {
    int32_t at = kRoot;
    for (int32_t i = n - len; i < n && at != kNone; ++i) at = child(at, context[static_cast<size_t>(i)]);
    return at;
  });
  if (best > 0) walk(node, config, out);
  return best;
}

int32_t SuffixTree::propose_after(int32_t seq, const SuffixProposeConfig& config, Draft& out) const {
  check_propose_config(config);
  out.clear();
  const Sequence& s = live_sequence(seq);
  const int32_t longest = std::min({config.max_match, static_cast<int32_t>(s.suffix_nodes.size())});
  if (longest < config.min_match) return 0;
  const auto [best, node] = longest_continued(config.min_match, longest,
                                              [&](int32_t len) { return s.suffix_nodes[static_cast<size_t>(len - 1)]; });
  if (best > 0) walk(node, config, out);
  return best;
}

void SuffixTree::walk(int32_t node, const SuffixProposeConfig& config, Draft& out) const {
  // Greedy walk down the most frequent continuation. Counts under a node on
  // the context's own path include only earlier occurrences' continuations
  // (the latest occurrence has none yet), which is the distribution wanted.
  float path_prob = 1.0f;
  while (out.size() < config.max_tokens) {
    int64_t total = 0;
    int32_t pick = kNone;
    for (int32_t c = nodes_[static_cast<size_t>(node)].first_child; c != kNone;
         c = nodes_[static_cast<size_t>(c)].next_sibling) {
      const Node& cn = nodes_[static_cast<size_t>(c)];
      total += cn.count;
      if (pick == kNone) {
        pick = c;
        continue;
      }
      const Node& pn = nodes_[static_cast<size_t>(pick)];
      // Ties go to the smaller token so the draft does not depend on insertion order.
      if (cn.count > pn.count || (cn.count == pn.count && cn.token < pn.token)) pick = c;
    }
    if (pick == kNone) break;  // nothing followed, or the walk reached max_depth
    const float prob = static_cast<float>(nodes_[static_cast<size_t>(pick)].count) / static_cast<float>(total);
    path_prob *= prob;
    if (path_prob < config.min_prob) break;
    out.tokens.push_back(nodes_[static_cast<size_t>(pick)].token);
    out.confidence.push_back(std::clamp(prob, 0.01f, 0.99f));
    node = pick;
  }
}

}  // namespace deepinfer::spec
