// `deepinfer tokenize`: JSON lines in, JSON lines out.
//
//   deepinfer tokenize --tokenizer PATH [--add-special-tokens] < {"text": "..."} lines
//     -> one {"ids": [...]} line per input line
//   deepinfer tokenize --tokenizer PATH --decode [--skip-special-tokens] < {"ids": [...]} lines
//     -> one {"text": "..."} line per input line
//
// PATH is a tokenizer.json, a folder holding one (with tokenizer_config.json), or a
// .gguf file. Empty input lines are skipped. A malformed line stops the run: the
// error goes to stderr naming the line number, and the exit status is 1 (lines
// before it have been written).
#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

int run_tokenize(int argc, char** argv) {
  CLI::App app{"Tokenize (or detokenize) JSON lines read from stdin"};
  std::string path;
  bool add_special = false, decode = false, skip_special = false;
  app.add_option("--tokenizer", path, "tokenizer.json, a folder holding one, or a .gguf file")->required();
  app.add_flag("--add-special-tokens", add_special, "add the template tokens (e.g. BOS) when encoding");
  app.add_flag("--decode", decode, "read {\"ids\": [...]} lines and write {\"text\": ...} lines");
  app.add_flag("--skip-special-tokens", skip_special, "with --decode: leave special tokens out of the text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto tokenizer = Tokenizer::from_file(path);

  std::ios::sync_with_stdio(false);
  std::string line;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    JsonLimits limits;
    limits.duplicates = DuplicateKeys::LastWins;
    nlohmann::json in = parse_json(line, fmt::format("stdin line {}", line_no), limits);
    DI_CHECK(in.is_object(), "stdin line {}: not a JSON object", line_no);
    nlohmann::json out;
    if (decode) {
      auto it = in.find("ids");
      DI_CHECK(it != in.end() && it->is_array(), "stdin line {}: expected {{\"ids\": [...]}}", line_no);
      std::vector<int32_t> ids;
      for (const auto& v : *it) {
        DI_CHECK(v.is_number_integer(), "stdin line {}: ids must be integers", line_no);
        auto id = v.get<int64_t>();
        DI_CHECK(id >= 0 && id < tokenizer->vocab_size(), "stdin line {}: id {} outside the vocabulary (size {})",
                 line_no, id, tokenizer->vocab_size());
        ids.push_back(static_cast<int32_t>(id));
      }
      out["text"] = tokenizer->decode(ids, skip_special);
    } else {
      auto it = in.find("text");
      DI_CHECK(it != in.end() && it->is_string(), "stdin line {}: expected {{\"text\": \"...\"}}", line_no);
      out["ids"] = tokenizer->encode(it->get_ref<const std::string&>(), add_special);
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
  std::cout.flush();
  return 0;
}

}  // namespace

DEEPINFER_COMMAND("tokenize", "text <-> token ids as JSON lines (stdin -> stdout)", run_tokenize);

}  // namespace deepinfer::cli
