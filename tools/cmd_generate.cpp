// `deepinfer generate`: one prompt streamed to stdout, or a JSONL batch
// (--input/--output) run together with continuous batching.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "command.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "core/logging.h"
#include "deepinfer/llm.h"
#include "engine/generate_io.h"
#include "engine_flags.h"

namespace deepinfer::cli {
namespace {

struct GenerateFlags {
  std::string prompt;
  std::string system;
  bool chat = false;
  std::string input_path;
  std::string output_path;
  int32_t max_tokens = 256;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  std::optional<uint64_t> seed;
  bool quiet = false;
};

std::vector<GenerateInput> read_jsonl(const std::string& path, const SamplingParams& defaults) {
  DI_CHECK(std::ifstream(path).good(), "cannot read input file '{}'", path);
  nlohmann::ordered_json default_fields = nlohmann::ordered_json::object();
  default_fields["temperature"] = defaults.temperature;
  default_fields["max_tokens"] = *defaults.max_tokens;
  if (defaults.seed) default_fields["seed"] = *defaults.seed;
  std::vector<GenerateInput> inputs;
  JsonLimits limits;
  limits.duplicates = DuplicateKeys::LastWins;
  // Ordered: a JSON schema's properties keep the order they were written in.
  for_each_jsonl_object(path, limits, [&](nlohmann::ordered_json&& j, const std::string& where) {
    inputs.push_back(parse_generate_input(j, default_fields, where));
  });
  return inputs;
}


// The KV tiers' part of the run: what they served, moved and hold.
void print_kv_tier_summary(const EngineStats& st) {
  const KvTierStats& t = st.tiers;
  std::fprintf(stderr,
               "kv tiers: %lld prompt tokens loaded instead of computed; host: %lld hits, %lld blocks offloaded, "
               "%lld evicted, %lld skipped (full)",
               static_cast<long long>(st.tier_hit_tokens), static_cast<long long>(t.host.hits),
               static_cast<long long>(t.offloaded_blocks), static_cast<long long>(t.host.evictions),
               static_cast<long long>(t.offload_skipped));
  if (t.disk_enabled) {
    std::fprintf(stderr,
                 "; disk: %lld blocks read in %lld prefetches (mean %.1f ms, max %.1f ms), %.1f MiB written, "
                 "holds %lld files (%.1f MiB), %lld evicted, %lld expired, %lld rejected as damaged, %lld write "
                 "errors",
                 static_cast<long long>(t.prefetched_blocks), static_cast<long long>(t.prefetches),
                 t.prefetches > 0 ? t.prefetch_ms_total / static_cast<double>(t.prefetches) : 0.0, t.prefetch_ms_max,
                 static_cast<double>(t.disk.bytes_written) / 1048576.0, static_cast<long long>(t.disk.files),
                 static_cast<double>(t.disk.bytes) / 1048576.0, static_cast<long long>(t.disk.evictions),
                 static_cast<long long>(t.disk.expirations), static_cast<long long>(t.disk.rejected),
                 static_cast<long long>(t.disk.write_errors));
  }
  std::fprintf(stderr, "\n");
}

int run_batch(LLM& llm, const GenerateFlags& g, const SamplingParams& defaults) {
  std::vector<GenerateInput> inputs = read_jsonl(g.input_path, defaults);
  DI_CHECK(!inputs.empty(), "input file '{}' holds no prompts", g.input_path);
  const auto start = std::chrono::steady_clock::now();
  auto progress = [&](const GenerateProgress& p) {
    if (g.quiet) return;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int width = 30;
    const int filled = static_cast<int>(width * p.finished / std::max<size_t>(p.total, 1));
    std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu requests, %.1f tok/s generated", filled,
                 "##############################", width - filled, "", p.finished, p.total,
                 p.generated_tokens / std::max(secs, 1e-9));
    if (p.finished == p.total) std::fprintf(stderr, "\n");
  };
  std::vector<CompletionOutput> outputs = llm.generate(inputs, progress);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::ofstream out_file;
  std::ostream* out = &std::cout;
  if (!g.output_path.empty() && g.output_path != "-") {
    out_file.open(g.output_path);
    DI_CHECK(out_file.good(), "cannot write output file '{}'", g.output_path);
    out = &out_file;
  }
  int64_t prompt_tokens = 0, generated = 0, cached = 0;
  double ttft_sum = 0;
  const bool speculative = llm.engine().config().speculative.enabled();
  for (size_t i = 0; i < outputs.size(); ++i) {
    const CompletionOutput& o = outputs[i];
    int64_t completion_tokens = 0;
    for (const auto& c : o.choices) completion_tokens += static_cast<int64_t>(c.token_ids.size());
    nlohmann::json j = completion_json(o, speculative);
    j["index"] = i;
    *out << j.dump() << "\n";
    prompt_tokens += static_cast<int64_t>(o.prompt_ids.size());
    generated += completion_tokens;
    cached += o.num_cached_prompt_tokens;
    ttft_sum += o.time_to_first_token_s;
  }
  out->flush();
  std::fprintf(stderr,
               "summary: %zu requests, %lld prompt tokens (%lld from prefix cache), %lld generated tokens in "
               "%.2f s: %.1f generated tok/s, %.1f total tok/s, mean time to first token %.3f s\n",
               outputs.size(), static_cast<long long>(prompt_tokens), static_cast<long long>(cached),
               static_cast<long long>(generated), secs, generated / secs, (prompt_tokens + generated) / secs,
               ttft_sum / outputs.size());
  const EngineStats st = llm.engine().stats();
  std::fprintf(stderr, "steps: %lld (%lld as graphs), device busy %.1f ms, idle %.1f ms between steps (max %.2f ms)\n",
               static_cast<long long>(st.steps), static_cast<long long>(st.graph_steps), st.device_busy_ms,
               st.device_idle_ms, st.device_idle_max_ms);
  if (st.grammar_masked_rows > 0) {
    std::fprintf(stderr, "structured output: %lld rows masked, %.1f ms filling masks (%.1f us per row)\n",
                 static_cast<long long>(st.grammar_masked_rows), st.grammar_mask_ms,
                 1e3 * st.grammar_mask_ms / static_cast<double>(st.grammar_masked_rows));
  }
  if (st.kv_tiers) print_kv_tier_summary(st);
  if (st.speculative) {
    std::fprintf(stderr,
                 "speculative: %lld verifications, %lld drafts proposed, %lld verified, %lld accepted; speculated in "
                 "%lld of %lld windows\n",
                 static_cast<long long>(st.spec.num_drafts), static_cast<long long>(st.spec.num_proposed_tokens),
                 static_cast<long long>(st.spec.num_draft_tokens), static_cast<long long>(st.spec.num_accepted_tokens),
                 static_cast<long long>(st.spec.speculative_windows), static_cast<long long>(st.spec.windows));
  }
  return 0;
}

int run_generate(int argc, char** argv) {
  CLI::App app{"Generate text with a model: one prompt streamed to stdout, or a JSONL batch."};
  app.name("deepinfer generate");
  EngineFlags ef;
  GenerateFlags g;
  add_engine_flags(app, ef);
  app.add_option("--prompt,-p", g.prompt, "prompt text");
  app.add_flag("--chat", g.chat, "wrap the prompt as a user message in the model's chat template");
  app.add_option("--system", g.system, "system message (with --chat)");
  app.add_option("--input", g.input_path, "JSONL file of {\"prompt\"|\"messages\", sampling fields...}");
  app.add_option("--output", g.output_path, "JSONL output file (default stdout)");
  app.add_option("--max-tokens,-n", g.max_tokens, "tokens to generate at most")->check(CLI::Range(1, 1 << 24));
  app.add_option("--temperature,-t", g.temperature, "0 = greedy (default)");
  app.add_option("--top-k", g.top_k, "0 = off");
  app.add_option("--top-p", g.top_p, "nucleus sampling mass");
  app.add_option("--min-p", g.min_p, "minimum probability relative to the top token");
  app.add_option("--seed", g.seed, "sampling seed");
  app.add_flag("--quiet,-q", g.quiet, "only errors on stderr");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (g.quiet) set_log_level(LogLevel::Warn);
  DI_CHECK(g.input_path.empty() != g.prompt.empty(), "pass exactly one of --prompt or --input");

  SamplingParams params;
  params.temperature = g.temperature;
  params.top_k = g.top_k;
  params.top_p = g.top_p;
  params.min_p = g.min_p;
  params.seed = g.seed;
  params.max_tokens = g.max_tokens;
  LLM llm(finish_engine_flags(ef, argv[0]));
  params.validate(llm.engine().vocab_size());
  if (!g.input_path.empty()) return run_batch(llm, g, params);

  GenerateInput input;
  input.params = params;
  if (g.chat) {
    input.messages = nlohmann::json::array();
    if (!g.system.empty()) input.messages.push_back({{"role", "system"}, {"content", g.system}});
    input.messages.push_back({{"role", "user"}, {"content", g.prompt}});
  } else {
    input.prompt = g.prompt;
  }
  const auto start = std::chrono::steady_clock::now();
  CompletionOutput o = llm.stream(input, [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const size_t n = o.choices[0].token_ids.size();
  const double decode_secs = secs - o.time_to_first_token_s;
  log_info("generate: {} prompt tokens, {} generated ({}); first token after {:.3f} s, then {:.1f} tok/s",
           o.prompt_ids.size(), n, to_string(o.choices[0].finish_reason), o.time_to_first_token_s,
           n > 1 && decode_secs > 0 ? (n - 1) / decode_secs : 0.0);
  return 0;
}

}  // namespace

DEEPINFER_COMMAND("generate", "generate text from a prompt or a JSONL batch", run_generate);

}  // namespace deepinfer::cli
