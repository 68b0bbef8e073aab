#include "engine/prompt_builder.h"

#include "core/error.h"
#include "runner/rng.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

PromptBuilder::PromptBuilder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {
  if (!tokenizer.chat_template().empty()) {
    ChatTemplateOptions options;
    options.bos_token = tokenizer.bos_token();
    options.eos_token = tokenizer.eos_token();
    chat_template_ = std::make_unique<ChatTemplate>(tokenizer.chat_template(), options);
  }
}

PromptBuilder::~PromptBuilder() = default;

const std::string& PromptBuilder::chat_template_source() const { return tokenizer_.chat_template(); }

std::string PromptBuilder::apply_chat_template(const nlohmann::ordered_json& messages,
                                               const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                               const nlohmann::ordered_json& extra_context) const {
  DI_CHECK(chat_template_ != nullptr,
           "the model has no chat template: give one with --chat-template FILE|TEMPLATE, or send a plain prompt");
  DI_CHECK(messages.is_array() && !messages.empty(), "'messages' must be a non-empty list");
  return chat_template_->render(messages, tools, add_generation_prompt, extra_context);
}

std::vector<int32_t> PromptBuilder::encode_chat(const nlohmann::ordered_json& messages,
                                                const nlohmann::ordered_json& tools,
                                                const nlohmann::ordered_json& extra_context,
                                                bool add_generation_prompt, bool continue_final_message) const {
  DI_CHECK(!(add_generation_prompt && continue_final_message),
           "add_generation_prompt and continue_final_message cannot both be true");
  std::string text = apply_chat_template(messages, tools, add_generation_prompt, extra_context);
  if (continue_final_message) {
    const auto& last = messages.back();
    DI_CHECK(last.is_object() && last.value("content", nlohmann::ordered_json()).is_string(),
             "continue_final_message needs a final message with text content");
    const std::string content = last["content"].get<std::string>();
    // The template closes the turn after the content (end-of-turn markers):
    // cut them off so the model goes on writing the message.
    const size_t at = content.empty() ? std::string::npos : text.rfind(content);
    DI_CHECK(at != std::string::npos, "continue_final_message: the final message's content does not appear in the "
             "rendered prompt (the template rewrote it)");
    text.resize(at + content.size());
  }
  return tokenizer_.encode(text, false);
}

std::vector<int32_t> PromptBuilder::encode_prompt(std::string_view text) const {
  return tokenizer_.encode(text, true);
}

std::vector<SamplingParams> fan_out(const SamplingParams& params) {
  const int32_t n = std::max(params.n, 1);
  std::vector<SamplingParams> out(static_cast<size_t>(n), params);
  for (int32_t c = 0; c < n; ++c) {
    out[c].n = 1;
    if (params.seed && n > 1) out[c].seed = rng::derive_seed(*params.seed, static_cast<uint64_t>(c));
  }
  return out;
}

}  // namespace deepinfer
