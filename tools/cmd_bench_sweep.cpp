// `deepinfer bench sweep`: the serving curves of one model on one device. For
// each concurrency C, C requests of random prompts (no prefix-cache hits) run
// together to a fixed output length; the point is the aggregate output tok/s
// (per GPU: this engine drives one device) and each user's decode speed. The
// CSV feeds scripts/plot_sweep.py, which draws the two views of the serving
// figures: output tok/s per GPU vs concurrency, and tok/s per user vs tok/s
// per GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "bench_sweep.h"
#include "core/error.h"
#include "core/logging.h"
#include "deepinfer/llm.h"
#include "engine_flags.h"

namespace deepinfer::cli {
namespace {

struct SweepRow {
  int32_t concurrency = 0;
  double wall_s = 0;
  int64_t output_tokens = 0;
  double output_tok_s = 0;        // all requests' output tokens / wall time
  double tok_s_per_user = 0;      // mean over requests of decode tokens / decode time
  double ttft_mean_s = 0;
  double ttft_p50_s = 0;
  double tpot_mean_ms = 0;        // mean time per output token after the first
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

SweepRow run_point(LLM& llm, int32_t concurrency, int32_t input_len, int32_t output_len, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> token(100, std::min(llm.engine().vocab_size(), 30000) - 1);
  std::vector<GenerateInput> inputs(static_cast<size_t>(concurrency));
  for (GenerateInput& in : inputs) {
    in.prompt_ids.resize(static_cast<size_t>(input_len));
    for (int32_t& t : in.prompt_ids) t = token(rng);
    in.params.temperature = 0;
    in.params.ignore_eos = true;
    in.params.max_tokens = output_len;
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<CompletionOutput> outs = llm.generate(inputs);
  SweepRow row;
  row.concurrency = concurrency;
  row.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<double> ttft, per_user, tpot;
  for (const CompletionOutput& o : outs) {
    const auto n = static_cast<int64_t>(o.choices[0].token_ids.size());
    row.output_tokens += n;
    ttft.push_back(o.time_to_first_token_s);
    const double decode_s = o.latency_s - o.time_to_first_token_s;
    if (n > 1 && decode_s > 0) {
      per_user.push_back(static_cast<double>(n - 1) / decode_s);
      tpot.push_back(1e3 * decode_s / static_cast<double>(n - 1));
    }
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
  };
  row.output_tok_s = static_cast<double>(row.output_tokens) / row.wall_s;
  row.tok_s_per_user = mean(per_user);
  row.ttft_mean_s = mean(ttft);
  row.ttft_p50_s = percentile(ttft, 0.5);
  row.tpot_mean_ms = mean(tpot);
  return row;
}

std::vector<int32_t> parse_ints(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    DI_CHECK(!item.empty(), "empty entry in '{}'", s);
    size_t used = 0;
    const long v = std::stol(item, &used);
    DI_CHECK(used == item.size() && v >= 1 && v <= 65536, "'{}' is not a count in [1, 65536]", item);
    out.push_back(static_cast<int32_t>(v));
  }
  DI_CHECK(!out.empty(), "no values in '{}'", s);
  return out;
}

// scripts/plot_sweep.py in the first folder above the executable that has it.
std::string find_plot_script() {
  namespace fs = std::filesystem;
  std::error_code exe_error;
  const fs::path exe = fs::canonical("/proc/self/exe", exe_error);
  for (fs::path dir = exe.parent_path(); !exe_error && !dir.empty() && dir != dir.root_path();
       dir = dir.parent_path()) {
    std::error_code ec;  // not-found is not an error here
    if (fs::exists(dir / "scripts" / "plot_sweep.py", ec)) return (dir / "scripts" / "plot_sweep.py").string();
  }
  return {};
}

// A CSV field, quoted when it holds a separator or a quote (RFC 4180).
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

int run_bench_sweep(int argc, char** argv) {
  CLI::App app{"Serving curves: output tok/s per GPU and tok/s per user at each concurrency (CSV, PNG plots)."};
  app.name("deepinfer bench sweep");
  EngineFlags ef;
  add_engine_flags(app, ef);
  std::string concurrency = "1,4,16,64,256";
  int32_t input_len = 1000, output_len = 256;
  std::string csv_path, plot_prefix, label;
  int32_t warmup = 1;
  app.add_option("--concurrency,-c", concurrency, "comma-separated numbers of concurrent requests");
  app.add_option("--input-len", input_len, "prompt tokens per request")->check(CLI::Range(1, 1 << 20));
  app.add_option("--output-len", output_len, "output tokens per request")->check(CLI::Range(2, 1 << 20));
  app.add_option("--warmup", warmup, "requests run once before the sweep (graphs, allocator)")->check(CLI::Range(0, 1024));
  app.add_option("--label", label, "name of this curve in the CSV and the plots (default: the model's file name)");
  app.add_option("--csv", csv_path, "write the points here (appends when the file exists, so curves can share one)")
      ->required();
  app.add_option("--plot", plot_prefix,
                 "also draw PREFIX_throughput.png and PREFIX_per_user.png from the CSV (python3 + matplotlib)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::vector<int32_t> levels = parse_ints(concurrency);
  const int32_t max_c = *std::max_element(levels.begin(), levels.end());
  if (ef.config.max_num_seqs < max_c) ef.config.max_num_seqs = max_c;
  EngineConfig config = finish_engine_flags(ef, argv[0]);
  if (label.empty()) label = std::filesystem::path(config.model_path).filename().string();
  const std::string device = config.device == DeviceType::CUDA ? "cuda" : "cpu";
  LLM llm(std::move(config));
  std::mt19937 rng(1234);
  if (warmup > 0) run_point(llm, std::min(warmup, max_c), std::min(input_len, 64), 8, rng);

  const bool exists = std::filesystem::exists(csv_path);
  std::ofstream csv(csv_path, std::ios::app);
  DI_CHECK(csv.good(), "cannot write '{}'", csv_path);
  if (!exists) {
    csv << "label,device,concurrency,input_len,output_len,wall_s,output_tokens,output_tok_s_per_gpu,"
           "tok_s_per_user,ttft_mean_s,ttft_p50_s,tpot_mean_ms\n";
  }
  std::printf("%-12s %10s %12s %14s %10s %10s\n", "concurrency", "wall s", "out tok/s", "tok/s/user", "TTFT s",
              "TPOT ms");
  for (int32_t c : levels) {
    const SweepRow r = run_point(llm, c, input_len, output_len, rng);
    std::printf("%-12d %10.2f %12.1f %14.1f %10.3f %10.2f\n", c, r.wall_s, r.output_tok_s, r.tok_s_per_user,
                r.ttft_mean_s, r.tpot_mean_ms);
    std::fflush(stdout);
    csv << fmt::format("{},{},{},{},{},{:.4f},{},{:.2f},{:.2f},{:.4f},{:.4f},{:.3f}\n", csv_field(label), device, c, input_len,
                       output_len, r.wall_s, r.output_tokens, r.output_tok_s, r.tok_s_per_user, r.ttft_mean_s,
                       r.ttft_p50_s, r.tpot_mean_ms);
    csv.flush();
  }
  if (!plot_prefix.empty()) {
    const std::string script = find_plot_script();
    const std::string cmd = "python3 " + shell_quote(script.empty() ? "scripts/plot_sweep.py" : script) + " " +
                            shell_quote(csv_path) + " --out " + shell_quote(plot_prefix);
    if (script.empty() || std::system(cmd.c_str()) != 0) {
      log_warn("bench sweep: could not draw the plots; run `{}` where python3 has matplotlib", cmd);
      return 1;
    }
  }
  return 0;
}

}  // namespace deepinfer::cli
