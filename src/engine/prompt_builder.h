// PromptBuilder: turns what a caller asks for (plain text or a chat) into the
// prompt token ids the engine runs, the same way for every front end (LLM, the
// server). fan_out() splits a request for n samples into n engine requests.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/sampling_params.h"

namespace deepinfer {

class ChatTemplate;
class Tokenizer;

class PromptBuilder {
 public:
  explicit PromptBuilder(const Tokenizer& tokenizer);
  ~PromptBuilder();

  bool has_chat_template() const { return chat_template_ != nullptr; }
  // The template's Jinja source ("" without one); front ends pick tool-call and
  // reasoning formats from it.
  const std::string& chat_template_source() const;

  // Thread-safe. Throws deepinfer::Error when the model has no template, the
  // messages are not a non-empty list, or the template rejects them.
  std::string apply_chat_template(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                  bool add_generation_prompt,
                                  const nlohmann::ordered_json& extra_context = nullptr) const;
  // The template writes BOS and other markers itself (as transformers does), so
  // the rendered text is encoded without adding special tokens.
  // add_generation_prompt: end with the assistant turn's opening (the
  // default). continue_final_message: the last message (the assistant's, in
  // progress) is left open, the text cut right after its content, so the model
  // continues it; the two exclude each other.
  std::vector<int32_t> encode_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                   const nlohmann::ordered_json& extra_context = nullptr,
                                   bool add_generation_prompt = true, bool continue_final_message = false) const;
  // Plain text with the tokenizer's special tokens (e.g. BOS) added.
  std::vector<int32_t> encode_prompt(std::string_view text) const;

 private:
  const Tokenizer& tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
};

// The per-sample parameters of a request for params.n samples: n copies with
// n = 1. Samples differ only by seed, derived from the request's seed so that a
// given seed stays reproducible.
std::vector<SamplingParams> fan_out(const SamplingParams& params);

}  // namespace deepinfer
