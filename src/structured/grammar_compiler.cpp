#include "structured/grammar_compiler.h"

#include <fmt/format.h>

#include <atomic>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include <xgrammar/xgrammar.h>

// XGrammar's error type (an internal header: its what() adds a log header).
#include "support/logging.h"

#include "core/error.h"
#include "core/logging.h"
#include "deepinfer/sampling_params.h"
#include "structured/compiled_grammar.h"
#include "structured/xgrammar_logging.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::structured {

namespace {

// An EBNF string literal holding `text` exactly.
std::string ebnf_literal(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", c);
        } else {
          out.push_back(static_cast<char>(c));  // UTF-8 passes through whole
        }
    }
  }
  return out + "\"";
}

std::string choice_grammar(const std::vector<std::string>& choices) {
  std::string g = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) g += " | ";
    g += ebnf_literal(choices[i]);
  }
  return g;
}

// A tool-call constraint's spec (StructuredOutputs::Kind::ToolCall), parsed
// and checked once for either mode.
struct ToolCallSpec {
  std::string format;  // hermes | llama3_json | deepseek_v3
  bool auto_mode = false;
  nlohmann::ordered_json tools;  // [{name, parameters?, strict?}], each with a string name
};

ToolCallSpec parse_tool_call_spec(const std::string& spec) {
  auto j = nlohmann::ordered_json::parse(spec, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("tools") || !j["tools"].is_array() || j["tools"].empty()) {
    throw Error("a tool-call constraint needs a non-empty 'tools' list");
  }
  ToolCallSpec out;
  out.format = j.value("format", "hermes");
  if (out.format != "hermes" && out.format != "llama3_json" && out.format != "deepseek_v3") {
    throw Error(fmt::format("unknown tool-call format '{}'", out.format));
  }
  out.auto_mode = j.value("mode", "required") == "auto";
  for (const auto& tool : j["tools"]) {
    if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string()) {
      throw Error("each tool needs a string 'name'");
    }
  }
  out.tools = std::move(j["tools"]);
  return out;
}

// One tool call in the template's format: Hermes wraps a {"name",
// "arguments"} object in <tool_call> tags; Llama 3.1 writes a bare {"name",
// "parameters"} object; DeepSeek-V3 names the function between its markers
// and fences the arguments as a JSON code block.
xgrammar::Grammar tool_call_grammar(const ToolCallSpec& spec) {
  const std::string& format = spec.format;
  auto literal = [](const std::string& text) { return xgrammar::Grammar::FromEBNF("root ::= " + ebnf_literal(text)); };
  std::vector<xgrammar::Grammar> per_tool;
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  for (const auto& tool : spec.tools) {
    nlohmann::ordered_json params = tool.value("parameters", nlohmann::ordered_json());
    if (params.is_null()) params = nlohmann::ordered_json{{"type", "object"}};
    if (format == "deepseek_v3") {
      const std::string name = tool["name"].get<std::string>();
      per_tool.push_back(xgrammar::Grammar::Concat(
          {literal("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n"),
           xgrammar::Grammar::FromJSONSchema(params.dump(), /*any_whitespace=*/false),
           literal("\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")}));
      continue;
    }
    const char* args_key = format == "hermes" ? "arguments" : "parameters";
    calls.push_back({{"type", "object"},
                     {"properties", {{"name", {{"const", tool["name"]}}}, {args_key, params}}},
                     {"required", {"name", args_key}},
                     {"additionalProperties", false}});
  }
  if (format == "deepseek_v3") return per_tool.size() == 1 ? per_tool[0] : xgrammar::Grammar::Union(per_tool);
  const nlohmann::ordered_json schema = calls.size() == 1 ? calls[0] : nlohmann::ordered_json{{"anyOf", calls}};
  xgrammar::Grammar call = xgrammar::Grammar::FromJSONSchema(schema.dump(), /*any_whitespace=*/false);
  if (format == "llama3_json") return call;
  return xgrammar::Grammar::Concat({literal("<tool_call>\n"), call, literal("\n</tool_call>")});
}

// tool_choice "auto" with strict tools: free text, but once the model opens a
// call (the format's trigger) the call must be one of the tools with valid
// arguments (XGrammar's triggered tags); any number of calls.
std::string auto_tool_calls_structural_tag(const ToolCallSpec& spec) {
  const std::string& format = spec.format;
  nlohmann::ordered_json tags = nlohmann::ordered_json::array();
  std::string trigger;
  for (const auto& tool : spec.tools) {
    const std::string name = tool["name"].get<std::string>();
    nlohmann::ordered_json params = tool.value("parameters", nlohmann::ordered_json());
    if (params.is_null() || !tool.value("strict", false)) params = nlohmann::ordered_json{{"type", "object"}};
    std::string begin, end;
    if (format == "hermes") {
      trigger = "<tool_call>";
      begin = "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": ";
      end = "}\n</tool_call>";
    } else if (format == "llama3_json") {
      trigger = "{\"name\": \"";
      begin = "{\"name\": \"" + name + "\", \"parameters\": ";
      end = "}";
    } else {
      trigger = "<｜tool▁call▁begin｜>";
      begin = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n";
      end = "\n```<｜tool▁call▁end｜>";
    }
    tags.push_back({{"type", "tag"},
                    {"begin", begin},
                    {"content", {{"type", "json_schema"}, {"json_schema", params}}},
                    {"end", end}});
  }
  nlohmann::ordered_json tag = {
      {"type", "structural_tag"},
      {"format", {{"type", "triggered_tags"}, {"triggers", {trigger}}, {"tags", tags}, {"at_least_one", false},
                  {"stop_after_first", false}}}};
  return tag.dump();
}

// XGrammar's EBNF names rules with `::=`; Lark uses `:`.
bool looks_like_ebnf(const std::string& grammar) { return grammar.find("::=") != std::string::npos; }

// Regex features XGrammar 0.2.9 reads wrongly rather than refusing: Unicode
// classes (\p{L} becomes the letters p, L, ...), \A and \Z anchors (literal
// letters) and look-around (ignored). A grammar built from them would force
// outputs the pattern does not allow, so such patterns are refused instead.
std::string unsupported_regex_feature(std::string_view re) {
  for (size_t i = 0; i + 1 < re.size(); ++i) {
    if (re[i] == '\\') {
      const char c = re[i + 1];
      if (c == 'p' || c == 'P') return "Unicode property classes (\\p{...})";
      if (c == 'A' || c == 'Z' || c == 'z') return fmt::format("the \\{} anchor", c);
      if (c == 'b' || c == 'B') return "word boundaries (\\b)";
      ++i;  // the escaped character is not special
      continue;
    }
    if (re[i] == '(' && re[i + 1] == '?' && i + 2 < re.size()) {
      const char c = re[i + 2];
      if (c == '=' || c == '!' || (c == '<' && i + 3 < re.size() && (re[i + 3] == '=' || re[i + 3] == '!'))) {
        return "look-around assertions";
      }
    }
  }
  return {};
}

// Every regex a JSON schema holds (pattern, patternProperties keys), checked.
void check_schema_patterns(const nlohmann::ordered_json& node, const std::string& path) {
  if (node.is_array()) {
    for (size_t i = 0; i < node.size(); ++i) check_schema_patterns(node[i], fmt::format("{}/{}", path, i));
    return;
  }
  if (!node.is_object()) return;
  for (const auto& [key, value] : node.items()) {
    if (key == "pattern" && value.is_string()) {
      if (auto why = unsupported_regex_feature(value.get<std::string>()); !why.empty()) {
        throw Error(fmt::format("the pattern at {}/pattern uses {}, which structured output cannot enforce", path, why));
      }
    }
    if (key == "patternProperties" && value.is_object()) {
      for (const auto& [re, sub] : value.items()) {
        if (auto why = unsupported_regex_feature(re); !why.empty()) {
          throw Error(fmt::format("a patternProperties key at {} uses {}, which structured output cannot enforce", path, why));
        }
      }
    }
    check_schema_patterns(value, path + "/" + key);
  }
}

void check_supported(const StructuredOutputs& so) {
  if (so.kind == StructuredOutputs::Kind::Regex) {
    if (auto why = unsupported_regex_feature(so.spec); !why.empty()) {
      throw Error(fmt::format("the regex uses {}, which structured output cannot enforce", why));
    }
  } else if (so.kind == StructuredOutputs::Kind::Json || so.kind == StructuredOutputs::Kind::ToolCall) {
    const auto schema = nlohmann::ordered_json::parse(so.spec, nullptr, /*allow_exceptions=*/false);
    check_schema_patterns(schema, "#");
  }
}

}  // namespace

// Whitespace characters allowed between two JSON tokens: room for pretty
// printing (a newline and the indentation of deep nesting), but a small model
// that starts emitting newlines cannot fill max_tokens with them - with no
// bound, greedy decoding of SmolLM2 runs into exactly that after a key.
constexpr int kMaxJsonWhitespace = 32;

struct GrammarCompiler::Impl {
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;
  // Compilations running, including those whose caller gave up at the budget.
  std::atomic<int> running{0};
  Impl(xgrammar::TokenizerInfo i, int threads)
      // XGrammar's own cache stays off: ours is bounded and keyed the same way.
      : info(std::move(i)), compiler(info, threads, /*cache_enabled=*/false) {}

  xgrammar::CompiledGrammar run(const StructuredOutputs& so) {
    switch (so.kind) {
      case StructuredOutputs::Kind::Json:
        // Free whitespace between JSON tokens unless the request asked for
        // compact output, at most kMaxJsonWhitespace characters per gap;
        // XGrammar's strict mode: no properties beyond those the schema names
        // unless it allows them.
        return compiler.CompileJSONSchema(so.spec, so.any_whitespace, std::nullopt, std::nullopt, true,
                                          so.any_whitespace ? std::optional<int>(kMaxJsonWhitespace) : std::nullopt);
      case StructuredOutputs::Kind::JsonObject:
        // OpenAI's JSON mode: a JSON object, whatever its keys. (XGrammar's
        // built-in JSON grammar also takes an array at the top level.)
        return compiler.CompileJSONSchema(R"({"type": "object", "additionalProperties": true})", true, std::nullopt,
                                          std::nullopt, true, kMaxJsonWhitespace);
      case StructuredOutputs::Kind::Regex: return compiler.CompileRegex(so.spec);
      case StructuredOutputs::Kind::Choice: return compiler.CompileGrammar(choice_grammar(so.choices), "root");
      case StructuredOutputs::Kind::Grammar:
        return looks_like_ebnf(so.spec) ? compiler.CompileGrammar(so.spec, "root") : compiler.CompileLark(so.spec);
      case StructuredOutputs::Kind::ToolCall: {
        const ToolCallSpec spec = parse_tool_call_spec(so.spec);
        return spec.auto_mode ? compiler.CompileStructuralTag(auto_tool_calls_structural_tag(spec))
                              : compiler.CompileGrammar(tool_call_grammar(spec));
      }
    }
    throw Error("unknown structured output kind");
  }
};

namespace {

xgrammar::TokenizerInfo make_tokenizer_info(const Tokenizer& tok, int32_t vocab_size) {
  DI_CHECK(vocab_size >= tok.vocab_size(), "structured output: the model's vocabulary ({}) is smaller than the "
           "tokenizer's ({})", vocab_size, tok.vocab_size());
  // Decoded bytes per token (XGrammar's RAW vocabulary): special tokens are
  // empty, which XGrammar never allows except as stop tokens.
  std::vector<std::string> vocab(static_cast<size_t>(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) vocab[static_cast<size_t>(id)] = tok.token_bytes(id);
  std::vector<int32_t> stops(tok.eos_ids().begin(), tok.eos_ids().end());
  DI_CHECK(!stops.empty(), "structured output needs the tokenizer's end-of-sequence token");
  return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, vocab_size, stops, /*add_prefix_space=*/false);
}

}  // namespace

GrammarCompiler::GrammarCompiler(const Tokenizer& tokenizer, int32_t vocab_size, CompilerOptions options)
    : impl_(std::make_shared<Impl>(make_tokenizer_info(tokenizer, vocab_size), options.threads)),
      vocab_size_(vocab_size),
      options_(options) {}

GrammarCompiler::~GrammarCompiler() = default;

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const StructuredOutputs& so) {
  so.validate();
  const std::string key = so.key();
  {
    std::lock_guard lock(mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      ++stats_.cache_hits;
      return it->second.grammar;
    }
  }
  // Compile on a thread of its own, so the caller can stop waiting at the
  // budget; the thread holds the compiler (impl_) and the constraint alive.
  // Their number is bounded: compilations abandoned at the budget keep
  // running, and a client must not pile them up.
  if (impl_->running.fetch_add(1) >= options_.max_running) {
    impl_->running.fetch_sub(1);
    throw ParamError(so.param, fmt::format("{} grammars are compiling already; retry later", options_.max_running));
  }
  auto promise = std::make_shared<std::promise<std::shared_ptr<const CompiledGrammar>>>();
  std::future<std::shared_ptr<const CompiledGrammar>> result = promise->get_future();
  std::thread([impl = impl_, so, promise] {
    struct Done {
      std::atomic<int>& running;
      ~Done() { running.fetch_sub(1); }
    } done{impl->running};
    try {
      check_supported(so);
      WarningCollector approximations;
      const auto t0 = std::chrono::steady_clock::now();
      auto grammar = std::make_shared<const CompiledGrammar>(CompiledGrammar{impl->run(so)});
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!approximations.warnings().empty()) {
        // Parts XGrammar enforces loosely (e.g. oneOf as anyOf): the operator should know.
        log_info("structured output: {} compiled in {:.0f} ms with {} approximation(s), first: {}", to_string(so.kind),
                 ms, approximations.warnings().size(), approximations.warnings().front());
      }
      promise->set_value(std::move(grammar));
    } catch (const xgrammar::LogFatalError& e) {
      // Its bare message, without the log header what() adds (time, source file).
      promise->set_exception(std::make_exception_ptr(Error(e.std::runtime_error::what())));
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  }).detach();
  if (result.wait_for(options_.timeout) != std::future_status::ready) {
    std::lock_guard lock(mutex_);
    ++stats_.timed_out;
    throw ParamError(so.param, fmt::format("compiling the {} took longer than the {} ms budget; simplify it",
                                           to_string(so.kind), options_.timeout.count()));
  }
  std::shared_ptr<const CompiledGrammar> grammar;
  try {
    grammar = result.get();
  } catch (const std::exception& e) {
    {
      std::lock_guard lock(mutex_);
      ++stats_.failed;
    }
    const std::string_view what = so.kind == StructuredOutputs::Kind::Json ? "JSON schema" : to_string(so.kind);
    throw ParamError(so.param, fmt::format("invalid {}: {}", what, e.what()));
  }
  std::lock_guard lock(mutex_);
  ++stats_.compiled;
  if (auto it = cache_.find(key); it != cache_.end()) return it->second.grammar;  // compiled twice meanwhile
  lru_.push_front(key);
  cache_.emplace(key, Entry{grammar, lru_.begin()});
  while (cache_.size() > options_.cache_entries) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  return grammar;
}

GrammarCompiler::Stats GrammarCompiler::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace deepinfer::structured
