#include "deepinfer/llm.h"

#include <algorithm>
#include <deque>
#include <unordered_map>
#include <unordered_set>

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

struct LLM::Generation {
  CompletionOutput output;
  bool keep_logprobs = false;
  bool keep_deltas = false;
  size_t remaining = 0;                // samples not finished
  std::vector<uint64_t> request_ids;  // engine request per sample
  std::vector<bool> done;
  std::deque<CompletionDelta> deltas;
};

LLM::Generation& LLM::generation(GenerationHandle handle) {
  auto it = generations_.find(handle);
  DI_CHECK(it != generations_.end(), "unknown generation handle {}", handle);
  return *it->second;
}

const LLM::Generation& LLM::generation(GenerationHandle handle) const {
  auto it = generations_.find(handle);
  DI_CHECK(it != generations_.end(), "unknown generation handle {}", handle);
  return *it->second;
}

GenerationHandle LLM::submit(const GenerateInput& input, bool keep_deltas) {
  auto g = std::make_unique<Generation>();
  g->output.prompt_ids = prompt_ids(input);
  input.params.validate(engine_.vocab_size());
  const auto n = static_cast<size_t>(input.params.n);
  g->keep_logprobs = input.params.logprobs.has_value();
  g->keep_deltas = keep_deltas;
  g->output.choices.resize(n);
  g->done.assign(n, false);
  std::vector<SamplingParams> children = fan_out(input.params);
  const GenerationHandle handle = next_handle_++;
  try {
    for (size_t c = 0; c < n; ++c) {
      g->request_ids.push_back(engine_.add_request(g->output.prompt_ids, std::move(children[c]), input.cache_salt));
      ++g->remaining;
    }
  } catch (...) {
    for (uint64_t id : g->request_ids) engine_.abort(id);
    throw;
  }
  for (size_t c = 0; c < n; ++c) samples_[g->request_ids[c]] = {handle, c};
  generations_[handle] = std::move(g);
  return handle;
}

LLM::StepUpdate LLM::step() {
  StepUpdate update;
  auto secs = [](Clock::time_point a, Clock::time_point b) {
    return b == Clock::time_point{} ? 0.0 : std::chrono::duration<double>(b - a).count();
  };
  for (RequestOutput& out : engine_.step()) {
    auto sample = samples_.find(out.request_id);
    if (sample == samples_.end()) continue;  // released by its caller
    Generation& g = *generations_.at(sample->second.handle);
    const size_t c = sample->second.choice;
    CompletionChoice& choice = g.output.choices[c];
    update.new_tokens += static_cast<int64_t>(out.new_tokens.size());
    choice.text += out.new_text;
    for (const TokenOutput& t : out.new_tokens) {
      choice.token_ids.push_back(t.token);
      if (g.keep_logprobs) choice.logprobs.push_back(t);
    }
    if (out.finished) {
      choice.finish_reason = out.finish_reason;
      choice.stop_reason = out.stop_reason;
      choice.error = out.error;
      CompletionOutput& o = g.output;
      if (auto s = engine_.summary(out.request_id)) {
        if (c == 0) {
          o.num_cached_prompt_tokens = s->num_cached_prompt_tokens;
          o.time_to_first_token_s = secs(s->timings.arrival, s->timings.first_token);
          o.queue_time_s = secs(s->timings.arrival, s->timings.first_scheduled);
        }
        o.latency_s = std::max(o.latency_s, secs(s->timings.arrival, s->timings.finished));
        o.num_verifications += s->num_verifications;
        o.num_verified_drafts += s->num_verified_drafts;
        o.num_accepted_drafts += s->num_accepted_drafts;
      }
      g.done[c] = true;
      if (--g.remaining == 0) update.finished.push_back(sample->second.handle);
      samples_.erase(sample);
    }
    if (g.keep_deltas) {
      CompletionDelta d;
      d.choice = c;
      d.text = std::move(out.new_text);
      if (g.keep_logprobs) {
        d.tokens = std::move(out.new_tokens);
      } else {
        for (const TokenOutput& t : out.new_tokens) d.tokens.push_back(TokenOutput{t.token, 0.0f, 0, {}});
      }
      d.finished = out.finished;
      d.finish_reason = out.finish_reason;
      d.stop_reason = std::move(out.stop_reason);
      d.error = std::move(out.error);
      g.deltas.push_back(std::move(d));
    }
  }
  return update;
}

bool LLM::finished(GenerationHandle handle) const { return generation(handle).remaining == 0; }

std::vector<CompletionDelta> LLM::take_deltas(GenerationHandle handle) {
  Generation& g = generation(handle);
  std::vector<CompletionDelta> out(std::make_move_iterator(g.deltas.begin()), std::make_move_iterator(g.deltas.end()));
  g.deltas.clear();
  return out;
}

CompletionOutput LLM::take(GenerationHandle handle) {
  Generation& g = generation(handle);
  DI_CHECK(g.remaining == 0, "generation {} has not finished", handle);
  CompletionOutput out = std::move(g.output);
  generations_.erase(handle);
  return out;
}

void LLM::release(GenerationHandle handle) {
  auto it = generations_.find(handle);
  if (it == generations_.end()) return;
  Generation& g = *it->second;
  for (size_t c = 0; c < g.request_ids.size(); ++c) {
    if (g.done[c]) continue;
    engine_.abort(g.request_ids[c]);
    samples_.erase(g.request_ids[c]);
  }
  generations_.erase(it);
}

std::vector<CompletionOutput> LLM::generate(const std::vector<GenerateInput>& inputs,
                                            const std::function<void(const GenerateProgress&)>& progress) {
  std::vector<GenerationHandle> handles;
  handles.reserve(inputs.size());
  GenerateProgress prog;
  prog.total = inputs.size();
  try {
    for (const GenerateInput& input : inputs) {
      handles.push_back(submit(input));
      const Generation& g = generation(handles.back());
      prog.prompt_tokens += static_cast<int64_t>(g.output.prompt_ids.size() * g.output.choices.size());
    }
    std::unordered_set<GenerationHandle> mine(handles.begin(), handles.end());
    while (prog.finished < handles.size()) {
      StepUpdate update = step();
      prog.generated_tokens += update.new_tokens;  // counts streams sharing the engine too
      size_t newly_finished = 0;
      for (GenerationHandle h : update.finished) newly_finished += mine.count(h);
      if (newly_finished > 0) {
        prog.finished += newly_finished;
        if (progress) progress(prog);
      }
    }
    // A data-parallel rank steps on with its group until no rank has work.
    engine_.drain_group();
  } catch (...) {
    for (GenerationHandle h : handles) release(h);
    throw;
  }
  std::vector<CompletionOutput> outputs;
  outputs.reserve(handles.size());
  for (GenerationHandle h : handles) outputs.push_back(take(h));
  return outputs;
}

CompletionOutput LLM::stream(const GenerateInput& input, const std::function<void(std::string_view)>& on_text) {
  DI_CHECK(input.params.n == 1, "streaming generation takes n = 1");
  const GenerationHandle handle = submit(input, /*keep_deltas=*/true);
  try {
    while (!finished(handle)) {
      step();
      for (const CompletionDelta& d : take_deltas(handle)) {
        if (!d.text.empty()) on_text(d.text);
      }
    }
    engine_.drain_group();
  } catch (...) {
    release(handle);
    throw;
  }
  return take(handle);
}

}  // namespace deepinfer
