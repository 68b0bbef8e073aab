// Structured output: the request fields, the tokenizer's per-token bytes the
// grammar matches against, the compiler (errors, cache) and token masks on a
// real vocabulary, and the engine end to end on the default model — outputs
// that satisfy their constraint whether the device or the host samples them,
// in the pipelined loop or not, next to unconstrained requests that are not
// disturbed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <regex>

#include "deepinfer/sampling_params.h"
#include "engine/engine.h"
#include "structured/grammar_compiler.h"
#include "structured/token_matcher.h"
#include "tokenizer/tokenizer.h"
#include "../../support/smollm2_model.h"

namespace deepinfer {
namespace {

using ojson = nlohmann::ordered_json;

std::string param_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ParamError& e) {
    return e.param();
  }
  return "(no error)";
}

TEST(StructuredOutputsFields, EachSourceParses) {
  auto so = StructuredOutputs::from_vllm(ojson::parse(R"({"json": {"type": "object", "properties": {"b": {}, "a": {}}}})"),
                                         "structured_outputs");
  EXPECT_EQ(so.kind, StructuredOutputs::Kind::Json);
  // The schema keeps the client's property order (b before a).
  EXPECT_LT(so.spec.find("\"b\""), so.spec.find("\"a\""));
  so = StructuredOutputs::from_vllm(ojson::parse(R"({"choice": ["x", "y"]})"), "structured_outputs");
  EXPECT_EQ(so.kind, StructuredOutputs::Kind::Choice);
  EXPECT_EQ(so.choices, (std::vector<std::string>{"x", "y"}));
  so = StructuredOutputs::from_vllm(ojson::parse(R"({"json": "{\"type\": \"string\"}"})"), "structured_outputs");
  EXPECT_EQ(so.spec, R"({"type":"string"})");

  StructuredOutputs rf;
  EXPECT_FALSE(StructuredOutputs::from_response_format(ojson::parse(R"({"type": "text"})"), rf));
  ASSERT_TRUE(StructuredOutputs::from_response_format(
      ojson::parse(R"({"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": {"type": "object"}}})"), rf));
  EXPECT_EQ(rf.kind, StructuredOutputs::Kind::Json);
  EXPECT_EQ(rf.param, "response_format");

  SamplingParams p = SamplingParams::from_json(ojson::parse(R"({"guided_regex": "[a-z]+", "temperature": 0})"));
  ASSERT_TRUE(p.structured_outputs);
  EXPECT_EQ(p.structured_outputs->kind, StructuredOutputs::Kind::Regex);
  EXPECT_EQ(p.structured_outputs->spec, "[a-z]+");
  p = SamplingParams::from_json(ojson::parse(R"({"response_format": {"type": "json_object"}})"));
  ASSERT_TRUE(p.structured_outputs);
  EXPECT_EQ(p.structured_outputs->kind, StructuredOutputs::Kind::JsonObject);
}

TEST(StructuredOutputsFields, BadInputNamesTheField) {
  auto vllm = [](const char* text) {
    return [text] { StructuredOutputs::from_vllm(ojson::parse(text), "structured_outputs"); };
  };
  EXPECT_EQ(param_of(vllm(R"({"regex": "a", "choice": ["a"]})")), "structured_outputs");
  EXPECT_EQ(param_of(vllm(R"({})")), "structured_outputs");
  EXPECT_EQ(param_of(vllm(R"({"choice": []})")), "structured_outputs");
  EXPECT_EQ(param_of(vllm(R"({"choice": ["a", ""]})")), "structured_outputs");
  EXPECT_EQ(param_of(vllm(R"({"choice": "a"})")), "structured_outputs");
  EXPECT_EQ(param_of(vllm(R"({"json": 3})")), "structured_outputs");
  EXPECT_EQ(param_of(vllm(R"({"json": "{not json"})")), "structured_outputs");
  EXPECT_EQ(param_of(vllm(R"({"regex": ""})")), "structured_outputs");
  EXPECT_EQ(param_of(vllm(R"({"whitespace_pattern": " "})")), "structured_outputs");
  EXPECT_EQ(param_of(vllm(R"({"colour": "red"})")), "structured_outputs");
  EXPECT_EQ(param_of([] {
              StructuredOutputs so;
              StructuredOutputs::from_response_format(ojson::parse(R"({"type": "yaml"})"), so);
            }),
            "response_format");
  EXPECT_EQ(param_of([] { SamplingParams::from_json(ojson::parse(R"({"guided_json": {}, "guided_regex": "a"})")); }),
            "guided_regex");
  EXPECT_EQ(param_of([] { SamplingParams::from_json(ojson::parse(R"({"guided_decoding_backend": "outlines"})")); }),
            "guided_decoding_backend");
  StructuredOutputs big;
  big.kind = StructuredOutputs::Kind::Regex;
  big.spec.assign(StructuredOutputs::kMaxSpecBytes + 1, 'a');
  EXPECT_EQ(param_of([&] { big.validate(); }), "structured_outputs");
}

std::unique_ptr<Tokenizer> smollm2_tokenizer() { return Tokenizer::from_file(testing::smollm2_path()); }

// The bytes each token adds, concatenated, are the text it encodes — what a
// grammar matcher relies on — including characters split across tokens.
TEST(TokenBytes, ConcatenateToTheText) {
  REQUIRE_SMOLLM2();
  auto tok = smollm2_tokenizer();
  for (const std::string text : {"Hello world", " leading space", "{\"a\": [1, 2.5e3, null]}\n\t",
                                 "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 emoji"}) {
    std::string joined;
    for (int32_t id : tok->encode(text, false)) joined += tok->token_bytes(id);
    EXPECT_EQ(joined, text);
  }
  ASSERT_TRUE(tok->eos_id());
  EXPECT_EQ(tok->token_bytes(*tok->eos_id()), "");  // special
  EXPECT_EQ(tok->token_bytes(-1), "");
  EXPECT_EQ(tok->token_bytes(tok->vocab_size()), "");
}

bool allowed(std::span<const int32_t> words, int32_t token) {
  return (static_cast<uint32_t>(words[static_cast<size_t>(token) / 32]) >> (token % 32)) & 1u;
}

int32_t single_token(const Tokenizer& tok, const std::string& text) {
  auto ids = tok.encode(text, false);
  EXPECT_EQ(ids.size(), 1u) << text;
  return ids.front();
}

TEST(GrammarCompiler, ChoiceMasksAndTermination) {
  REQUIRE_SMOLLM2();
  auto tok = smollm2_tokenizer();
  const int32_t vocab = tok->vocab_size() + 7;  // a model vocabulary wider than the tokenizer's
  structured::GrammarCompiler compiler(*tok, vocab);
  StructuredOutputs so;
  so.kind = StructuredOutputs::Kind::Choice;
  so.choices = {"yes", "no"};
  auto grammar = compiler.compile(so);
  structured::TokenMatcher m(grammar, tok->eos_ids());
  std::vector<int32_t> words(static_cast<size_t>(compiler.mask_words()));
  ASSERT_TRUE(m.fill_mask(words));
  const int32_t yes = single_token(*tok, "yes"), no = single_token(*tok, "no"), maybe = single_token(*tok, "maybe");
  EXPECT_TRUE(allowed(words, yes));
  EXPECT_TRUE(allowed(words, no));
  EXPECT_FALSE(allowed(words, maybe));
  EXPECT_FALSE(allowed(words, *tok->eos_id()));
  for (int32_t t = tok->vocab_size(); t < vocab; ++t) EXPECT_FALSE(allowed(words, t));
  EXPECT_FALSE(m.accept(maybe));
  EXPECT_EQ(m.num_accepted(), 0);
  ASSERT_TRUE(m.accept(yes));
  ASSERT_TRUE(m.fill_mask(words));
  int allowed_count = 0;
  for (int32_t t = 0; t < vocab; ++t) allowed_count += allowed(words, t) ? 1 : 0;
  // Only the end of the output is left (every EOS id of the tokenizer).
  EXPECT_EQ(allowed_count, static_cast<int>(tok->eos_ids().size()));
  EXPECT_TRUE(allowed(words, *tok->eos_id()));
  ASSERT_TRUE(m.accept(*tok->eos_id()));
  EXPECT_TRUE(m.terminated());
  EXPECT_FALSE(m.fill_mask(words));
  EXPECT_FALSE(m.accept(yes));

  // Compiled once: the same constraint again is a cache hit.
  EXPECT_EQ(compiler.compile(so).get(), grammar.get());
  EXPECT_EQ(compiler.stats().compiled, 1);
  EXPECT_EQ(compiler.stats().cache_hits, 1);
}

// response_format json_object: any JSON object, and only an object.
TEST(GrammarCompiler, JsonObjectModeTakesObjectsOnly) {
  REQUIRE_SMOLLM2();
  auto tok = smollm2_tokenizer();
  structured::GrammarCompiler compiler(*tok, tok->vocab_size());
  auto accepts = [&](const std::string& text) {
    StructuredOutputs so;
    so.kind = StructuredOutputs::Kind::JsonObject;
    structured::TokenMatcher m(compiler.compile(so), tok->eos_ids());
    for (int32_t t : tok->encode(text, false)) {
      if (!m.accept(t)) return false;
    }
    return m.accept(*tok->eos_id());
  };
  EXPECT_TRUE(accepts(R"({"name": "John", "tags": [1, {"a": null}], "ok": true})"));
  EXPECT_TRUE(accepts("{\n  \"nested\": {\"deep\": [\"x\"]}\n}"));
  EXPECT_TRUE(accepts("{}"));
  EXPECT_FALSE(accepts(R"([{"name": "John"}])"));
  EXPECT_FALSE(accepts(R"("just a string")"));
  EXPECT_FALSE(accepts("42"));
  // Pretty printing fits the whitespace bound between tokens; a runaway does not.
  EXPECT_TRUE(accepts("{\n    \"a\": {\n        \"b\": 1\n    }\n}"));
  EXPECT_FALSE(accepts("{\"a\":" + std::string(40, '\n') + "1}"));
}

// A tool-call constraint accepts exactly a call in the template's format, with
// arguments valid for the tool's schema, then the end of the output.
TEST(GrammarCompiler, ToolCallFormats) {
  REQUIRE_SMOLLM2();
  auto tok = smollm2_tokenizer();
  structured::GrammarCompiler compiler(*tok, tok->vocab_size());
  const std::string tools = R"([{"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}},
      {"name": "get_time", "parameters": {"type": "object", "properties": {}}}])";
  auto accepts = [&](const std::string& format, const std::string& text) {
    StructuredOutputs so;
    so.kind = StructuredOutputs::Kind::ToolCall;
    so.spec = R"({"format": ")" + format + R"(", "tools": )" + tools + "}";
    structured::TokenMatcher m(compiler.compile(so), tok->eos_ids());
    for (int32_t t : tok->encode(text, false)) {
      if (!m.accept(t)) return false;
    }
    return m.accept(*tok->eos_id());
  };
  // Compact JSON: XGrammar's separators without free whitespace are ", " and ": ".
  EXPECT_TRUE(accepts("hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
  EXPECT_TRUE(accepts("hermes", "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts("hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts("hermes", "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_TRUE(accepts("llama3_json", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"));
  EXPECT_TRUE(accepts("deepseek_v3",
                      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                      "{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"));
  EXPECT_FALSE(accepts("deepseek_v3", "{\"city\": \"Oslo\"}"));

  // "auto": free text, and any call the model opens held to the strict tool's schema.
  auto accepts_auto = [&](const std::string& text) {
    StructuredOutputs so;
    so.kind = StructuredOutputs::Kind::ToolCall;
    so.spec = R"({"format": "hermes", "mode": "auto", "tools": [{"name": "get_weather", "strict": true,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": false}}]})";
    structured::TokenMatcher m(compiler.compile(so), tok->eos_ids());
    for (int32_t t : tok->encode(text, false)) {
      if (!m.accept(t)) return false;
    }
    return m.accept(*tok->eos_id());
  };
  EXPECT_TRUE(accepts_auto("Just text, no call."));
  EXPECT_TRUE(accepts_auto("Checking. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"
                           "\n</tool_call> Done."));
  EXPECT_FALSE(accepts_auto("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts_auto("<tool_call>\n{\"name\": \"delete_all\", \"arguments\": {}}\n</tool_call>"));
}

TEST(GrammarCompiler, InvalidConstraintsAreParamErrors) {
  REQUIRE_SMOLLM2();
  auto tok = smollm2_tokenizer();
  structured::GrammarCompiler compiler(*tok, tok->vocab_size());
  auto compile = [&](StructuredOutputs::Kind kind, const std::string& spec) {
    StructuredOutputs so;
    so.kind = kind;
    so.spec = spec;
    so.param = "response_format";
    return param_of([&] { compiler.compile(so); });
  };
  EXPECT_EQ(compile(StructuredOutputs::Kind::Regex, "(unclosed"), "response_format");
  EXPECT_EQ(compile(StructuredOutputs::Kind::Grammar, "root ::= missing_rule"), "response_format");
  EXPECT_EQ(compile(StructuredOutputs::Kind::Grammar, "start: UNDEFINED"), "response_format");
  EXPECT_EQ(compile(StructuredOutputs::Kind::Json, R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/no"}}})"),
            "response_format");
  EXPECT_EQ(compiler.stats().failed, 4);
  // Still usable afterwards.
  EXPECT_EQ(compile(StructuredOutputs::Kind::Regex, "[0-9]{3}"), "(no error)");
}

// Regex features the grammar engine would misread are refused, not
// approximated, and errors carry the problem alone (no library log header).
TEST(GrammarCompiler, MisreadRegexFeaturesAreRefused) {
  REQUIRE_SMOLLM2();
  auto tok = smollm2_tokenizer();
  structured::GrammarCompiler compiler(*tok, tok->vocab_size());
  auto message = [&](StructuredOutputs::Kind kind, const std::string& spec) -> std::string {
    StructuredOutputs so;
    so.kind = kind;
    so.spec = spec;
    try {
      compiler.compile(so);
    } catch (const ParamError& e) {
      return e.what();
    }
    return "(no error)";
  };
  using K = StructuredOutputs::Kind;
  EXPECT_NE(message(K::Regex, R"([\p{L}]+)").find("Unicode property"), std::string::npos);
  EXPECT_NE(message(K::Regex, R"(\Aabc\Z)").find("anchor"), std::string::npos);
  EXPECT_NE(message(K::Regex, R"((?!x)[a-z]+)").find("look-around"), std::string::npos);
  EXPECT_NE(message(K::Json, R"({"type": "object", "properties": {"k": {"type": "string", "pattern": "^[\\p{L}]*$"}}})")
                .find("#/properties/k/pattern"),
            std::string::npos);
  EXPECT_EQ(message(K::Regex, R"([a-z\\]+\.txt)"), "(no error)");  // escaped backslash and dot are fine
  const std::string bad = message(K::Regex, "(unclosed");
  EXPECT_EQ(bad.find(".cc:"), std::string::npos) << bad;
}

TEST(GrammarCompiler, BudgetOverrunIsAnErrorNotAHang) {
  REQUIRE_SMOLLM2();
  auto tok = smollm2_tokenizer();
  structured::CompilerOptions options;
  options.timeout = std::chrono::milliseconds(1);
  structured::GrammarCompiler compiler(*tok, tok->vocab_size(), options);
  StructuredOutputs so;
  so.kind = StructuredOutputs::Kind::Regex;
  // Bounded repetitions expand into a large automaton: far beyond 1 ms.
  so.spec = "([a-z]{1,40}[0-9]{1,40}){1,40}";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(param_of([&] { compiler.compile(so); }), "structured_outputs");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(compiler.stats().timed_out, 1);
  // The abandoned compilation still runs: with room for one, the next is refused at once.
  structured::CompilerOptions one = options;
  one.max_running = 1;
  structured::GrammarCompiler busy(*tok, tok->vocab_size(), one);
  EXPECT_EQ(param_of([&] { busy.compile(so); }), "structured_outputs");  // times out, keeps running
  so.spec = "[a-z]";
  const std::string refused = [&] {
    try {
      busy.compile(so);
    } catch (const ParamError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  }();
  EXPECT_NE(refused.find("compiling already"), std::string::npos) << refused;
}

// --- End to end on the default model -------------------------------------

EngineConfig engine_config(bool pipelined) {
  EngineConfig c;
  c.model_path = testing::smollm2_path();
  c.batch_invariant = true;
  c.max_model_len = 512;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 96;  // prompts arrive in chunks
  c.zero_overhead_scheduling = pipelined;
  return c;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::None;
  std::string error;
};

std::map<uint64_t, Outcome> run_all(Engine& engine) {
  std::map<uint64_t, Outcome> out;
  while (engine.has_unfinished()) {
    for (RequestOutput& o : engine.step()) {
      Outcome& r = out[o.request_id];
      for (const TokenOutput& t : o.new_tokens) r.tokens.push_back(t.token);
      r.text += o.new_text;
      if (o.finish_reason != FinishReason::None) r.finish = o.finish_reason;
      if (!o.error.empty()) r.error = o.error;
    }
    engine.check_integrity();
  }
  return out;
}

std::vector<int32_t> chat(const Engine& e, const std::string& text) {
  std::string prompt = "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n";
  return e.tokenizer().encode(prompt, false);
}

SamplingParams constrained(StructuredOutputs::Kind kind, std::string spec, float temperature, int32_t max_tokens) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = 11;
  p.max_tokens = max_tokens;
  StructuredOutputs so;
  so.kind = kind;
  if (kind == StructuredOutputs::Kind::Choice) {
    so.choices = {"red", "green", "blue", "a colour I cannot name"};
  } else {
    so.spec = std::move(spec);
  }
  p.structured_outputs = so;
  return p;
}

const char* kPersonSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 24},
  "age": {"type": "integer", "minimum": 0, "maximum": 120},
  "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
  "required": ["name", "age", "tags"], "additionalProperties": false})";

struct Mix {
  std::vector<uint64_t> ids;
  std::vector<SamplingParams> params;
};

// Constrained and unconstrained requests, greedy and sampled, in one batch.
Mix add_mix(Engine& e, bool logprobs) {
  Mix m;
  auto add = [&](const std::string& text, SamplingParams p) {
    if (logprobs) p.logprobs = 2;
    m.params.push_back(p);
    m.ids.push_back(e.add_request(chat(e, text), p));
  };
  using K = StructuredOutputs::Kind;
  add("Describe a person as JSON.", constrained(K::Json, kPersonSchema, 0.0f, 120));
  add("Describe a person as JSON.", constrained(K::Json, kPersonSchema, 0.9f, 120));
  add("Name a colour.", constrained(K::Choice, "", 0.7f, 20));
  add("What is your phone number?", constrained(K::Regex, R"(\(\d{3}\) \d{3}-\d{4})", 1.0f, 30));
  add("Give me JSON.", constrained(K::JsonObject, "", 0.0f, 60));
  SamplingParams plain;
  plain.temperature = 0.8f;
  plain.seed = 5;
  plain.max_tokens = 40;
  add("Tell me a story.", plain);
  plain.temperature = 0.0f;
  add("Write a haiku about rain.", plain);
  return m;
}

void check_constraints(const Engine& e, const Mix& m, std::map<uint64_t, Outcome>& out) {
  for (size_t i = 0; i < m.ids.size(); ++i) {
    const Outcome& o = out[m.ids[i]];
    ASSERT_TRUE(o.error.empty()) << o.error;
    const auto& so = m.params[i].structured_outputs;
    if (!so) continue;
    if (o.finish == FinishReason::Length) continue;  // cut by max_tokens: nothing to check
    ASSERT_EQ(o.finish, FinishReason::Stop) << o.text;
    switch (so->kind) {
      case StructuredOutputs::Kind::Json: {
        const auto v = nlohmann::json::parse(o.text);
        ASSERT_TRUE(v.is_object()) << o.text;
        EXPECT_EQ(v.size(), 3u) << o.text;
        EXPECT_TRUE(v["name"].is_string() && v["age"].is_number_integer() && v["tags"].is_array()) << o.text;
        EXPECT_LE(v["age"].get<int>(), 120);
        break;
      }
      case StructuredOutputs::Kind::JsonObject: EXPECT_TRUE(nlohmann::json::parse(o.text).is_object()) << o.text; break;
      case StructuredOutputs::Kind::Regex: EXPECT_TRUE(std::regex_match(o.text, std::regex(so->spec))) << o.text; break;
      case StructuredOutputs::Kind::Choice:
        EXPECT_NE(std::find(so->choices.begin(), so->choices.end(), o.text), so->choices.end()) << o.text;
        break;
      case StructuredOutputs::Kind::Grammar: break;
    }
  }
}

TEST(StructuredEngine, OutputsSatisfyTheirConstraints) {
  REQUIRE_SMOLLM2();
  Engine pipelined(engine_config(true));
  Mix mp = add_mix(pipelined, false);
  auto op = run_all(pipelined);
  check_constraints(pipelined, mp, op);
  // The JSON-schema requests finished inside their budget (the test checks something).
  EXPECT_EQ(op[mp.ids[0]].finish, FinishReason::Stop);

  // The same requests in the synchronous loop, and with logprobs (so the host
  // samples the constrained rows and applies the grammar itself): identical
  // tokens — the masks are filled for the right positions in every path.
  Engine sync(engine_config(false));
  Mix ms = add_mix(sync, false);
  auto os = run_all(sync);
  Engine host(engine_config(true));
  Mix mh = add_mix(host, true);
  auto oh = run_all(host);
  for (size_t i = 0; i < mp.ids.size(); ++i) {
    EXPECT_EQ(op[mp.ids[i]].tokens, os[ms.ids[i]].tokens) << "request " << i;
    EXPECT_EQ(op[mp.ids[i]].tokens, oh[mh.ids[i]].tokens) << "request " << i;
  }

  // Unconstrained requests are not disturbed by constrained neighbours.
  Engine alone(engine_config(true));
  std::vector<uint64_t> ids;
  for (size_t i = 5; i < mp.ids.size(); ++i) ids.push_back(alone.add_request(chat(alone, i == 5 ? "Tell me a story." : "Write a haiku about rain."), mp.params[i]));
  auto oa = run_all(alone);
  EXPECT_EQ(oa[ids[0]].tokens, op[mp.ids[5]].tokens);
  EXPECT_EQ(oa[ids[1]].tokens, op[mp.ids[6]].tokens);
}

// 24 constrained rows in a step: their masks are filled in parallel, and each
// request gets the tokens it gets alone.
TEST(StructuredEngine, ParallelMaskFillingMatchesRequestsAlone) {
  REQUIRE_SMOLLM2();
  EngineConfig c = engine_config(true);
  c.max_num_seqs = 24;
  c.max_num_batched_tokens = 512;
  Engine batched(c);
  auto request = [](int i) {
    SamplingParams p = constrained(StructuredOutputs::Kind::Regex, R"(\(\d{3}\) \d{3}-\d{4})", 1.0f, 20);
    p.seed = 100 + i;
    return p;
  };
  std::vector<uint64_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back(batched.add_request(chat(batched, "Your phone number?"), request(i)));
  auto out = run_all(batched);
  c.max_num_seqs = 1;
  Engine alone(c);
  for (int i = 0; i < 24; i += 5) {  // a sample of them, one at a time
    const uint64_t id = alone.add_request(chat(alone, "Your phone number?"), request(i));
    auto one = run_all(alone);
    EXPECT_EQ(one[id].tokens, out[ids[static_cast<size_t>(i)]].tokens) << "request " << i;
  }
  for (uint64_t id : ids) {
    ASSERT_EQ(out[id].finish, FinishReason::Stop) << out[id].text;
    EXPECT_TRUE(std::regex_match(out[id].text, std::regex(R"(\(\d{3}\) \d{3}-\d{4})"))) << out[id].text;
  }
}

TEST(StructuredEngine, InvalidConstraintIsRefusedAndTheEngineGoesOn) {
  REQUIRE_SMOLLM2();
  Engine e(engine_config(true));
  SamplingParams bad = constrained(StructuredOutputs::Kind::Regex, "([unclosed", 0.0f, 8);
  EXPECT_EQ(param_of([&] { e.add_request(chat(e, "hi"), bad); }), "structured_outputs");
  EXPECT_FALSE(e.has_unfinished());
  const uint64_t id = e.add_request(chat(e, "hi"), constrained(StructuredOutputs::Kind::Choice, "", 0.0f, 20));
  auto out = run_all(e);
  EXPECT_EQ(out[id].finish, FinishReason::Stop);
}

}  // namespace
}  // namespace deepinfer
