#include "deepinfer/llm.h"

#include <unordered_map>

#include "core/error.h"
#include "engine/prompt_builder.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

LLM::LLM(EngineConfig config)
    : engine_(std::move(config)), prompts_(std::make_unique<PromptBuilder>(engine_.tokenizer())) {}

LLM::~LLM() = default;

std::string LLM::apply_chat_template(const nlohmann::json& messages, const nlohmann::json& tools,
                                     bool add_generation_prompt) const {
  return prompts_->apply_chat_template(messages, tools, add_generation_prompt);
}

std::vector<int32_t> LLM::prompt_ids(const GenerateInput& input) const {
  if (!input.prompt_ids.empty()) return input.prompt_ids;
  if (!input.messages.is_null()) return prompts_->encode_chat(input.messages, input.tools);
  return prompts_->encode_prompt(input.prompt);
}

std::vector<CompletionOutput> LLM::generate(const std::vector<GenerateInput>& inputs,
                                            const std::function<void(const GenerateProgress&)>& progress) {
  struct Slot {
    size_t input;
    size_t choice;
  };
  std::vector<CompletionOutput> outputs(inputs.size());
  std::unordered_map<uint64_t, Slot> slots;
  std::vector<size_t> remaining(inputs.size(), 0);
  GenerateProgress prog;
  prog.total = inputs.size();
  std::vector<Clock::time_point> arrival(inputs.size());
  try {
    for (size_t i = 0; i < inputs.size(); ++i) {
      outputs[i].prompt_ids = prompt_ids(inputs[i]);
      SamplingParams params = inputs[i].params;
      params.validate(engine_.vocab_size());
      const int32_t n = params.n;
      outputs[i].choices.resize(static_cast<size_t>(n));
      remaining[i] = static_cast<size_t>(n);
      arrival[i] = Clock::now();
      std::vector<SamplingParams> children = fan_out(params);
      for (int32_t c = 0; c < n; ++c) {
        uint64_t id = engine_.add_request(outputs[i].prompt_ids, std::move(children[c]), inputs[i].cache_salt);
        slots[id] = {i, static_cast<size_t>(c)};
      }
      prog.prompt_tokens += static_cast<int64_t>(outputs[i].prompt_ids.size()) * n;
    }
  } catch (...) {
    for (const auto& [id, slot] : slots) engine_.abort(id);
    while (engine_.has_unfinished()) engine_.step();
    throw;
  }
  while (engine_.has_unfinished()) {
    for (RequestOutput& out : engine_.step()) {
      const Slot slot = slots.at(out.request_id);
      CompletionOutput& o = outputs[slot.input];
      CompletionChoice& choice = o.choices[slot.choice];
      choice.text += out.new_text;
      for (TokenOutput& t : out.new_tokens) {
        choice.token_ids.push_back(t.token);
        if (inputs[slot.input].params.logprobs) choice.logprobs.push_back(std::move(t));
      }
      prog.generated_tokens += static_cast<int64_t>(out.new_tokens.size());
      if (!out.finished) continue;
      choice.finish_reason = out.finish_reason;
      choice.stop_reason = out.stop_reason;
      choice.error = std::move(out.error);
      if (auto s = engine_.summary(out.request_id)) {
        auto secs = [](Clock::time_point a, Clock::time_point b) {
          return b == Clock::time_point{} ? 0.0 : std::chrono::duration<double>(b - a).count();
        };
        if (slot.choice == 0) {
          o.num_cached_prompt_tokens = s->num_cached_prompt_tokens;
          o.time_to_first_token_s = secs(s->timings.arrival, s->timings.first_token);
          o.queue_time_s = secs(s->timings.arrival, s->timings.first_scheduled);
        }
        o.latency_s = std::max(o.latency_s, secs(s->timings.arrival, s->timings.finished));
        o.num_verifications += s->num_verifications;
        o.num_verified_drafts += s->num_verified_drafts;
        o.num_accepted_drafts += s->num_accepted_drafts;
      }
      if (--remaining[slot.input] == 0) {
        ++prog.finished;
        if (progress) progress(prog);
      }
    }
  }
  return outputs;
}

CompletionOutput LLM::stream(const GenerateInput& input, const std::function<void(std::string_view)>& on_text) {
  SamplingParams params = input.params;
  DI_CHECK(params.n == 1, "streaming generation takes n = 1");
  CompletionOutput o;
  o.prompt_ids = prompt_ids(input);
  o.choices.resize(1);
  const uint64_t id = engine_.add_request(o.prompt_ids, params, input.cache_salt);
  CompletionChoice& choice = o.choices[0];
  while (engine_.has_unfinished()) {
    for (RequestOutput& out : engine_.step()) {
      if (out.request_id != id) continue;
      if (!out.new_text.empty()) on_text(out.new_text);
      choice.text += out.new_text;
      for (TokenOutput& t : out.new_tokens) choice.token_ids.push_back(t.token);
      if (out.finished) {
        choice.finish_reason = out.finish_reason;
        choice.stop_reason = out.stop_reason;
        if (auto s = engine_.summary(id)) {
          o.num_cached_prompt_tokens = s->num_cached_prompt_tokens;
          o.time_to_first_token_s = std::chrono::duration<double>(s->timings.first_token - s->timings.arrival).count();
          o.latency_s = std::chrono::duration<double>(s->timings.finished - s->timings.arrival).count();
          o.num_verifications = s->num_verifications;
          o.num_verified_drafts = s->num_verified_drafts;
          o.num_accepted_drafts = s->num_accepted_drafts;
        }
      }
    }
  }
  return o;
}

}  // namespace deepinfer
