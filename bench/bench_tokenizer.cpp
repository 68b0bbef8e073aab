// Tokenizer speed: single-thread encoding MB/s over a JSON-lines corpus (one
// encode call per document, no special tokens) and load time of each tokenizer.
// The corpus and the matching Hugging Face measurement come from
// scripts/bench_tokenizer_hf.py; see docs/benchmarks.md ("Tokenizer"). Without
// --corpus only the load is timed (scripts/bench_tokenizer_load.py runs it so).
//
//   bench_tokenizer --corpus /tmp/tok_corpus.jsonl --tokenizer /tmp/tok/qwen3.json [--tokenizer ...]
//   bench_tokenizer --tokenizer models/gemma-3-270m-q4_k_m.gguf
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  std::string corpus_path;
  std::vector<std::string> tokenizers;
  int repeat = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--corpus") corpus_path = argv[i + 1];
    else if (flag == "--tokenizer") tokenizers.push_back(argv[i + 1]);
    else if (flag == "--repeat") repeat = std::max(1, std::atoi(argv[i + 1]));
  }
  if (tokenizers.empty()) {
    std::fprintf(stderr, "usage: bench_tokenizer [--corpus FILE.jsonl] --tokenizer PATH [--tokenizer PATH ...] [--repeat N]\n");
    return 2;
  }
  std::vector<std::string> docs;
  size_t nbytes = 0;
  if (!corpus_path.empty()) {
    std::ifstream in(corpus_path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      docs.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
      nbytes += docs.back().size();
    }
  }
  using clock = std::chrono::steady_clock;
  for (const auto& path : tokenizers) {
    auto t0 = clock::now();
    auto tok = deepinfer::Tokenizer::from_file(path);
    double load = std::chrono::duration<double>(clock::now() - t0).count();
    std::string name = path.substr(path.find_last_of('/') + 1);
    if (docs.empty()) {
      std::printf("deepinfer %s: load %.1f ms (%d tokens)\n", name.c_str(), load * 1000, tok->vocab_size());
      continue;
    }
    double best = 1e30;
    size_t ntok = 0;
    for (int r = 0; r < repeat; ++r) {
      ntok = 0;
      t0 = clock::now();
      for (const auto& d : docs) ntok += tok->encode(d, false).size();
      best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
    }
    std::printf("deepinfer %s: load %.0f ms, encode %.2f MB/s (%zu tokens, %.2f MB, best of %d)\n", name.c_str(),
                load * 1000, nbytes / best / 1e6, ntok, nbytes / 1e6, repeat);
  }
  return 0;
}
