// --chat-template (EngineConfig::chat_template): a template given as text or
// as a file replaces the tokenizer's; anything else is a clear error.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/prompt_builder.h"
#include "tokenizer/tokenizer.h"
#include "../../support/smollm2_model.h"

namespace deepinfer {
namespace {

EngineConfig config(std::string chat_template) {
  EngineConfig c;
  c.model_path = testing::smollm2_path();
  c.max_model_len = 256;
  c.kv_cache_tokens = 1024;
  c.chat_template = std::move(chat_template);
  return c;
}

TEST(ChatTemplateFlag, TextOrFileReplacesTheTokenizers) {
  REQUIRE_SMOLLM2();
  const std::string tmpl = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] ";
  Engine inline_engine(config(tmpl));
  EXPECT_EQ(inline_engine.tokenizer().chat_template(), tmpl);
  PromptBuilder pb(inline_engine.tokenizer());
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(pb.apply_chat_template(messages, nullptr, true, nlohmann::ordered_json::object()),
            "[user] hi\n[assistant] ");

  const std::string path = ::testing::TempDir() + "/chat_template.jinja";
  std::ofstream(path) << tmpl;
  Engine file_engine(config(path));
  EXPECT_EQ(file_engine.tokenizer().chat_template(), tmpl);
  std::remove(path.c_str());

  try {
    Engine bad(config("/no/such/template.jinja"));
    FAIL() << "a missing template file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
