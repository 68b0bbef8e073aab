#include "engine/draft_model_proposer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/logging.h"
#include "engine/engine.h"

namespace deepinfer {

namespace {

EngineConfig draft_config(const EngineConfig& target, const std::optional<DeviceMemoryInfo>& memory) {
  EngineConfig c = target;
  if (memory && memory->total_bytes > 0 && c.kv_cache_tokens == 0) {
    // --gpu-memory-utilization is a share of the whole device, most of which
    // the target holds: the draft's share is what is in use now plus 90% of
    // what is free.
    const double total = static_cast<double>(memory->total_bytes);
    const double free = static_cast<double>(memory->free_bytes);
    c.gpu_memory_utilization = std::clamp((total - free + 0.9 * free) / total, 0.05, 0.99);
  }
  c.model_path = target.speculative.draft_model;
  // The draft's own tokenizer when its folder ships one, else the target's:
  // a draft shares the target's vocabulary, and only ids pass between them.
  std::error_code ec;
  const bool own_tokenizer = !std::filesystem::is_directory(c.model_path, ec) ||
                             std::filesystem::exists(std::filesystem::path(c.model_path) / "tokenizer.json", ec);
  if (own_tokenizer) {
    c.tokenizer_path.clear();
  } else if (c.tokenizer_path.empty()) {
    c.tokenizer_path = target.model_path;
  }
  c.speculative = {};
  c.cost_model.reset();  // fitted for the target
  // Proposals are read at once: nothing to pipeline.
  c.zero_overhead_scheduling = false;
  c.eplb_ep_size = 0;
  c.routing_trace_path.clear();
  // The draft runs whole on the proposing rank (rank 0 of a tensor-parallel
  // group, which alone schedules): no group of its own, no collectives; the
  // other ranks only see the verify steps, drafts included.
  const int local_rank = c.dist.local_rank;
  c.dist = DistConfig{};
  c.dist.local_rank = local_rank;  // the same device
  c.tensor_parallel_size = 1;
  c.data_parallel_size = 1;
  c.enable_expert_parallel = false;
  return c;
}

}  // namespace

DraftModelProposer::DraftModelProposer(const EngineConfig& target, int32_t target_vocab,
                                       std::optional<DeviceMemoryInfo> device_memory) {
  DI_CHECK(!target.speculative.draft_model.empty(), "draft_model speculation needs the draft model's path");
  engine_ = std::make_unique<Engine>(draft_config(target, device_memory));
  DI_CHECK(engine_->vocab_size() == target_vocab,
           "draft model {} has a vocabulary of {} tokens, but the target's has {}: a draft model must share the "
           "target's vocabulary",
           target.speculative.draft_model, engine_->vocab_size(), target_vocab);
  log_info("speculative: draft model {} ({} layers)", target.speculative.draft_model, engine_->model_config().n_layers);
}

DraftModelProposer::~DraftModelProposer() = default;

void DraftModelProposer::start(uint64_t request_id, std::span<const int32_t> prompt) {
  auto [it, fresh] = contexts_.try_emplace(request_id);
  DI_CHECK(fresh, "draft model proposer: request {} started twice", request_id);
  it->second.tokens.assign(prompt.begin(), prompt.end());
  it->second.prompt_len = static_cast<int32_t>(prompt.size());
}

void DraftModelProposer::set_target_sampling(uint64_t request_id, const spec::TargetSampling& sampling) {
  auto it = contexts_.find(request_id);
  DI_CHECK(it != contexts_.end(), "draft model proposer: unknown request {}", request_id);
  it->second.sampling = sampling;
}

void DraftModelProposer::append(uint64_t request_id, std::span<const int32_t> tokens) {
  auto it = contexts_.find(request_id);
  DI_CHECK(it != contexts_.end(), "draft model proposer: unknown request {}", request_id);
  it->second.tokens.insert(it->second.tokens.end(), tokens.begin(), tokens.end());
}

void DraftModelProposer::propose(uint64_t request_id, int32_t max_tokens, spec::Draft& out) {
  std::vector<spec::Draft> drafts;
  const uint64_t id = request_id;
  propose_batch(std::span(&id, 1), std::span(&max_tokens, 1), drafts);
  out = std::move(drafts.front());
}

void DraftModelProposer::propose_batch(std::span<const uint64_t> request_ids, std::span<const int32_t> max_tokens,
                                       std::vector<spec::Draft>& out) {
  out.assign(request_ids.size(), {});
  std::unordered_map<uint64_t, size_t> slot;  // draft engine request -> index
  for (size_t i = 0; i < request_ids.size(); ++i) {
    auto it = contexts_.find(request_ids[i]);
    DI_CHECK(it != contexts_.end(), "draft model proposer: unknown request {}", request_ids[i]);
    const Context& ctx = it->second;
    const auto len = static_cast<int32_t>(ctx.tokens.size());
    const int32_t k = std::min(max_tokens[i], engine_->max_model_len() - len);
    if (k <= 0) continue;
    SamplingParams p;
    p.temperature = ctx.sampling.temperature;
    p.top_k = ctx.sampling.top_k;
    p.top_p = ctx.sampling.top_p;
    p.min_p = ctx.sampling.min_p;
    p.seed = ctx.sampling.seed;
    p.max_tokens = k;
    p.ignore_eos = true;
    p.logprobs = 0;  // the chosen token's probability is its confidence
    // The first draft is the target's output number len - prompt_len.
    slot[engine_->add_request(ctx.tokens, p, {}, {}, len - ctx.prompt_len)] = i;
  }
  while (engine_->has_unfinished()) {
    for (const RequestOutput& o : engine_->step()) {
      spec::Draft& d = out[slot.at(o.request_id)];
      for (const TokenOutput& t : o.new_tokens) {
        d.tokens.push_back(t.token);
        d.confidence.push_back(std::clamp(std::exp(t.logprob), 0.01f, 0.99f));
      }
      // A draft that faulted numerically keeps what it had: the target verifies it anyway.
    }
  }
}

}  // namespace deepinfer
