// Suffix decoding: drafts from two suffix trees. Each live request has its own
// tree over its prompt and outputs (it catches the request repeating itself
// or its input, like prompt lookup but with frequencies), and one global tree
// holds the outputs of recently finished requests (it catches the workload
// repeating itself across requests: agents re-emitting the same tool calls,
// templated answers). Per step the draft with the larger expected number of
// accepted tokens wins.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "spec/draft.h"
#include "spec/suffix_tree.h"

namespace deepinfer::spec {

struct SuffixConfig {
  int32_t max_depth = 24;  // longest substring counted, in both kinds of tree
  SuffixProposeConfig propose{};
  // Output tokens of finished requests the global tree keeps, oldest evicted
  // first; 0 disables the global tree.
  int64_t global_max_tokens = 1 << 20;
};

// Throws deepinfer::Error naming the field that is out of range.
void check_suffix_config(const SuffixConfig& config);

// The number of draft tokens expected to be accepted if acceptance stops at
// the first rejection: sum over i of the product of confidences up to i.
float expected_accepted(const Draft& draft);

// Which tree a proposal came from.
enum class SuffixSource : uint8_t { None, Request, Global };

class SuffixProposer {
 public:
  explicit SuffixProposer(SuffixConfig config);

  // A request's lifetime: its prompt, then each batch of accepted output
  // tokens, then finish (which also hands its output to the global tree).
  void start(uint64_t request_id, std::span<const int32_t> prompt);
  void append(uint64_t request_id, std::span<const int32_t> tokens);
  void finish(uint64_t request_id);
  // finish() in two halves, for a caller that fills the global tree on
  // another thread: release() forgets the request and returns the output
  // tokens the global tree should take (empty when it is disabled), and
  // add_global() adds them. add_global() touches the global tree only, so it
  // may run concurrently with start/append/release and with propose() told
  // not to read the global tree.
  std::vector<int32_t> release(uint64_t request_id);
  void add_global(std::span<const int32_t> output);

  // Up to min(max_tokens, config.propose.max_tokens) tokens that would follow
  // the request's sequence; returns the tree they came from (None: `out` is
  // empty). use_global: also consult the global tree.
  SuffixSource propose(uint64_t request_id, int32_t max_tokens, Draft& out, bool use_global = true) const;

  const SuffixConfig& config() const { return config_; }
  size_t num_requests() const { return requests_.size(); }
  // What the global tree holds (0 when it is disabled).
  int64_t global_tokens() const { return global_.num_tokens(); }
  size_t global_nodes() const { return global_.num_nodes(); }

 private:
  struct Request {
    explicit Request(int32_t max_depth) : tree(max_depth) {}
    SuffixTree tree;  // holds one sequence: the prompt, then the outputs
    int32_t seq = 0;
    size_t prompt_size = 0;
  };
  Request& find(uint64_t request_id, const char* what);
  const Request& find(uint64_t request_id, const char* what) const;

  SuffixConfig config_;
  std::unordered_map<uint64_t, Request> requests_;
  SuffixTree global_;
  std::deque<int32_t> global_order_;  // the global tree's sequences, oldest first
};

}  // namespace deepinfer::spec
