// `deepinfer chat-template --tokenizer PATH`: renders a chat request read from
// stdin ({"messages": [...], "tools": [...], "add_generation_prompt": true, ...})
// with the model's chat template and prints the prompt.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "command.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json_parse.h"
#include "loader/gguf.h"
#include "tokenizer/chat_template.h"

namespace deepinfer::cli {
namespace {

std::string read_text(const std::filesystem::path& path) {
  constexpr uint64_t kMaxConfigBytes = 64ull << 20;
  return read_regular_file(path.string(), kMaxConfigBytes);
}

JsonLimits cli_json_limits() {
  JsonLimits limits;
  limits.duplicates = DuplicateKeys::LastWins;
  return limits;
}

std::string gguf_token(const GgufFile& f, const char* id_key) {
  auto id = f.find_u64(id_key);
  if (!id) return "";
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  DI_CHECK(*id < tokens.size(), "GGUF {} = {} is outside the vocabulary ({} tokens)", id_key, *id, tokens.size());
  return std::string(tokens[*id]);
}

// PATH: a folder holding tokenizer_config.json, that file itself, or a .gguf.
ChatTemplateSource load_template(const std::string& path, const std::string& name) {
  std::filesystem::path p(path);
  if (p.extension() == ".gguf") {
    GgufFile f = GgufFile::open(path);
    auto source = f.find_string("tokenizer.chat_template");
    DI_CHECK(source.has_value(), "'{}' has no tokenizer.chat_template metadata", path);
    return {std::string(*source), gguf_token(f, "tokenizer.ggml.bos_token_id"),
            gguf_token(f, "tokenizer.ggml.eos_token_id")};
  }
  if (std::filesystem::is_directory(p)) p /= "tokenizer_config.json";
  nlohmann::ordered_json config = parse_ordered_json(read_text(p), p.string(), cli_json_limits());
  try {
    return chat_template_from_config(config, name);
  } catch (const Error& e) {
    fail("{}: {}", p.string(), e.what());
  }
}

int run_chat_template(int argc, char** argv) {
  CLI::App app{"Render a chat request (JSON on stdin) with a model's chat template"};
  std::string tokenizer;
  std::string name = "default";
  app.add_option("--tokenizer", tokenizer, "tokenizer folder, tokenizer_config.json or .gguf")->required();
  app.add_option("--template-name", name, "template to use when the config lists several");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  ChatTemplateSource src = load_template(tokenizer, name);
  std::string input(std::istreambuf_iterator<char>(std::cin), {});
  nlohmann::ordered_json request = parse_ordered_json(input, "stdin", cli_json_limits());
  DI_CHECK(request.is_object(), "stdin must hold a JSON object with 'messages'");
  DI_CHECK(request.contains("messages") && request["messages"].is_array(), "request needs a 'messages' array");
  bool add_generation_prompt = true;
  if (request.contains("add_generation_prompt")) {
    DI_CHECK(request["add_generation_prompt"].is_boolean(), "'add_generation_prompt' must be true or false");
    add_generation_prompt = request["add_generation_prompt"].get<bool>();
  }
  nlohmann::ordered_json tools = request.contains("tools") ? request["tools"] : nlohmann::ordered_json();
  // Every other field is an extra template variable (enable_thinking, date_string, ...).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  for (auto it = request.begin(); it != request.end(); ++it) {
    if (it.key() != "messages" && it.key() != "tools" && it.key() != "add_generation_prompt") extra[it.key()] = it.value();
  }
  ChatTemplateOptions options;
  options.bos_token = src.bos_token;
  options.eos_token = src.eos_token;
  ChatTemplate tmpl(src.source, options);
  std::string prompt = tmpl.render(request["messages"], tools, add_generation_prompt, extra);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return 0;
}

}  // namespace

DEEPINFER_COMMAND("chat-template", "render a chat request with a model's chat template", run_chat_template);

}  // namespace deepinfer::cli
