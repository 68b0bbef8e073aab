// Byte-exact comparison with transformers' Jinja environment on real and
// common chat templates (data from scripts/gen_chat_template_reference.py).
#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/template.h"

using namespace deepinfer;

namespace {

class ReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceTest, RendersLikeTransformers) {
  const std::string family = GetParam();
  auto data = test::read_json(test::data_path(family + ".json"));
  ChatTemplateOptions options;
  options.bos_token = data["bos_token"];
  options.eos_token = data["eos_token"];
  options.now = test::fixed_now;
  ChatTemplate tmpl(test::read_file(test::data_path(family + ".jinja")), options);
  size_t checked = 0;
  for (const auto& c : data["cases"]) {
    SCOPED_TRACE(family + ": " + c["name"].get<std::string>());
    const auto& extra = c["extra"];
    bool agp = c["add_generation_prompt"];
    if (c.contains("expected")) {
      EXPECT_EQ(tmpl.render(c["messages"], c["tools"], agp, extra), c["expected"].get<std::string>());
    } else if (c["raised"].get<bool>()) {
      try {
        tmpl.render(c["messages"], c["tools"], agp, extra);
        ADD_FAILURE() << "expected raise_exception";
      } catch (const jinja::TemplateRaisedError& e) {
        EXPECT_EQ(std::string(e.what()), c["error"].get<std::string>());
      }
    } else {
      EXPECT_THROW(tmpl.render(c["messages"], c["tools"], agp, extra), Error) << c["error"];
    }
    ++checked;
  }
  EXPECT_GE(checked, 20u);
}

INSTANTIATE_TEST_SUITE_P(Families, ReferenceTest,
                         ::testing::Values("deepseek_v3", "qwen3", "llama3_1", "gemma3", "smollm2", "llama3_tools",
                                           "mistral", "llama2", "features"));

TEST(ReferenceTemplates, SharedConfigsMatchCheckedInSources) {
  // The checked-in .jinja copies must be the templates the tokenizer configs carry.
  for (const char* family : {"deepseek_v3", "qwen3", "llama3_1", "gemma3"}) {
    std::string path = test::source_dir() + "/../shared/tokenizers/" + family + "/tokenizer_config.json";
    std::ifstream probe(path);
    if (!probe) GTEST_SKIP() << "shared tokenizers not present";
    auto src = chat_template_from_config(test::read_json(path));
    EXPECT_EQ(src.source, test::read_file(test::data_path(std::string(family) + ".jinja"))) << family;
  }
}

TEST(ReferenceSnippets, LanguageFeaturesMatchJinja) {
  auto snippets = test::read_json(test::data_path("snippets.json"));
  ASSERT_GE(snippets.size(), 50u);
  for (const auto& s : snippets) {
    const std::string source = s["template"];
    SCOPED_TRACE(source);
    std::vector<std::pair<std::string, jinja::Value>> globals;
    for (auto it = s["context"].begin(); it != s["context"].end(); ++it) {
      globals.emplace_back(it.key(), jinja::Value::from_json(it.value()));
    }
    auto render = [&] { return jinja::Template(source).render(globals, jinja::RenderBudget{}, test::fixed_now); };
    if (s.contains("expected")) {
      try {
        EXPECT_EQ(render(), s["expected"].get<std::string>());
      } catch (const std::exception& e) {
        ADD_FAILURE() << "threw: " << e.what();
      }
    } else {
      EXPECT_THROW(render(), Error) << "Jinja fails with: " << s["error"];
    }
  }
}

}  // namespace
