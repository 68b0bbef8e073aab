// Suffix decoding's tree: a counted trie of every substring of length at most
// max_depth of the sequences it holds (a suffix tree truncated at max_depth).
// A node is a substring; its count is how often that substring occurs as a
// contiguous run. The counts of a node's children are then an empirical
// next-token distribution after that substring, which drafting walks greedily.
//
// Sequences grow one accepted token at a time, so the trie is built online:
// each sequence remembers the nodes of its suffixes of length 1..max_depth-1,
// and appending a token moves each one to its child (O(max_depth) per token,
// independent of how much the tree holds). Sequences can also be removed
// again, which is what lets a shared cache of finished outputs stay bounded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "spec/child_table.h"
#include "spec/draft.h"

namespace deepinfer::spec {

struct SuffixProposeConfig {
  int32_t min_match = 2;     // shortest context suffix a draft may continue
  int32_t max_match = 16;    // longest context suffix tried (capped at max_depth - 1)
  int32_t max_tokens = 5;    // draft tokens at most
  float min_prob = 0.1f;     // stop once the draft's cumulative probability falls below this
};

// Throws deepinfer::Error when the fields are out of range.
void check_propose_config(const SuffixProposeConfig& config);

class SuffixTree {
 public:
  explicit SuffixTree(int32_t max_depth);

  // A new, empty sequence; the handle stays valid until remove_sequence.
  int32_t add_sequence();
  // Extends the sequence; every new substring occurrence ending at a new token is counted.
  void append(int32_t seq, std::span<const int32_t> tokens);
  void append(int32_t seq, int32_t token) { append(seq, std::span<const int32_t>(&token, 1)); }
  // Takes back every count the sequence added and frees the nodes left at zero.
  void remove_sequence(int32_t seq);

  // Drafts a continuation of `context` (see the .cpp for the rule) into `out`;
  // returns the length of the context suffix it continues, 0 when none
  // matched (then `out` is empty; it can also be empty after a match, when
  // even the first token is less likely than min_prob).
  int32_t propose(std::span<const int32_t> context, const SuffixProposeConfig& config, Draft& out) const;
  // The same as propose(tokens(seq), ...) for a sequence this tree holds, but
  // each candidate suffix's node comes from the sequence's own suffix list
  // instead of a walk from the root.
  int32_t propose_after(int32_t seq, const SuffixProposeConfig& config, Draft& out) const;

  // How often `substring` occurs in the held sequences; 0 when it is empty,
  // absent or longer than max_depth (such substrings are not counted).
  int32_t count(std::span<const int32_t> substring) const;
  std::span<const int32_t> tokens(int32_t seq) const;

  int32_t max_depth() const { return max_depth_; }
  // Live nodes besides the root: the tree's memory is proportional to this.
  size_t num_nodes() const { return nodes_.size() - 1 - free_nodes_; }
  // Tokens of all live sequences together.
  int64_t num_tokens() const { return num_tokens_; }
  int32_t num_sequences() const { return live_sequences_; }

 private:
  static constexpr int32_t kNone = -1;
  static constexpr int32_t kRoot = 0;

  struct Node {
    int32_t token = 0;
    int32_t parent = kNone;
    int32_t count = 0;
    // Children form a doubly linked list so a freed child unlinks in O(1);
    // a free node's next_sibling links the free list.
    int32_t first_child = kNone;
    int32_t next_sibling = kNone;
    int32_t prev_sibling = kNone;
  };
  struct Sequence {
    bool live = false;
    std::vector<int32_t> tokens;
    // suffix_nodes[L - 1]: the node of the sequence's last L tokens, for
    // L = 1..min(size, max_depth - 1) (a suffix of max_depth tokens cannot grow).
    std::vector<int32_t> suffix_nodes;
  };

  int32_t child(int32_t parent, int32_t token) const { return children_.find(parent, token); }
  // The longest suffix length in [min_match, longest] whose node
  // (node_of(len), kNone when absent) has a continuation, and that node;
  // {0, kNone} when none has.
  template <typename NodeOf>
  std::pair<int32_t, int32_t> longest_continued(int32_t min_match, int32_t longest, NodeOf node_of) const;
  // Drafts by walking down the most frequent continuation from `node`.
  void walk(int32_t node, const SuffixProposeConfig& config, Draft& out) const;
  // The child of `parent` for `token`, created with count 0 if absent.
  int32_t child_or_new(int32_t parent, int32_t token);
  void free_node(int32_t node);
  void check_handle(int32_t seq) const;  // throws on a removed or unknown handle
  Sequence& live_sequence(int32_t seq);
  const Sequence& live_sequence(int32_t seq) const;

  int32_t max_depth_;
  std::vector<Node> nodes_;  // nodes_[0] is the root (the empty substring)
  ChildTable children_;  // (parent, token) -> child
  int32_t free_head_ = kNone;
  size_t free_nodes_ = 0;
  std::vector<Sequence> sequences_;
  std::vector<int32_t> free_handles_;
  int32_t live_sequences_ = 0;
  int64_t num_tokens_ = 0;
};

}  // namespace deepinfer::spec
