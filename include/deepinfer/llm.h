// LLM: the offline batch API. Give it many prompts (text, chat messages or token
// ids) with sampling parameters; it runs them together through one Engine with
// continuous batching and returns the completions in input order.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/sampling_params.h"
#include "engine/engine.h"

namespace deepinfer {

class PromptBuilder;

struct GenerateInput {
  std::string prompt;                  // plain text (special tokens such as BOS added), or
  nlohmann::json messages;             // a chat (the model's template applied), or
  std::vector<int32_t> prompt_ids;     // token ids as they are
  nlohmann::json tools;                // optional, with messages
  SamplingParams params;
  std::string cache_salt;
};

struct CompletionChoice {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<TokenOutput> logprobs;  // per token when params.logprobs is set
  FinishReason finish_reason = FinishReason::None;
  std::string stop_reason;
  std::string error;  // why the engine gave up on this sample (finish_reason is then abort)
};

struct CompletionOutput {
  std::vector<int32_t> prompt_ids;
  std::vector<CompletionChoice> choices;  // params.n samples
  int32_t num_cached_prompt_tokens = 0;
  // Speculative decoding, over all samples: draft tokens verified and accepted.
  int64_t num_verifications = 0;
  int64_t num_verified_drafts = 0;
  int64_t num_accepted_drafts = 0;
  double time_to_first_token_s = 0;  // from arrival, first sample
  double latency_s = 0;              // from arrival to the last sample's end
  double queue_time_s = 0;
};

struct GenerateProgress {
  size_t finished = 0;
  size_t total = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
};

// What a streamed generation produced since it was last polled, for one sample.
struct CompletionDelta {
  size_t choice = 0;  // which of the n samples
  std::string text;
  std::vector<TokenOutput> tokens;  // with logprobs when params.logprobs is set
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  std::string stop_reason;
  std::string error;
};

using GenerationHandle = uint64_t;

class LLM {
 public:
  explicit LLM(EngineConfig config);
  ~LLM();

  std::vector<CompletionOutput> generate(const std::vector<GenerateInput>& inputs,
                                         const std::function<void(const GenerateProgress&)>& progress = {});
  // One prompt, text streamed to `on_text` as it is produced.
  CompletionOutput stream(const GenerateInput& input, const std::function<void(std::string_view)>& on_text);

  // The incremental interface generate() and stream() are built on; it lets
  // several callers (a batch, streams being read) share the engine. Not
  // thread-safe: callers on several threads serialise these calls.
  //
  // Adds one input's n samples; throws (ParamError for a bad sampling field)
  // without adding anything. `keep_deltas` queues each step's new text and
  // tokens for take_deltas().
  GenerationHandle submit(const GenerateInput& input, bool keep_deltas = false);
  // Runs one engine step and routes its outputs to their handles.
  struct StepUpdate {
    std::vector<GenerationHandle> finished;  // handles whose last sample ended in this step
    int64_t new_tokens = 0;
  };
  StepUpdate step();
  bool has_unfinished() const { return engine_.has_unfinished(); }
  bool finished(GenerationHandle handle) const;
  std::vector<CompletionDelta> take_deltas(GenerationHandle handle);
  // The whole output of a finished handle, which is then forgotten.
  CompletionOutput take(GenerationHandle handle);
  // Aborts the handle's unfinished samples and forgets it; unknown handles are ignored.
  void release(GenerationHandle handle);

  // The prompt ids an input stands for (template applied / special tokens added).
  std::vector<int32_t> prompt_ids(const GenerateInput& input) const;
  std::string apply_chat_template(const nlohmann::json& messages, const nlohmann::json& tools,
                                  bool add_generation_prompt) const;

  Engine& engine() { return engine_; }
  const Engine& engine() const { return engine_; }

 private:
  struct Generation;
  struct Sample {
    GenerationHandle handle;
    size_t choice;
  };
  Generation& generation(GenerationHandle handle);
  const Generation& generation(GenerationHandle handle) const;

  Engine engine_;
  std::unique_ptr<PromptBuilder> prompts_;
  GenerationHandle next_handle_ = 1;
  std::unordered_map<GenerationHandle, std::unique_ptr<Generation>> generations_;
  std::unordered_map<uint64_t, Sample> samples_;  // engine request id -> its generation and sample
};

}  // namespace deepinfer
