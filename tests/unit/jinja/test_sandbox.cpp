// Sandbox and execution-budget behaviour: every limit fails with a clear
// deepinfer::Error, and hostile templates cannot hang or crash the process.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/template.h"

using namespace deepinfer;

namespace {

std::string render(const std::string& source, const jinja::RenderBudget& budget = {},
                   std::vector<std::pair<std::string, jinja::Value>> globals = {}) {
  return jinja::Template(source).render(globals, budget);
}

// Expects a deepinfer::Error whose message contains `needle`.
void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Budget, StepLimitStopsNestedLoops) {
  jinja::RenderBudget b;
  b.max_steps = 10'000;
  b.max_loop_iterations = 1'000'000;
  expect_error([&] { render("{% for i in range(1000) %}{% for j in range(1000) %}{{ j }}{% endfor %}{% endfor %}", b); },
               "budget exceeded: more than 10000 evaluation steps");
}

TEST(Budget, LoopIterationLimit) {
  jinja::RenderBudget b;
  b.max_loop_iterations = 500;
  expect_error([&] { render("{% for i in range(400) %}{% for j in range(2) %}{% endfor %}{% endfor %}", b); },
               "more than 500 loop iterations");
  expect_error([&] { render("{{ range(100000) | length }}", b); }, "range() of 100000 items");
}

TEST(Budget, MacroRecursionDepth) {
  jinja::RenderBudget b;
  b.max_call_depth = 20;
  expect_error([&] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", b); },
               "macro calls nested deeper than 20");
  EXPECT_EQ(render("{% macro f(n) %}{% if n < 5 %}{{ n }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}", b), "01234");
}

TEST(Budget, OutputSize) {
  jinja::RenderBudget b;
  b.max_output_bytes = 1000;
  expect_error([&] { render("{% for i in range(200) %}0123456789{% endfor %}", b); }, "output larger than 1000 bytes");
}

TEST(Budget, SingleValueSize) {
  jinja::RenderBudget b;
  b.max_string_bytes = 1 << 20;
  expect_error([&] { render("{{ 'a' * 1000000000 }}", b); }, "budget exceeded: a single value");
  expect_error([&] { render("{{ [1, 2] * 1000000000 }}", b); }, "budget exceeded: a single value");
  expect_error([&] { render("{{ 'x' * 9223372036854775807 }}", b); }, "budget exceeded");
}

TEST(Budget, TotalStringWork) {
  // Doubling a string repeatedly: each value stays small enough, the total work does not.
  jinja::RenderBudget b;
  b.max_string_bytes = 1 << 20;
  b.max_work_bytes = 8 << 20;
  expect_error([&] {
    render("{% set ns = namespace(s='abcdefgh' * 1000) %}{% for i in range(100000) %}{% set ns.s = ns.s[:500000] ~ ns.s[:500000] %}{% endfor %}",
           b);
  }, "string operations produced more than");
}

TEST(Budget, DeepExpressionsAreRejected) {
  std::string deep(5000, '(');
  deep += "1" + std::string(5000, ')');
  expect_error([&] { render("{{ " + deep + " }}"); }, "nested too deeply");
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  expect_error([&] { render(chain + " }}"); }, "expression too long");
  std::string blocks;
  for (int i = 0; i < 1000; ++i) blocks += "{% if true %}";
  expect_error([&] { render(blocks); }, "nested too deeply");
}

TEST(Budget, DeepAndCyclicValuesDoNotCrash) {
  // A namespace that contains itself: printing it must fail cleanly, and the
  // render must not leak or recurse without bound.
  expect_error([&] { render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"); }, "nested deeper than");
  expect_error([&] { render("{% set l = [] %}{% set _ = l.append(l) %}{{ l | tojson }}"); }, "nested deeper than");
  // A long chain built by mutation is destroyed without deep recursion.
  jinja::RenderBudget b;
  b.max_loop_iterations = 300'000;
  b.max_steps = 5'000'000;
  EXPECT_EQ(render("{% set ns = namespace(cur=[]) %}{% for i in range(200000) %}{% set ns.cur = [ns.cur] %}{% endfor %}ok", b),
            "ok");
  // Deeply nested input JSON is rejected before rendering.
  nlohmann::ordered_json deep = "leaf";
  for (int i = 0; i < 1000; ++i) deep = nlohmann::ordered_json::array({deep});
  ChatTemplate t("{{ messages }}");
  expect_error([&] { t.render(nlohmann::ordered_json::array({deep}), nullptr, false); }, "nested deeper than");
}

TEST(Sandbox, NoFileOrTemplateLoading) {
  for (const char* src : {"{% include 'x.txt' %}", "{% import 'x' as y %}", "{% from 'x' import y %}",
                          "{% extends 'base.html' %}"}) {
    expect_error([&] { jinja::Template t(src); }, "chat templates cannot load other templates");
  }
  // Python internals are not reachable through attributes.
  EXPECT_EQ(render("{{ ''.__class__ }}|{{ {}.__init__ }}|{{ namespace.__globals__ }}|{{ range.__code__ }}"), "|||");
  expect_error([&] { render("{{ ''.__class__.__mro__ }}"); }, "has no attribute '__class__'");
}

TEST(Errors, ParseErrorsHaveLineNumbers) {
  expect_error([] { jinja::Template t("line1\n{% if x %}\nno end"); }, "line 3: unexpected end of template, expected 'elif', 'else', 'endif'");
  expect_error([] { jinja::Template t("a\nb\n{{ 1 + }}"); }, "line 3");
  expect_error([] { jinja::Template t("{% for %}"); }, "expected a name");
  expect_error([] { jinja::Template t("{{ 'abc }}"); }, "unterminated string");
  expect_error([] { jinja::Template t("{% break %}"); }, "outside of a loop");
  expect_error([] { jinja::Template t("{% frobnicate %}"); }, "unknown statement 'frobnicate'");
}

TEST(Errors, RuntimeErrorsNameTheProblem) {
  expect_error([] { render("\n\n{{ undefined_thing.attr }}"); }, "line 3: 'undefined_thing' is undefined");
  expect_error([] { render("{{ 1 + 'a' }}"); }, "unsupported operand type(s) for +: 'int' and 'str'");
  expect_error([] { render("{{ x | nosuchfilter }}"); }, "no filter named 'nosuchfilter'");
  expect_error([] { render("{{ x is nosuchtest }}"); }, "no test named 'nosuchtest'");
  expect_error([] { render("{{ 9223372036854775807 + 1 }}"); }, "integer overflow");
  // A replacement index too long for any integer type (found by the fuzzer) is an index error.
  EXPECT_EQ(render("{{ '{1}{0}'.format('a', 'b') }}"), "ba");
  expect_error([] { render("{{ '{3}'.format('a') }}"); }, "Replacement index 3 out of range");
  expect_error([] { render("{{ '{99999999999999999999999999}'.format('a') }}"); }, "out of range");
}

TEST(Language, UndefinedSemantics) {
  EXPECT_EQ(render("[{{ nothing }}]{% for x in nothing %}x{% endfor %}{{ nothing | length }}{{ nothing is defined }}"),
            "[]0False");
  EXPECT_EQ(render("{{ d.missing is defined }}{{ d.missing | default('dflt') }}",
                   {}, {{"d", jinja::Value::object()}}),
            "Falsedflt");
  expect_error([] { render("{{ nothing() }}"); }, "'nothing' is undefined");
}

TEST(Language, ListsAndNamespacesAreMutable) {
  EXPECT_EQ(render("{% set l = [1] %}{% set _ = l.append(2) %}{% set ns = namespace(items=l) %}"
                   "{% set _ = ns.items.append(3) %}{{ l }} {{ l.pop() }} {{ l }}"),
            "[1, 2, 3] 3 [1, 2]");
}

TEST(Language, GenerationBlockIsTransparent) {
  EXPECT_EQ(render("a{% generation %}b{{ 1 }}{% endgeneration %}c"), "ab1c");
}

TEST(ChatTemplate, StrftimeNowIsInjectable) {
  ChatTemplateOptions options;
  options.now = test::fixed_now;
  ChatTemplate t("{{ strftime_now('%d %b %Y') }}", options);
  EXPECT_EQ(t.render(nlohmann::ordered_json::array(), nullptr, false), "26 Jul 2024");
}

TEST(ChatTemplate, RaiseExceptionMessageIsExact) {
  ChatTemplate t("{% if messages | length == 0 %}{{ raise_exception('need ' ~ 1 ~ ' message') }}{% endif %}ok");
  try {
    t.render(nlohmann::ordered_json::array(), nullptr, true);
    ADD_FAILURE() << "expected raise_exception";
  } catch (const jinja::TemplateRaisedError& e) {
    EXPECT_STREQ(e.what(), "need 1 message");
  }
}

TEST(ChatTemplate, ConfigFormsAndErrors) {
  auto cfg = nlohmann::ordered_json::parse(R"({"chat_template": [{"name": "default", "template": "D"},
      {"name": "tool_use", "template": "T"}], "bos_token": {"content": "<s>"}, "eos_token": "</s>"})");
  auto src = chat_template_from_config(cfg);
  EXPECT_EQ(src.source, "D");
  EXPECT_EQ(src.bos_token, "<s>");
  EXPECT_EQ(src.eos_token, "</s>");
  EXPECT_EQ(chat_template_from_config(cfg, "tool_use").source, "T");
  expect_error([&] { chat_template_from_config(cfg, "nope"); }, "available: default, tool_use");
  expect_error([] { chat_template_from_config(nlohmann::ordered_json::object()); }, "has no chat_template");
  expect_error([] { ChatTemplate t("{% if %}"); }, "chat template: line 1");
}

TEST(ChatTemplate, ConcurrentRendersAreIndependent) {
  ChatTemplate t(test::read_file(test::data_path("qwen3.jinja")));
  auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  const std::string expected = t.render(messages, nullptr, true);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 200; ++j) {
        if (t.render(messages, nullptr, true) != expected) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(expected, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace

namespace {

// Found by fuzz_chat_template: a float too large for int64 in `is odd` (and in
// "%d" formatting) was converted anyway, which is undefined behaviour. Python
// takes the float path for both.
TEST(Sandbox, HugeAndFractionalFloatsInParityTestsAndIntegerFormatting) {
  EXPECT_EQ(render("{{ 77777777777777777777777777777.7 is odd }}"), "False");
  EXPECT_EQ(render("{{ 3.0 is odd }} {{ 3.5 is odd }} {{ -3 is odd }} {{ 4.0 is even }} {{ -4 is even }}"),
            "True False True True True");
  EXPECT_EQ(render("{{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 7.5 is divisibleby 2.5 }}"), "True False True");
  EXPECT_EQ(render("{{ '%d' % 1e30 }} {{ '%d' % -2.9 }}"), "1000000000000000019884624838656 -2");
  expect_error([&] { render("{{ 3 is divisibleby 0 }}"); }, "modulo by zero");
}

}  // namespace
