// Engine: the step loop. Owns the model, the KV cache and its bookkeeping, the
// scheduler, the runner and the sampler; takes requests as token ids with
// sampling parameters and returns per-step outputs (new tokens and text).
// Single-threaded: the caller drives step(); AsyncEngine/servers wrap it.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine_config.h"
#include "model/model_config.h"
#include "sched/request.h"
#include "runner/sampler.h"

namespace deepinfer {

class Backend;
class LoadedModel;
class Tokenizer;
class KvStorage;
class BlockPool;
class PrefixCache;
class Scheduler;
class ModelRunner;
class StreamingDetokenizer;

struct TokenOutput {
  int32_t token = -1;
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<TokenLogprob> top;
};

// What one step produced for one request.
struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<TokenOutput> new_tokens;
  std::string new_text;
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  std::string stop_reason;  // the matched stop string, if any
};

struct EngineStats {
  size_t num_running = 0;
  size_t num_waiting = 0;
  double kv_usage = 0;
  int64_t num_preemptions = 0;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t steps = 0;
};

// Finished-request facts for callers that report timings.
struct RequestSummary {
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_prompt_tokens = 0;
  int32_t num_output_tokens = 0;
  RequestTimings timings;
};

class Engine {
 public:
  explicit Engine(EngineConfig config);
  ~Engine();

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const EngineConfig& config() const { return config_; }
  int32_t max_model_len() const { return max_model_len_; }
  int32_t vocab_size() const;
  const ModelConfig& model_config() const;

  // Validates and queues one sequence (params.n must be 1; callers fan out n).
  // Throws deepinfer::Error (ParamError for sampling parameters) on bad input.
  uint64_t add_request(std::vector<int32_t> prompt_ids, SamplingParams params, std::string cache_salt = {});
  // Stops a request now, freeing its KV; its final output comes from the next step().
  void abort(uint64_t request_id);

  std::vector<RequestOutput> step();
  bool has_unfinished() const { return !requests_.empty(); }

  // Summary of a request that finished in the last step() (valid until the next step).
  std::optional<RequestSummary> summary(uint64_t request_id) const;
  EngineStats stats() const;
  // Throws if the KV bookkeeping is inconsistent; with no requests in flight
  // every block must be free.
  void check_integrity() const;

  // Runs one forward step over a synthetic batch, for benchmarks and cost-model fitting.
  double time_prefill_step(int32_t num_new_tokens, int32_t num_cached_tokens);

 private:
  struct Live;  // a request plus its detokenizer and stop-string state
  void process_sample(Live& live, const SampleResult& result, RequestOutput& out);
  void finish(Live& live, FinishReason reason, RequestOutput& out);

  EngineConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<KvStorage> kv_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<PrefixCache> prefix_cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Sampler> sampler_;
  int32_t max_model_len_ = 0;

  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Live>> requests_;
  std::vector<uint64_t> aborted_;
  std::unordered_map<uint64_t, RequestSummary> finished_summaries_;
  EngineStats stats_;
};

}  // namespace deepinfer
