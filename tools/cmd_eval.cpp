// deepinfer eval generate | grade: generation once, grading as a separate step
// (regrade without regenerating). docs/eval.md.
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
#include "engine_flags.h"
#include "eval/grading.h"
#include "eval/task.h"

namespace deepinfer::cli {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct GenerateOptions {
  std::string tasks = "humaneval";
  std::string data_dir;
  std::string output_path;
  int32_t num_samples = 1;
  int32_t limit = 0;
  int32_t max_tokens = 512;
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::optional<uint64_t> seed;
  bool chat = false;
  bool quiet = false;
};

int run_generate(EngineFlags& ef, const GenerateOptions& o, const char* argv0) {
  const std::string data_dir = o.data_dir.empty() ? eval::default_data_dir() : o.data_dir;
  std::vector<eval::Task> tasks;
  for (const std::string& name : split_list(o.tasks)) tasks.push_back(eval::load_task(name, data_dir));
  DI_CHECK(!tasks.empty(), "--task names no task");
  DI_CHECK(o.num_samples == 1 || o.temperature > 0.0f,
           "--num-samples {} with temperature 0 would repeat one greedy sample; pass --temperature", o.num_samples);

  struct Item {
    const eval::Task* task;
    const eval::Problem* problem;
  };
  std::vector<Item> items;
  std::vector<GenerateInput> inputs;
  for (const eval::Task& t : tasks) {
    size_t count = o.limit > 0 ? std::min<size_t>(static_cast<size_t>(o.limit), t.problems.size()) : t.problems.size();
    for (size_t i = 0; i < count; ++i) {
      GenerateInput in;
      if (o.chat) {
        in.messages = nlohmann::json::array({{{"role", "user"}, {"content", t.problems[i].chat_prompt}}});
      } else {
        in.prompt = t.problems[i].prompt;
        in.params.stop = t.stop;
      }
      in.params.n = o.num_samples;
      in.params.temperature = o.temperature;
      in.params.top_p = o.top_p;
      in.params.max_tokens = o.max_tokens;
      in.params.seed = o.seed;
      inputs.push_back(std::move(in));
      items.push_back({&t, &t.problems[i]});
    }
  }
  std::ofstream out(o.output_path);
  DI_CHECK(out.good(), "cannot write '{}'", o.output_path);

  LLM llm(finish_engine_flags(ef, argv0));
  const std::string model = llm.engine().config().model_path;
  // Name the problem whose prompt does not fit, rather than fail the batch anonymously.
  const int32_t max_len = llm.engine().max_model_len();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const size_t n = llm.prompt_ids(inputs[i]).size();
    DI_CHECK(n < static_cast<size_t>(max_len), "{} {}: the prompt has {} tokens and --max-model-len {} leaves no room "
             "for an answer; raise --max-model-len", items[i].task->name, items[i].problem->task_id, n, max_len);
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<CompletionOutput> outputs = llm.generate(inputs, [&](const GenerateProgress& p) {
    if (o.quiet) return;
    std::fprintf(stderr, "\rgenerate: %zu/%zu problems, %lld tokens, %.0f s", p.finished, p.total,
                 static_cast<long long>(p.generated_tokens), seconds_since(start));
    if (p.finished == p.total) std::fprintf(stderr, "\n");
  });
  const double secs = seconds_since(start);
  int64_t tokens = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t c = 0; c < outputs[i].choices.size(); ++c) {
      const CompletionChoice& choice = outputs[i].choices[c];
      tokens += static_cast<int64_t>(choice.token_ids.size());
      nlohmann::json j{{"task", items[i].task->name},
                       {"task_id", items[i].problem->task_id},
                       {"sample", c},
                       {"completion", choice.text},
                       {"finish_reason", std::string(to_string(choice.finish_reason))},
                       {"completion_tokens", choice.token_ids.size()},
                       {"mode", o.chat ? "chat" : "completion"},
                       {"model", model},
                       {"temperature", o.temperature}};
      out << j.dump() << "\n";
    }
  }
  out.flush();
  DI_CHECK(out.good(), "writing '{}' failed", o.output_path);
  std::fprintf(stderr, "generate: %zu problems x %d samples, %lld tokens in %.1f s (%.1f tok/s) -> %s\n",
               outputs.size(), o.num_samples, static_cast<long long>(tokens), secs, tokens / std::max(secs, 1e-9),
               o.output_path.c_str());
  return 0;
}

struct GradeFlags {
  std::string input_path;
  std::string data_dir;
  std::string results_path;
  std::string ks = "1,10";
  int32_t workers = 0;
  double timeout_s = 10.0;
  int64_t memory_mb = 1024;
  bool allow_network = false;
  bool json = false;
};

std::vector<eval::Sample> read_samples(const std::string& path) {
  std::vector<eval::Sample> samples;
  for_each_jsonl_object(path, {}, [&](nlohmann::ordered_json&& j, const std::string& where) {
    DI_CHECK(j.contains("task") && j["task"].is_string() && j.contains("task_id") && j["task_id"].is_string() &&
                 j.contains("completion") && j["completion"].is_string(),
             "{}: needs string fields task, task_id and completion", where);
    eval::Sample s;
    s.task = j["task"].get<std::string>();
    s.task_id = j["task_id"].get<std::string>();
    s.completion = j["completion"].get<std::string>();
    if (j.contains("sample") && j["sample"].is_number_integer()) s.index = j["sample"].get<int32_t>();
    if (j.contains("mode")) {
      DI_CHECK(j["mode"] == "chat" || j["mode"] == "completion", "{}: mode must be \"chat\" or \"completion\"", where);
      s.chat = j["mode"] == "chat";
    }
    samples.push_back(std::move(s));
  });
  DI_CHECK(!samples.empty(), "'{}' holds no samples", path);
  return samples;
}

int run_grade(const GradeFlags& g) {
  std::vector<eval::Sample> samples = read_samples(g.input_path);
  const std::string data_dir = g.data_dir.empty() ? eval::default_data_dir() : g.data_dir;
  std::map<std::string, eval::Task> tasks;
  for (const eval::Sample& s : samples) {
    if (!tasks.count(s.task)) tasks.emplace(s.task, eval::load_task(s.task, data_dir));
  }
  std::vector<int64_t> ks;
  for (const std::string& k : split_list(g.ks)) ks.push_back(std::stoll(k));
  eval::GradeOptions options;
  options.limits.timeout_s = g.timeout_s;
  options.limits.memory_bytes = g.memory_mb << 20;
  options.workers = g.workers;
  options.allow_network = g.allow_network;
  const auto start = std::chrono::steady_clock::now();
  std::vector<eval::GradedSample> graded = eval::grade(samples, tasks, options, [&](size_t done, size_t total) {
    if (!g.json && (done % 16 == 0 || done == total)) {
      std::fprintf(stderr, "\rgrade: %zu/%zu samples, %.0f s", done, total, seconds_since(start));
      if (done == total) std::fprintf(stderr, "\n");
    }
  });
  const double secs = seconds_since(start);
  if (!g.results_path.empty()) {
    std::ofstream out(g.results_path);
    DI_CHECK(out.good(), "cannot write '{}'", g.results_path);
    for (const eval::GradedSample& r : graded) {
      out << nlohmann::json{{"task", r.sample.task},
                            {"task_id", r.sample.task_id},
                            {"sample", r.sample.index},
                            {"result", eval::to_string(r.result.status)},
                            {"exit_code", r.result.exit_code},
                            {"wall_s", r.result.wall_s},
                            {"output", r.result.output}}
                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
          << "\n";
    }
  }
  nlohmann::json summary = nlohmann::json::array();
  for (const eval::TaskScore& s : eval::score(graded, ks)) {
    nlohmann::json t{{"task", s.task},
                     {"problems", s.problems},
                     {"samples", s.samples},
                     {"samples_per_problem", s.min_samples_per_problem},
                     {"passed", s.passed},
                     {"timed_out", s.timed_out}};
    for (const auto& [k, v] : s.pass_at) t[fmt::format("pass@{}", k)] = v;
    summary.push_back(t);
    if (!g.json) {
      std::string line = fmt::format("{}: {} problems x {} samples, {} of {} samples passed", s.task, s.problems,
                                     s.min_samples_per_problem, s.passed, s.samples);
      for (const auto& [k, v] : s.pass_at) line += fmt::format(", pass@{} {:.4f}", k, v);
      std::printf("%s\n", line.c_str());
    }
  }
  if (g.json) {
    std::printf("%s\n", nlohmann::json{{"tasks", summary}, {"grading_wall_s", secs}}.dump().c_str());
  } else {
    std::printf("grading: %zu samples in %.1f s\n", graded.size(), secs);
  }
  return 0;
}

int run_eval(int argc, char** argv) {
  CLI::App app{"Evaluate a model: generate completions, then grade them (code in a sandbox, answers by value)."};
  app.name("deepinfer eval");
  app.require_subcommand(1);
  EngineFlags ef;
  GenerateOptions go;
  CLI::App* gen = app.add_subcommand("generate", "generate completions for a task's problems (JSONL)");
  add_engine_flags(*gen, ef);
  gen->add_option("--task", go.tasks, "tasks, comma-separated: humaneval, mbpp, gsm8k")->required();
  gen->add_option("--num-samples,-k", go.num_samples, "samples per problem")->check(CLI::Range(1, 1000));
  gen->add_option("--limit", go.limit, "only the first N problems of each task (0 = all)")->check(CLI::Range(0, 1 << 20));
  gen->add_option("--max-tokens", go.max_tokens, "tokens per completion at most")->check(CLI::Range(1, 1 << 20));
  gen->add_option("--temperature", go.temperature, "0 = greedy (then one sample per problem)")
      ->check(CLI::Range(0.0, 100.0));
  gen->add_option("--top-p", go.top_p, "nucleus sampling mass")->check(CLI::Range(1e-6, 1.0));
  gen->add_option("--seed", go.seed, "sampling seed");
  gen->add_option("--data-dir", go.data_dir, "folder of <task>.jsonl (default: .cache/eval from scripts/fetch_eval_data.sh)");
  gen->add_option("--output,-o", go.output_path, "generation file (JSONL, one line per sample)")->required();
  gen->add_flag("--chat", go.chat,
                "ask in the model's chat template and grade the code block of the answer (instruct models); "
                "default: the model continues the prompt, cut at the task's stop strings");
  gen->add_flag("--quiet,-q", go.quiet, "only errors on stderr");

  GradeFlags gf;
  CLI::App* grade = app.add_subcommand("grade", "run each sample's tests in a sandbox and report pass@k");
  grade->add_option("input", gf.input_path, "generation file from `deepinfer eval generate`")->required();
  grade->add_option("--data-dir", gf.data_dir, "folder of <task>.jsonl");
  grade->add_option("--k", gf.ks, "pass@k to report, comma-separated (k <= samples per problem)");
  grade->add_option("--workers", gf.workers, "programs run at once (0 = one per core)")->check(CLI::Range(0, 1024));
  grade->add_option("--timeout", gf.timeout_s, "seconds per program")->check(CLI::Range(0.1, 3600.0));
  grade->add_option("--memory-mb", gf.memory_mb, "address-space limit per program")->check(CLI::Range(64, 1 << 20));
  grade->add_option("--results", gf.results_path, "per-sample results (JSONL)");
  grade->add_flag("--allow-network", gf.allow_network,
                  "grade even where the sandbox cannot make a network namespace (programs then have the network)");
  grade->add_flag("--json", gf.json, "print the summary as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (gen->parsed()) {
    if (go.quiet) set_log_level(LogLevel::Warn);
    return run_generate(ef, go, argv[0]);
  }
  return run_grade(gf);
}

}  // namespace

DEEPINFER_COMMAND("eval", "generate completions for HumanEval, MBPP, GSM8K and grade them (pass@k)", run_eval);

}  // namespace deepinfer::cli
