// `deepinfer generate`: one prompt streamed to stdout, or a JSONL batch
// (--input/--output) run together with continuous batching.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "command.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "core/logging.h"
#include "deepinfer/llm.h"
#include "dist/gloo_communicator.h"
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

// The input file's text: on a data-parallel group, rank 0 reads it and hands
// it to the others (the file need not exist on their nodes).
std::string read_input(const std::string& path, const std::optional<Engine::DataParallelRank>& dp) {
  std::string text;
  if (!dp || dp->rank == 0) {
    std::ifstream in(path, std::ios::binary);
    DI_CHECK(in.good(), "cannot read input file '{}'", path);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  if (dp) {
    std::vector<uint8_t> bytes(text.begin(), text.end());
    dp->control->broadcast_bytes(bytes, 0);
    text.assign(bytes.begin(), bytes.end());
  }
  return text;
}

std::vector<GenerateInput> parse_jsonl(const std::string& path, const std::string& text,
                                       const SamplingParams& defaults) {
  nlohmann::ordered_json default_fields = nlohmann::ordered_json::object();
  default_fields["temperature"] = defaults.temperature;
  default_fields["max_tokens"] = *defaults.max_tokens;
  if (defaults.seed) default_fields["seed"] = *defaults.seed;
  std::vector<GenerateInput> inputs;
  JsonLimits limits;
  limits.duplicates = DuplicateKeys::LastWins;
  // Ordered: a JSON schema's properties keep the order they were written in.
  std::istringstream in(text);
  for_each_jsonl_object(in, path, limits, [&](nlohmann::ordered_json&& j, const std::string& where) {
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

// A data-parallel group's share of the inputs for `rank`: every size-th one.
std::vector<GenerateInput> share_of(const std::vector<GenerateInput>& inputs, int rank, int size) {
  std::vector<GenerateInput> mine;
  for (size_t i = static_cast<size_t>(rank); i < inputs.size(); i += static_cast<size_t>(size)) mine.push_back(inputs[i]);
  return mine;
}

// The output lines of every input, in input order: this rank's own, or on a
// data-parallel group every rank's (share_of's order) on rank 0, nothing on the others.
std::vector<std::string> collect_lines(std::vector<std::string> mine, size_t total,
                                       const std::optional<Engine::DataParallelRank>& dp) {
  if (!dp) return mine;
  std::vector<uint8_t> joined;
  for (const std::string& line : mine) {
    joined.insert(joined.end(), line.begin(), line.end());
    joined.push_back('\n');
  }
  const std::vector<std::vector<uint8_t>> all = dp->control->all_gather_bytes(joined);
  if (dp->rank != 0) return {};
  std::vector<std::vector<std::string>> per_rank(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    std::istringstream in(std::string(all[r].begin(), all[r].end()));
    for (std::string line; std::getline(in, line);) per_rank[r].push_back(std::move(line));
  }
  std::vector<std::string> lines;
  for (size_t i = 0; i < total; ++i) {
    const size_t r = i % all.size(), k = i / all.size();
    DI_CHECK(k < per_rank[r].size(), "data parallel: rank {} returned {} outputs, fewer than its share", r,
             per_rank[r].size());
    lines.push_back(std::move(per_rank[r][k]));
  }
  return lines;
}

int run_batch(LLM& llm, const GenerateFlags& g, const SamplingParams& defaults) {
  const std::optional<Engine::DataParallelRank> dp = llm.engine().data_parallel();
  const std::vector<GenerateInput> all_inputs = parse_jsonl(g.input_path, read_input(g.input_path, dp), defaults);
  DI_CHECK(!all_inputs.empty(), "input file '{}' holds no prompts", g.input_path);
  const std::vector<GenerateInput> inputs = dp ? share_of(all_inputs, dp->rank, dp->size) : all_inputs;
  const auto start = std::chrono::steady_clock::now();
  auto progress = [&](const GenerateProgress& p) {
    if (g.quiet || (dp && dp->rank != 0)) return;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int width = 30;
    const int filled = static_cast<int>(width * p.finished / std::max<size_t>(p.total, 1));
    std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu requests, %.1f tok/s generated", filled,
                 "##############################", width - filled, "", p.finished, p.total,
                 p.generated_tokens / std::max(secs, 1e-9));
    if (p.finished == p.total) std::fprintf(stderr, "\n");
  };
  const std::vector<CompletionOutput> outputs = llm.generate(inputs, progress);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool speculative = llm.engine().config().speculative.enabled();
  std::vector<std::string> mine;
  for (size_t i = 0; i < outputs.size(); ++i) {
    nlohmann::json j = completion_json(outputs[i], speculative);
    j["index"] = dp ? i * static_cast<size_t>(dp->size) + static_cast<size_t>(dp->rank) : i;
    mine.push_back(j.dump());
  }
  const std::vector<std::string> lines = collect_lines(std::move(mine), all_inputs.size(), dp);
  if (dp && dp->rank != 0) return 0;

  std::ofstream out_file;
  std::ostream* out = &std::cout;
  if (!g.output_path.empty() && g.output_path != "-") {
    out_file.open(g.output_path);
    DI_CHECK(out_file.good(), "cannot write output file '{}'", g.output_path);
    out = &out_file;
  }
  int64_t prompt_tokens = 0, generated = 0, cached = 0;
  double ttft_sum = 0;
  for (const std::string& line : lines) {
    *out << line << "\n";
    // The totals from the lines themselves: on a data-parallel group they
    // hold every rank's outputs.
    const nlohmann::json j = nlohmann::json::parse(line);
    prompt_tokens += j.value("prompt_tokens", int64_t{0});
    generated += j.value("completion_tokens", int64_t{0});
    cached += j.value("cached_prompt_tokens", int64_t{0});
    ttft_sum += j.value("time_to_first_token_s", 0.0);
  }
  out->flush();
  std::fprintf(stderr,
               "summary: %zu requests, %lld prompt tokens (%lld from prefix cache), %lld generated tokens in "
               "%.2f s: %.1f generated tok/s, %.1f total tok/s, mean time to first token %.3f s%s\n",
               lines.size(), static_cast<long long>(prompt_tokens), static_cast<long long>(cached),
               static_cast<long long>(generated), secs, generated / secs, (prompt_tokens + generated) / secs,
               ttft_sum / static_cast<double>(lines.size()),
               dp ? fmt::format(" ({} data-parallel ranks)", dp->size).c_str() : "");
  const EngineStats st = llm.engine().stats();
  std::fprintf(stderr,
               "steps: %lld (%lld as graphs, %lld with sequences padded to the longest), device busy %.1f ms, "
               "idle %.1f ms between steps (max %.2f ms); %lld graphs captured in %.1f ms\n",
               static_cast<long long>(st.steps), static_cast<long long>(st.graph_steps),
               static_cast<long long>(st.steps_with_padded_seqs), st.device_busy_ms,
               st.device_idle_ms, st.device_idle_max_ms, static_cast<long long>(st.graph_captures),
               st.graph_capture_ms);
  if (dp) {
    std::fprintf(stderr, "data parallel (rank 0): %lld group votes, %lld padding steps for the group's collectives\n",
                 static_cast<long long>(st.group_votes), static_cast<long long>(st.padding_steps));
  }
  if (st.grammar_masked_rows > 0) {
    std::fprintf(stderr, "structured output: %lld rows masked, %.1f ms filling masks (%.1f us per row)\n",
                 static_cast<long long>(st.grammar_masked_rows), st.grammar_mask_ms,
                 1e3 * st.grammar_mask_ms / static_cast<double>(st.grammar_masked_rows));
  }
  if (st.kv_tiers) print_kv_tier_summary(st);
  if (st.speculative) {
    std::fprintf(stderr,
                 "speculative: %lld verifications, %lld drafts proposed, %lld verified, %lld accepted; speculated in "
                 "%lld of %lld windows (%lld steps without the switch)\n",
                 static_cast<long long>(st.spec.num_drafts), static_cast<long long>(st.spec.num_proposed_tokens),
                 static_cast<long long>(st.spec.num_draft_tokens), static_cast<long long>(st.spec.num_accepted_tokens),
                 static_cast<long long>(st.spec.speculative_windows), static_cast<long long>(st.spec.windows),
                 static_cast<long long>(st.spec.unswitched_steps));
    if (!st.spec.small_step_ms.empty()) {
      std::string curve;
      for (double ms : st.spec.small_step_ms) curve += fmt::format(" {:.3f}", ms);
      std::fprintf(stderr, "speculative: step time (ms) at 1..%zu tokens:%s; drafting overhead %.3f ms\n",
                   st.spec.small_step_ms.size(), curve.c_str(), st.spec.drafting_overhead_ms);
    }
    if (!st.spec.measured_step_ms.empty()) {
      std::string points;
      for (const auto& [tokens, ms] : st.spec.measured_step_ms) points += fmt::format(" {}:{:.3f}", tokens, ms);
      std::fprintf(stderr, "speculative: measured step times (tokens:ms):%s\n", points.c_str());
    }
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
  if (const auto dp = llm.engine().data_parallel(); dp && dp->rank != 0) {
    llm.engine().drain_group();  // rank 0 runs the prompt; this rank steps with it
    return 0;
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
