// Chat templates: renders a conversation into a prompt with the model's Jinja
// template, as transformers' apply_chat_template(tokenize=False) does, inside a
// sandbox (no file/process access) bounded by an execution budget.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "tokenizer/jinja/render_context.h"

namespace deepinfer {

namespace jinja {
class Template;
}

struct ChatTemplateOptions {
  std::string bos_token;
  std::string eos_token;
  // Further template variables such as unk_token/pad_token or other special tokens.
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
  jinja::RenderBudget budget;
  // Clock for strftime_now(); empty means the local time.
  jinja::NowFn now;
};

class ChatTemplate {
 public:
  // Parses the template once; throws deepinfer::Error on syntax errors.
  ChatTemplate(std::string source, ChatTemplateOptions options = {});
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Thread-safe. `tools` may be null; `extra_context` (an object or null) adds
  // template variables such as enable_thinking or date_string. Throws
  // deepinfer::Error on render failures; a template's raise_exception(msg) throws
  // jinja::TemplateRaisedError whose what() is exactly msg.
  // Object key order is part of the output (tojson of tool schemas), so requests
  // should be parsed as ordered_json; plain json (sorted keys) converts implicitly.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt, const nlohmann::ordered_json& extra_context = nullptr) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  ChatTemplateOptions options_;
  std::unique_ptr<jinja::Template> template_;
};

// Where a tokenizer keeps its chat template, as the CLI and the engine read it.
struct ChatTemplateSource {
  std::string source;
  std::string bos_token;
  std::string eos_token;
};

// Picks the template out of a tokenizer_config.json: `chat_template` may be a string
// or a list of {name, template} (then `name`, or "default", is used). Special
// tokens may be strings or {"content": ...} objects.
ChatTemplateSource chat_template_from_config(const nlohmann::ordered_json& config, const std::string& name = "default");

}  // namespace deepinfer
