#include "spec/proposer.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "core/error.h"
#include "spec/suffix_proposer.h"

namespace deepinfer::spec {

void Proposer::propose_batch(std::span<const uint64_t> request_ids, std::span<const int32_t> max_tokens,
                             std::vector<Draft>& out) {
  out.resize(request_ids.size());
  for (size_t i = 0; i < request_ids.size(); ++i) propose(request_ids[i], max_tokens[i], out[i]);
}

NgramIndex& NgramProposer::index(uint64_t request_id) {
  auto it = indexes_.find(request_id);
  DI_CHECK(it != indexes_.end(), "n-gram proposer: unknown request {}", request_id);
  return it->second;
}

void NgramProposer::start(uint64_t request_id, std::span<const int32_t> prompt) {
  auto [it, fresh] = indexes_.try_emplace(request_id, config_);
  DI_CHECK(fresh, "n-gram proposer: request {} started twice", request_id);
  it->second.append(prompt);
}

void NgramProposer::append(uint64_t request_id, std::span<const int32_t> tokens) { index(request_id).append(tokens); }

void NgramProposer::propose(uint64_t request_id, int32_t max_tokens, Draft& out) {
  index(request_id).propose(max_tokens, out);
}

namespace {

// SuffixProposer keeps its own request table; this adapts it to the interface.
// The engine's suffix proposer. A finished request's outputs enter the
// global tree on a thread of its own: inserting 1,024 tokens at depth 24
// takes milliseconds, and a batch of 256 requests finishing together held
// the engine thread for over half a second. A proposal reads the global tree
// only when that thread is not writing it (and drafts from the request's own
// tree otherwise); outputs waiting beyond the global budget are dropped,
// oldest first, as the tree itself would evict them. Proposals for several
// requests may run at once (each reads its own tree, and the global one
// under a shared lock).
class SuffixDrafts final : public Proposer {
 public:
  explicit SuffixDrafts(SuffixConfig config) : proposer_(config), budget_(config.global_max_tokens) {
    if (budget_ > 0) worker_ = std::thread([this] { insert_loop(); });
  }
  ~SuffixDrafts() override {
    {
      std::lock_guard lock(queue_mutex_);
      stop_ = true;
    }
    queue_cv_.notify_one();
    if (worker_.joinable()) worker_.join();
  }
  void start(uint64_t id, std::span<const int32_t> prompt) override { proposer_.start(id, prompt); }
  void append(uint64_t id, std::span<const int32_t> tokens) override { proposer_.append(id, tokens); }
  void propose(uint64_t id, int32_t max_tokens, Draft& out) override {
    std::shared_lock global(global_mutex_, std::try_to_lock);
    proposer_.propose(id, max_tokens, out, global.owns_lock());
  }
  bool concurrent_requests() const override { return true; }
  void finish(uint64_t id) override {
    std::vector<int32_t> output = proposer_.release(id);
    if (output.empty()) return;
    {
      std::lock_guard lock(queue_mutex_);
      queued_tokens_ += static_cast<int64_t>(output.size());
      queue_.push_back(std::move(output));
      while (queued_tokens_ > budget_ && queue_.size() > 1) {
        queued_tokens_ -= static_cast<int64_t>(queue_.front().size());
        queue_.pop_front();
      }
    }
    queue_cv_.notify_one();
  }

 private:
  void insert_loop() {
    for (;;) {
      std::vector<int32_t> output;
      {
        std::unique_lock lock(queue_mutex_);
        queue_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        output = std::move(queue_.front());
        queue_.pop_front();
        queued_tokens_ -= static_cast<int64_t>(output.size());
      }
      std::unique_lock global(global_mutex_);
      proposer_.add_global(output);
    }
  }

  SuffixProposer proposer_;
  const int64_t budget_;
  std::shared_mutex global_mutex_;  // the global tree: the inserting thread, or proposals
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::vector<int32_t>> queue_;  // finished outputs, oldest first
  int64_t queued_tokens_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& config) {
  switch (config.method) {
    case SpecMethod::Ngram:
      return std::make_unique<NgramProposer>(NgramConfig{config.prompt_lookup_min, config.prompt_lookup_max});
    case SpecMethod::Suffix: {
      SuffixConfig sc;
      sc.max_depth = config.suffix_max_depth;
      sc.propose.min_prob = config.suffix_min_token_prob;
      sc.propose.max_tokens = config.num_speculative_tokens;
      sc.global_max_tokens = config.suffix_global_max_tokens;
      return std::make_unique<SuffixDrafts>(sc);
    }
    case SpecMethod::DraftModel:
    case SpecMethod::Mtp:
    case SpecMethod::None: break;
  }
  fail("speculative decoding: no proposer for method {}", to_string(config.method));
}

}  // namespace deepinfer::spec
