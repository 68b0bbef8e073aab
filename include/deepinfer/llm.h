// LLM: the offline batch API. Give it many prompts (text, chat messages or token
// ids) with sampling parameters; it runs them together through one Engine with
// continuous batching and returns the completions in input order.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
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

class LLM {
 public:
  explicit LLM(EngineConfig config);
  ~LLM();

  std::vector<CompletionOutput> generate(const std::vector<GenerateInput>& inputs,
                                         const std::function<void(const GenerateProgress&)>& progress = {});
  // One prompt, text streamed to `on_text` as it is produced.
  CompletionOutput stream(const GenerateInput& input, const std::function<void(std::string_view)>& on_text);

  // The prompt ids an input stands for (template applied / special tokens added).
  std::vector<int32_t> prompt_ids(const GenerateInput& input) const;
  std::string apply_chat_template(const nlohmann::json& messages, const nlohmann::json& tools,
                                  bool add_generation_prompt) const;

  Engine& engine() { return engine_; }

 private:
  Engine engine_;
  std::unique_ptr<PromptBuilder> prompts_;
};

}  // namespace deepinfer
