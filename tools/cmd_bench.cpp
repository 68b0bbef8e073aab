// `deepinfer bench`: throughput/latency sweeps over batch size x prompt length x
// output length (a llama-bench-style table, or JSON), and the fit of the
// chunked-prefill cost model cost(q, c) = a q^2 + b q c + d q + e.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>

#include "bench_sweep.h"
#include "command.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "engine_flags.h"

namespace deepinfer::cli {
namespace {

using Seconds = std::chrono::duration<double>;

struct SweepPoint {
  int32_t batch = 0;
  int32_t prompt_len = 0;
  int32_t gen_len = 0;
  double prefill_tok_s = 0;  // prompt tokens / time until every request has its first token
  double decode_tok_s = 0;   // tokens generated after that / the rest of the time
  double ttft_mean_s = 0;
  double total_s = 0;
  // Device timeline over the decode phase (every request has its first
  // token): idle time between consecutive steps, from events around them.
  int64_t decode_steps = 0;
  double decode_busy_ms = 0;
  double decode_idle_ms = 0;
  // --eplb-ep-size: the engine's moe_lb (window over the last steps) at the end of the point.
  double moe_lb = 0;
  double moe_lb_contiguous = 0;
  double decode_idle_max_ms = 0;
  int64_t graph_steps = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Random prompts (distinct per request and repetition, so the prefix cache never hits).
SweepPoint run_point(Engine& engine, int32_t batch, int32_t prompt_len, int32_t gen_len, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> token(100, std::min(engine.vocab_size(), 30000) - 1);
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = gen_len;
  const auto start = Clock::now();
  for (int32_t b = 0; b < batch; ++b) {
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
    for (auto& t : prompt) t = token(rng);
    engine.add_request(std::move(prompt), p);
  }
  Clock::time_point last_first_token = start;
  double ttft_sum = 0;
  int64_t first_tokens = 0, generated = 0;
  std::set<uint64_t> started;
  std::optional<EngineStats> decode_start;
  SweepPoint pt{batch, prompt_len, gen_len};
  while (engine.has_unfinished()) {
    const std::vector<RequestOutput> outputs = engine.step();
    if (decode_start) {
      const EngineStats now = engine.stats();
      if (now.last_step_idle_ms >= 0) pt.decode_idle_max_ms = std::max(pt.decode_idle_max_ms, now.last_step_idle_ms);
    }
    for (const RequestOutput& o : outputs) {
      if (!o.new_tokens.empty()) started.insert(o.request_id);
      generated += static_cast<int64_t>(o.new_tokens.size());
      if (o.finished) {
        if (auto s = engine.summary(o.request_id)) {
          ttft_sum += Seconds(s->timings.first_token - s->timings.arrival).count();
          last_first_token = std::max(last_first_token, s->timings.first_token);
          ++first_tokens;
        }
      }
    }
    if (!decode_start && static_cast<int32_t>(started.size()) == batch) decode_start = engine.stats();
  }
  const auto end = Clock::now();
  if (decode_start) {
    const EngineStats s = engine.stats();
    pt.decode_steps = s.timed_steps - decode_start->timed_steps;
    pt.decode_busy_ms = s.device_busy_ms - decode_start->device_busy_ms;
    pt.decode_idle_ms = s.device_idle_ms - decode_start->device_idle_ms;
    pt.graph_steps = s.graph_steps - decode_start->graph_steps;
  }
  if (const EngineStats s = engine.stats(); s.eplb) {
    pt.moe_lb = s.moe_lb;
    pt.moe_lb_contiguous = s.moe_lb_contiguous;
  }
  const double prefill_s = Seconds(last_first_token - start).count();
  const double decode_s = Seconds(end - last_first_token).count();
  pt.prefill_tok_s = prefill_s > 0 ? double(batch) * prompt_len / prefill_s : 0;
  pt.decode_tok_s = decode_s > 0 ? double(generated - batch) / decode_s : 0;
  pt.ttft_mean_s = ttft_sum / std::max<int64_t>(first_tokens, 1);
  pt.total_s = Seconds(end - start).count();
  return pt;
}

std::vector<int32_t> parse_list(const std::string& s, const char* what) {
  std::vector<int32_t> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      int x = std::stoi(item, &used);
      DI_CHECK(used == item.size() && x > 0, "bad {} value '{}'", what, item);
      v.push_back(x);
    } catch (const std::logic_error&) {
      fail("bad {} value '{}'", what, item);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

StepCostModel fit_cost_model(Engine& engine, int32_t max_q, int32_t reps) {
  std::vector<StepSample> samples;
  std::vector<int32_t> qs, cs = {0, 256, 1024};
  for (int32_t q = 16; q <= max_q; q *= 2) qs.push_back(q);
  engine.time_prefill_step(std::min(64, max_q), 0);  // warm-up
  for (int32_t c : cs) {
    for (int32_t q : qs) {
      if (q + c > engine.max_model_len()) continue;
      std::vector<double> t;
      for (int r = 0; r < reps; ++r) t.push_back(engine.time_prefill_step(q, c));
      samples.push_back({double(q), double(c), median(t)});
      log_info("bench: prefill step q={} c={}: {:.2f} ms", q, c, samples.back().seconds * 1e3);
    }
  }
  StepCostModel m = StepCostModel::fit(samples);
  double worst = 0;
  for (const auto& s : samples) worst = std::max(worst, std::abs(m.cost(s.q, s.c) - s.seconds) / s.seconds);
  std::fprintf(stderr,
               "cost model: cost(q, c) = %.3e q^2 + %.3e q c + %.3e q + %.3e s (worst relative error %.1f%% over "
               "%zu points)\n",
               m.a(), m.b(), m.d(), m.e(), worst * 100, samples.size());
  return m;
}

// The verify-cost curve: step time of B sequences that each verify k drafts
// (1 + k query tokens, all sampled) after `cached` tokens, for k = 0..K. What
// the dynamic verify length reads online (spec/step_time_curve.h).
void verify_curve(Engine& engine, const std::vector<int32_t>& batches, const std::vector<int32_t>& cached,
                  int32_t max_drafts, int32_t reps, bool json) {
  engine.time_step(1, 1, 16, 1);  // warm-up
  nlohmann::json rows = nlohmann::json::array();
  for (int32_t c : cached) {
    for (int32_t b : batches) {
      double base = 0;
      for (int32_t k = 0; k <= max_drafts; ++k) {
        std::vector<double> t;
        for (int r = 0; r < reps; ++r) t.push_back(engine.time_step(b, 1 + k, c, 1 + k));
        const double ms = median(t) * 1e3;
        if (k == 0) base = ms;
        rows.push_back({{"batch", b}, {"cached", c}, {"drafts", k}, {"tokens", b * (1 + k)}, {"ms", ms}});
        if (!json) {
          std::printf("verify step: batch %4d, context %5d, %2d drafts each (%5d tokens): %8.3f ms (%.2fx k=0)\n", b,
                      c, k, b * (1 + k), ms, ms / base);
        }
      }
    }
  }
  if (json) std::printf("%s\n", rows.dump(1).c_str());
}

int run_bench(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "sweep") return run_bench_sweep(argc - 1, argv + 1);
  if (argc > 1 && std::string_view(argv[1]) == "multiturn") return run_bench_multiturn(argc - 1, argv + 1);
  CLI::App app{"Throughput and latency sweeps; fits the chunked-prefill cost model."};
  app.name("deepinfer bench");
  app.footer("`deepinfer bench sweep --help`: the serving curves (tok/s per GPU and per user vs concurrency).\n"
             "`deepinfer bench multiturn --help`: conversations over a shared document (prefix hits, KV tiers).");
  EngineFlags ef;
  add_engine_flags(app, ef);
  std::string batches = "1,8", prompt_lens = "128,512", gen_lens = "64";
  int32_t reps = 3;
  bool json = false;
  std::string fit_path;
  int32_t fit_max_q = 512;
  app.add_option("--batch,-b", batches, "comma-separated concurrent request counts");
  app.add_option("--prompt-len,-p", prompt_lens, "comma-separated prompt lengths");
  app.add_option("--gen-len,-g", gen_lens, "comma-separated output lengths");
  app.add_option("--repetitions,-r", reps, "runs per point (the median is reported)")->check(CLI::Range(1, 100));
  app.add_flag("--json", json, "print JSON instead of a table");
  app.add_option("--fit-cost-model", fit_path, "measure prefill steps, fit the cost model and write it here");
  app.add_option("--fit-max-chunk", fit_max_q, "largest chunk measured for the fit")->check(CLI::Range(16, 32768));
  int32_t verify_drafts = 0;
  app.add_option("--verify-curve", verify_drafts,
                 "time verify steps instead: every --batch size with 0..N drafts per sequence after each "
                 "--prompt-len cached tokens")
      ->check(CLI::Range(1, 32));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  EngineConfig config = finish_engine_flags(ef, argv[0]);
  config.enable_prefix_caching = false;
  std::vector<int32_t> bs = parse_list(batches, "--batch"), ps = parse_list(prompt_lens, "--prompt-len"),
                       gs = parse_list(gen_lens, "--gen-len");
  int32_t need_len = 0, need_batch = 0;
  for (int32_t p : ps) {
    for (int32_t g : gs) need_len = std::max(need_len, p + g);
  }
  for (int32_t b : bs) need_batch = std::max(need_batch, b);
  if (config.max_model_len == 0) config.max_model_len = std::max(need_len, fit_path.empty() ? 0 : fit_max_q + 1024 + 1);
  config.max_num_seqs = std::max(config.max_num_seqs, need_batch);
  if (!fit_path.empty()) config.max_num_batched_tokens = std::max(config.max_num_batched_tokens, fit_max_q);
  if (verify_drafts > 0) {
    // Rows for N drafts per sequence, and a budget for the largest step.
    if (!config.speculative.enabled()) config.speculative.method = spec::SpecMethod::Ngram;
    config.speculative.num_speculative_tokens = std::max(config.speculative.num_speculative_tokens, verify_drafts);
    config.max_num_batched_tokens = std::max(config.max_num_batched_tokens, need_batch * (1 + verify_drafts));
    need_len += verify_drafts;
    if (config.max_model_len == 0) config.max_model_len = need_len + 1;
  }
  if (config.kv_cache_tokens == 0) {
    // Room for the sweep's batches and for the fit's longest timing step
    // (fit_cost_model: up to fit_max_q new tokens after 1,024 cached).
    const int64_t fit_tokens = fit_path.empty() ? 0 : int64_t{fit_max_q} + 1024 + config.block_size;
    config.kv_cache_tokens =
        std::max({int64_t{need_batch} * (need_len + config.block_size), fit_tokens, int64_t{4096}});
  }
  Engine engine(config);

  if (verify_drafts > 0) {
    verify_curve(engine, bs, ps, verify_drafts, reps, json);
    return 0;
  }
  if (!fit_path.empty()) {
    StepCostModel m = fit_cost_model(engine, fit_max_q, reps);
    std::ofstream out(fit_path);
    DI_CHECK(out.good(), "cannot write '{}'", fit_path);
    out << m.to_json() << "\n";
    std::fprintf(stderr, "cost model written to %s (use --cost-model %s)\n", fit_path.c_str(), fit_path.c_str());
    return 0;
  }

  std::mt19937 rng(1234);
  run_point(engine, 1, 16, 4, rng);  // warm-up: first-touch of weights and buffers
  std::vector<SweepPoint> points;
  for (int32_t b : bs) {
    for (int32_t p : ps) {
      for (int32_t g : gs) {
        std::vector<SweepPoint> runs;
        for (int r = 0; r < reps; ++r) runs.push_back(run_point(engine, b, p, g, rng));
        auto pick = [&](auto field) {
          std::vector<double> v;
          for (const auto& x : runs) v.push_back(x.*field);
          return median(v);
        };
        // The timeline figures of the run with the median decode speed.
        std::vector<size_t> order(runs.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(),
                  [&](size_t a, size_t b2) { return runs[a].decode_tok_s < runs[b2].decode_tok_s; });
        SweepPoint m = runs[order[order.size() / 2]];
        m.prefill_tok_s = pick(&SweepPoint::prefill_tok_s);
        m.decode_tok_s = pick(&SweepPoint::decode_tok_s);
        m.ttft_mean_s = pick(&SweepPoint::ttft_mean_s);
        m.total_s = pick(&SweepPoint::total_s);
        points.push_back(m);
        if (!json) log_info("bench: batch {} prompt {} gen {} done", b, p, g);
      }
    }
  }
  engine.check_integrity();
  const ModelConfig& mc = engine.model_config();
  const bool eplb = engine.stats().eplb;
  if (json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& p : points) {
      j.push_back({{"batch", p.batch}, {"prompt_len", p.prompt_len}, {"gen_len", p.gen_len},
                   {"prefill_tok_s", p.prefill_tok_s}, {"decode_tok_s", p.decode_tok_s},
                   {"ttft_mean_s", p.ttft_mean_s}, {"total_s", p.total_s}, {"model", mc.name},
                   {"threads", config.num_threads}, {"repetitions", reps},
                   {"pipelined", engine.pipelined()}, {"decode_steps", p.decode_steps},
                   {"graph_steps", p.graph_steps}, {"decode_device_busy_ms", p.decode_busy_ms},
                   {"decode_device_idle_ms", p.decode_idle_ms}, {"decode_idle_max_ms", p.decode_idle_max_ms}});
      if (eplb) {
        j.back()["moe_lb"] = p.moe_lb;
        j.back()["moe_lb_contiguous"] = p.moe_lb_contiguous;
      }
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("| model | batch | prompt | gen | prefill t/s | decode t/s | mean TTFT s | device idle between decode steps |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const auto& p : points) {
    const double idle_pct = p.decode_busy_ms > 0 ? 100.0 * p.decode_idle_ms / (p.decode_busy_ms + p.decode_idle_ms) : 0;
    std::printf("| %s | %d | %d | %d | %.1f | %.1f | %.3f | %.2f%% |\n", mc.arch.c_str(), p.batch, p.prompt_len,
                p.gen_len, p.prefill_tok_s, p.decode_tok_s, p.ttft_mean_s, idle_pct);
  }
  if (eplb) {
    std::printf("\nEPLB simulated over %d ranks (window %d steps, re-placement every %d, %d re-placements so far); "
                "moe_lb = max rank load / mean, mean over MoE layers, at the end of each point:\n",
                config.eplb_ep_size, config.eplb_window_steps, config.eplb_interval_steps,
                static_cast<int>(engine.stats().eplb_replacements));
    std::printf("| batch | prompt | gen | moe_lb | moe_lb contiguous |\n| ---: | ---: | ---: | ---: | ---: |\n");
    for (const auto& p : points) {
      std::printf("| %d | %d | %d | %.3f | %.3f |\n", p.batch, p.prompt_len, p.gen_len, p.moe_lb,
                  p.moe_lb_contiguous);
    }
  }
  return 0;
}

}  // namespace

DEEPINFER_COMMAND("bench", "throughput/latency sweeps and the chunked-prefill cost-model fit", run_bench);

}  // namespace deepinfer::cli
