#include "tokenizer/chat_template.h"

#include "core/error.h"
#include "tokenizer/jinja/template.h"

namespace deepinfer {

ChatTemplate::ChatTemplate(std::string source, ChatTemplateOptions options)
    : source_(std::move(source)), options_(std::move(options)),
      template_(std::make_unique<jinja::Template>(source_)) {}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra_context) const {
  DI_CHECK(messages.is_array(), "chat template: messages must be a JSON array");
  DI_CHECK(extra_context.is_null() || extra_context.is_object(), "chat template: extra context must be a JSON object");
  std::vector<std::pair<std::string, jinja::Value>> globals;
  try {
    for (auto it = options_.special_tokens.begin(); it != options_.special_tokens.end(); ++it) {
      globals.emplace_back(it.key(), jinja::Value::from_json(it.value()));
    }
    globals.emplace_back("bos_token", jinja::Value(options_.bos_token));
    globals.emplace_back("eos_token", jinja::Value(options_.eos_token));
    globals.emplace_back("messages", jinja::Value::from_json(messages));
    // transformers passes tools=None when there are none; templates test `if tools`.
    globals.emplace_back("tools", jinja::Value::from_json(tools));
    globals.emplace_back("add_generation_prompt", jinja::Value(add_generation_prompt));
    if (extra_context.is_object()) {
      // Extra variables add to the request; they may not replace what it
      // already set (messages, tools, ...), which would bypass its checks.
      const size_t reserved = globals.size();
      for (auto it = extra_context.begin(); it != extra_context.end(); ++it) {
        for (size_t g = 0; g < reserved; ++g) {
          DI_CHECK(globals[g].first != it.key(), "template variable '{}' is set by the request and cannot be overridden",
                   it.key());
        }
        globals.emplace_back(it.key(), jinja::Value::from_json(it.value()));
      }
    }
  } catch (const jinja::TemplateRaisedError&) {
    throw;
  } catch (const Error& e) {
    fail("chat template: bad input: {}", e.what());
  }
  return template_->render(globals, options_.budget, options_.now);
}

namespace {

std::string token_text(const nlohmann::ordered_json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"];
  fail("tokenizer config: '{}' must be a string or an object with 'content'", key);
}

}  // namespace

ChatTemplateSource chat_template_from_config(const nlohmann::ordered_json& config, const std::string& name) {
  DI_CHECK(config.is_object(), "tokenizer config: not a JSON object");
  ChatTemplateSource out;
  auto it = config.find("chat_template");
  DI_CHECK(it != config.end() && !it->is_null(), "tokenizer config has no chat_template");
  if (it->is_string()) {
    out.source = it->get<std::string>();
  } else {
    DI_CHECK(it->is_array(), "tokenizer config: chat_template must be a string or a list of {{name, template}}");
    std::string available;
    for (const auto& entry : *it) {
      DI_CHECK(entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
                   entry.contains("template") && entry["template"].is_string(),
               "tokenizer config: chat_template list entries need string 'name' and 'template'");
      if (entry["name"] == name) out.source = entry["template"];
      available += (available.empty() ? "" : ", ") + entry["name"].get<std::string>();
    }
    DI_CHECK(!out.source.empty(), "tokenizer config has no chat template named '{}' (available: {})", name, available);
  }
  out.bos_token = token_text(config, "bos_token");
  out.eos_token = token_text(config, "eos_token");
  return out;
}

}  // namespace deepinfer
