// `deepinfer bench multiturn`: conversations over a shared long document, the
// traffic the KV tiers are for. C conversations each start with the same
// D-token document and a question of their own; every turn appends the
// previous answer and a new Q-token message and generates O tokens. A turn of
// every conversation runs together; between turns the device's pages fill
// with the other conversations' KV, so what a turn finds cached depends on the
// prefix cache and the tiers below it (--kv-offloading-size, --kv-cache-dir).
// Reports per turn and overall: prompt tokens served from the caches, mean
// time to first token and output tok/s.
#include <chrono>
#include <cstdio>
#include <random>

#include "bench_sweep.h"
#include "core/error.h"
#include "deepinfer/llm.h"
#include "engine/engine.h"
#include "engine_flags.h"

namespace deepinfer::cli {

int run_bench_multiturn(int argc, char** argv) {
  CLI::App app{"Multi-turn conversations over a shared long document: prefix hit rate and time to first token."};
  app.name("deepinfer bench multiturn");
  EngineFlags ef;
  add_engine_flags(app, ef);
  int32_t conversations = 16, turns = 4, doc_len = 4096, question_len = 64, output_len = 64;
  app.add_option("--conversations", conversations, "conversations running together")->check(CLI::Range(1, 4096));
  app.add_option("--turns", turns, "turns per conversation")->check(CLI::Range(1, 256));
  app.add_option("--doc-len", doc_len, "tokens of the shared document")->check(CLI::Range(1, 1 << 20));
  app.add_option("--question-len", question_len, "tokens of each new user message")->check(CLI::Range(1, 1 << 16));
  app.add_option("--output-len", output_len, "tokens generated per turn")->check(CLI::Range(1, 1 << 16));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (ef.config.max_num_seqs < conversations) ef.config.max_num_seqs = conversations;
  EngineConfig config = finish_engine_flags(ef, argv[0]);
  const int64_t longest = int64_t{doc_len} + int64_t{turns} * (question_len + output_len);
  if (config.max_model_len == 0) config.max_model_len = static_cast<int32_t>(std::min<int64_t>(longest + 16, 1 << 24));
  LLM llm(std::move(config));
  DI_CHECK(longest <= llm.engine().max_model_len(), "a conversation reaches {} tokens, over --max-model-len {}", longest,
           llm.engine().max_model_len());

  std::mt19937 rng(4321);
  std::uniform_int_distribution<int32_t> token(100, std::min(llm.engine().vocab_size(), 30000) - 1);
  auto random_tokens = [&](int32_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = token(rng);
    return t;
  };
  const std::vector<int32_t> doc = random_tokens(doc_len);
  std::vector<std::vector<int32_t>> history(static_cast<size_t>(conversations), doc);

  std::printf("%-6s %14s %14s %10s %12s %12s\n", "turn", "prompt tok", "cached tok", "hit %", "TTFT mean s",
              "out tok/s");
  int64_t all_prompt = 0, all_cached = 0;
  double all_ttft = 0;
  for (int32_t turn = 0; turn < turns; ++turn) {
    std::vector<GenerateInput> inputs(static_cast<size_t>(conversations));
    for (int32_t c = 0; c < conversations; ++c) {
      std::vector<int32_t>& h = history[static_cast<size_t>(c)];
      const std::vector<int32_t> question = random_tokens(question_len);
      h.insert(h.end(), question.begin(), question.end());
      GenerateInput& in = inputs[static_cast<size_t>(c)];
      in.prompt_ids = h;
      in.params.temperature = 0;
      in.params.ignore_eos = true;
      in.params.max_tokens = output_len;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<CompletionOutput> outs = llm.generate(inputs);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t prompt = 0, cached = 0, generated = 0;
    double ttft = 0;
    for (int32_t c = 0; c < conversations; ++c) {
      const CompletionOutput& o = outs[static_cast<size_t>(c)];
      prompt += static_cast<int64_t>(o.prompt_ids.size());
      cached += o.num_cached_prompt_tokens;
      ttft += o.time_to_first_token_s;
      const std::vector<int32_t>& answer = o.choices[0].token_ids;
      generated += static_cast<int64_t>(answer.size());
      std::vector<int32_t>& h = history[static_cast<size_t>(c)];
      h.insert(h.end(), answer.begin(), answer.end());
    }
    std::printf("%-6d %14lld %14lld %10.1f %12.3f %12.1f\n", turn + 1, static_cast<long long>(prompt),
                static_cast<long long>(cached), 100.0 * static_cast<double>(cached) / static_cast<double>(prompt),
                ttft / conversations, static_cast<double>(generated) / wall);
    std::fflush(stdout);
    all_prompt += prompt;
    all_cached += cached;
    all_ttft += ttft;
  }
  std::printf("overall: %.1f%% of %lld prompt tokens from the caches, mean time to first token %.3f s\n",
              100.0 * static_cast<double>(all_cached) / static_cast<double>(all_prompt),
              static_cast<long long>(all_prompt), all_ttft / (static_cast<double>(conversations) * turns));
  const EngineStats st = llm.engine().stats();
  if (st.kv_tiers) {
    std::printf("kv tiers: %lld prompt tokens loaded; host %lld hits, %lld blocks offloaded, %lld evicted; disk %lld "
                "blocks read, %lld files\n",
                static_cast<long long>(st.tier_hit_tokens), static_cast<long long>(st.tiers.host.hits),
                static_cast<long long>(st.tiers.offloaded_blocks), static_cast<long long>(st.tiers.host.evictions),
                static_cast<long long>(st.tiers.prefetched_blocks), static_cast<long long>(st.tiers.disk.files));
  }
  return 0;
}

}  // namespace deepinfer::cli
