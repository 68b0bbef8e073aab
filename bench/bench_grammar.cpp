// Structured-output cost on the host: JSON-schema compile time and per-step
// token-mask time of the XGrammar integration (src/structured), over a corpus
// of real schemas, each driven along one valid instance of it. The same method
// as scripts/bench_grammar_llguidance.py, so the figures compare:
//
//   * vocabulary index: GrammarCompiler's constructor (XGrammar's tokenizer
//     info over every token's bytes), once;
//   * compile: GrammarCompiler::compile() of {kind=Json, spec=schema}. The
//     compiler is built with a cache of 0 entries, so every call is a cache
//     miss and a full compilation (including XGrammar's token-mask cache, on
//     its 2 threads); the figure is the median of --repeat compilations. A
//     schema compile() rejects (ParamError) is counted under the first line of
//     its message;
//   * mask: the instance text is tokenized without special tokens; a fresh
//     TokenMatcher then, for every token, fills the token bitmask (timed),
//     checks the token is in it (a "violation" if not), and accepts it (an
//     "accept failure" ends that instance). A final mask after the last token
//     is timed too and must allow EOS; every instance has tokens + 1 steps.
//     Each instance is walked --repeat times, each on a fresh matcher, and
//     every step's time is the median over the walks.
// XGrammar's warnings during a compilation (a keyword or regex feature it
// ignores or approximates; the schema still compiles) are caught and counted
// per kind. The matcher runs on this thread only. Percentiles are nearest-rank.
//
//   bench_grammar TOKENIZER SCHEMAS.jsonl INSTANCES.jsonl [--out result.json] [--repeat N] [--limit K]
//
// TOKENIZER: a tokenizer.json, a folder holding one, or a .gguf.
// SCHEMAS.jsonl: lines {"id", "schema"} (tests/data/json_schemas/schemas.jsonl);
// INSTANCES.jsonl: lines {"id", "instance": JSON text or null}, from
// scripts/json_instance.py. scripts/bench_grammar.sh runs the whole thing.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "deepinfer/sampling_params.h"
#include "deepinfer/structured_outputs.h"
#include "structured/grammar_compiler.h"
#include "structured/token_matcher.h"
#include "tokenizer/tokenizer.h"

using namespace deepinfer;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

// Nearest rank, written as the llguidance script computes it (Python's round()
// rounds half to even, as nearbyint does in the default rounding mode).
double percentile(const std::vector<double>& sorted, double q) {
  const double n = static_cast<double>(sorted.size());
  long k = std::lround(std::nearbyint(q / 100.0 * n + 0.5)) - 1;
  k = std::clamp<long>(k, 0, static_cast<long>(sorted.size()) - 1);
  return sorted[static_cast<size_t>(k)];
}

// p50/p90/p99/mean/max of xs times scale, rounded to 3 decimals; null when empty.
json summary(std::vector<double> xs, double scale) {
  if (xs.empty()) return nullptr;
  std::sort(xs.begin(), xs.end());
  double sum = 0;
  for (double x : xs) sum += x;
  auto r3 = [&](double v) { return std::round(v * scale * 1000.0) / 1000.0; };
  json s;
  s["n"] = xs.size();
  s["p50"] = r3(percentile(xs, 50));
  s["p90"] = r3(percentile(xs, 90));
  s["p99"] = r3(percentile(xs, 99));
  s["mean"] = r3(sum / static_cast<double>(xs.size()));
  s["max"] = r3(xs.back());
  return s;
}

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::vector<json> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    rows.push_back(json::parse(line));
  }
  return rows;
}

std::string id_of(const json& row) {
  const json& id = row.at("id");
  return id.is_string() ? id.get<std::string>() : id.dump();
}

// The bucket a rejection is counted in: the first line of the message, less
// what every such message shares ("invalid sampling parameter '...': invalid
// json: ") and XGrammar's log header ("[hh:mm:ss] path/file.cc:line: ").
std::string reason_key(const std::string& message) {
  std::string first = message.substr(0, message.find('\n'));
  for (const char* prefix : {"invalid sampling parameter 'structured_outputs': ", "invalid json: "}) {
    const std::string p(prefix);
    if (first.compare(0, p.size(), p) == 0) first.erase(0, p.size());
  }
  static const std::regex log_header(R"(^\[\d+:\d+:\d+\] [^ ]+:\d+: )");
  first = std::regex_replace(first, log_header, "", std::regex_constants::format_first_only);
  // Positions differ from schema to schema; the error is the same.
  static const std::regex position(R"( at (position \d+|line \d+, column \d+))");
  first = std::regex_replace(first, position, "");
  if (first.size() > 160) first.resize(160);
  return first.empty() ? "(empty)" : first;
}

// XGrammar logs what it ignores or cannot represent exactly as warnings on
// std::cerr ("[hh:mm:ss] file.cc:line: Warning: ..."). This gathers them
// while it is alive. compile() runs XGrammar on a thread of its own, but the
// caller waits for it, so swapping the buffer around the call is enough.
class CerrCapture {
 public:
  CerrCapture() : saved_(std::cerr.rdbuf(buffer_.rdbuf())) {}
  ~CerrCapture() { std::cerr.rdbuf(saved_); }
  std::string text() const { return buffer_.str(); }

 private:
  std::ostringstream buffer_;
  std::streambuf* saved_;
};

// The distinct warnings in captured log text, each reduced to its kind: no
// log header, no position, no regex quoted after it.
std::set<std::string> warning_kinds(const std::string& log) {
  static const std::regex header(R"(^\[\d+:\d+:\d+\] [^ ]+:\d+: Warning: )");
  static const std::regex position(R"( at position \d+)");
  std::set<std::string> kinds;
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("Warning: ") == std::string::npos) continue;
    line = std::regex_replace(line, header, "", std::regex_constants::format_first_only);
    line = std::regex_replace(line, position, "");
    for (const char* cut : {" in regex: ", " is ignored: "}) {
      if (size_t at = line.find(cut); at != std::string::npos) line.resize(at + std::string(cut).size() - 2);
    }
    if (line.size() > 160) line.resize(160);
    kinds.insert(line);
  }
  return kinds;
}

bool bit_set(const std::vector<int32_t>& words, int32_t token) {
  const size_t w = static_cast<size_t>(token) >> 5;
  return w < words.size() && ((static_cast<uint32_t>(words[w]) >> (token & 31)) & 1u) != 0;
}

// One walk of an instance on a fresh matcher.
struct Walk {
  std::vector<double> step_s;  // mask time of every step taken (tokens + 1 when complete)
  int64_t violations = 0;      // tokens outside the mask computed just before them
  std::optional<size_t> accept_failed_at;
  bool dead_end = false;       // a mask allowed no token at all
  bool eos_allowed = false;    // the final mask allows EOS
  bool terminated = false;     // accepting EOS after the last token ends the grammar
};

Walk walk(const std::shared_ptr<const structured::CompiledGrammar>& grammar, std::span<const int32_t> stop_ids,
          int32_t eos, const std::vector<int32_t>& ids, std::vector<int32_t>& words) {
  Walk w;
  w.step_s.reserve(ids.size() + 1);
  structured::TokenMatcher matcher(grammar, stop_ids);
  for (size_t i = 0; i <= ids.size(); ++i) {
    const auto t0 = Clock::now();
    const bool any = matcher.fill_mask(words);
    w.step_s.push_back(seconds_since(t0));
    if (!any) w.dead_end = true;
    if (i == ids.size()) {
      w.eos_allowed = bit_set(words, eos);
      w.terminated = matcher.accept(eos) && matcher.terminated();
      break;
    }
    if (!bit_set(words, ids[i])) ++w.violations;
    if (!matcher.accept(ids[i])) {
      w.accept_failed_at = i;
      break;
    }
  }
  return w;
}

struct KindStats {
  std::vector<double> mask_s, mask_after_first_s, first_mask_s, tokens;
  int64_t walked = 0, ok = 0, no_instance = 0, violations = 0, instances_with_violations = 0, accept_failures = 0,
          eos_missing = 0, not_terminated = 0, dead_ends = 0;
  std::vector<json> problems;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  std::string out_path;
  int repeat = 1;
  size_t limit = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else if (a == "--repeat" && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else if (a == "--limit" && i + 1 < argc) limit = static_cast<size_t>(std::max(0, std::atoi(argv[++i])));
    else positional.push_back(a);
  }
  if (positional.size() != 3) {
    std::fprintf(stderr,
                 "usage: bench_grammar TOKENIZER SCHEMAS.jsonl INSTANCES.jsonl [--out result.json] [--repeat N] "
                 "[--limit K]\n");
    return 2;
  }
  const std::string& tokenizer_path = positional[0];
  const std::string& schemas_path = positional[1];
  const std::string& instances_path = positional[2];

  auto t0 = Clock::now();
  auto tok = Tokenizer::from_file(tokenizer_path);
  const double tokenizer_load_s = seconds_since(t0);
  if (!tok->eos_id()) {
    std::fprintf(stderr, "the tokenizer has no EOS token\n");
    return 2;
  }
  const int32_t eos = *tok->eos_id();
  const int32_t vocab_size = tok->vocab_size();

  structured::CompilerOptions options;
  options.cache_entries = 0;  // every compile() a full compilation
  t0 = Clock::now();
  structured::GrammarCompiler compiler(*tok, vocab_size, options);
  const double index_build_s = seconds_since(t0);
  std::vector<int32_t> words(static_cast<size_t>(compiler.mask_words()));
  const std::vector<int32_t>& stop_ids = tok->eos_ids();

  std::vector<json> schemas = read_jsonl(schemas_path);
  if (limit > 0 && schemas.size() > limit) schemas.resize(limit);
  std::unordered_map<std::string, json> instances;
  for (json& row : read_jsonl(instances_path)) instances[id_of(row)] = std::move(row["instance"]);

  std::vector<double> compile_s;
  std::map<std::string, int64_t> rejected, warned;  // schemas per reason / warning kind
  int64_t compiled_with_warnings = 0;
  std::vector<json> rejected_schemas, per_schema;
  KindStats K;

  for (size_t si = 0; si < schemas.size(); ++si) {
    const json& row = schemas[si];
    const std::string id = id_of(row);
    StructuredOutputs so;
    so.kind = StructuredOutputs::Kind::Json;
    so.spec = row.at("schema").dump();
    // compile() validates too; calling it here also makes this program itself
    // reference src/sched/structured_outputs.cpp, which deepinfer_structured
    // needs but does not list among its link dependencies (deepinfer_sched
    // comes before it on the link line).
    so.validate();
    json rec;
    rec["id"] = id;

    std::shared_ptr<const structured::CompiledGrammar> grammar;
    std::vector<double> times;
    std::string error, log;
    for (int r = 0; r < repeat; ++r) {
      CerrCapture capture;
      t0 = Clock::now();
      try {
        grammar = compiler.compile(so);
      } catch (const ParamError& e) {
        error = e.what();
        times.push_back(seconds_since(t0));
        break;
      }
      times.push_back(seconds_since(t0));
      if (r == 0) log = capture.text();
    }
    rec["compile_ms"] = std::round(median(times) * 1e6) / 1000.0;
    if (!error.empty()) {
      const std::string key = reason_key(error);
      ++rejected[key];
      rejected_schemas.push_back(json{{"id", id}, {"reason", key}, {"error", error.substr(0, 400)}});
      rec["rejected"] = true;
      per_schema.push_back(std::move(rec));
      continue;
    }
    compile_s.push_back(median(times));
    const std::set<std::string> warnings = warning_kinds(log);
    if (!warnings.empty()) {
      ++compiled_with_warnings;
      for (const std::string& w : warnings) ++warned[w];
      rec["warnings"] = warnings;
    }

    auto it = instances.find(id);
    if (it == instances.end() || !it->second.is_string()) {
      ++K.no_instance;
      rec["instance"] = "none";
      per_schema.push_back(std::move(rec));
      continue;
    }
    const std::vector<int32_t> ids = tok->encode(it->second.get<std::string>(), /*add_special_tokens=*/false);
    std::vector<Walk> walks;
    for (int r = 0; r < repeat; ++r) walks.push_back(walk(grammar, stop_ids, eos, ids, words));
    const Walk& w = walks.front();  // the walks are deterministic but for their times
    std::vector<double> steps(w.step_s.size());
    for (size_t j = 0; j < steps.size(); ++j) {
      std::vector<double> at;
      for (const Walk& x : walks) at.push_back(x.step_s[j]);
      steps[j] = median(std::move(at));
    }
    ++K.walked;
    K.tokens.push_back(static_cast<double>(ids.size()));
    K.mask_s.insert(K.mask_s.end(), steps.begin(), steps.end());
    K.first_mask_s.push_back(steps.front());
    K.mask_after_first_s.insert(K.mask_after_first_s.end(), steps.begin() + 1, steps.end());
    K.violations += w.violations;
    if (w.violations) ++K.instances_with_violations;
    if (w.dead_end) ++K.dead_ends;
    json problem;
    if (w.accept_failed_at) {
      ++K.accept_failures;
      const size_t at = *w.accept_failed_at;
      const std::string before = tok->decode(std::span<const int32_t>(ids.data(), at), false);
      problem = json{{"id", id},
                     {"problem", "accept failed"},
                     {"step", at},
                     {"of", ids.size()},
                     {"token", tok->token_bytes(ids[at])},
                     {"prefix", before.size() > 60 ? before.substr(before.size() - 60) : before}};
    } else if (!w.eos_allowed) {
      ++K.eos_missing;
      problem = json{{"id", id}, {"problem", "EOS not in final mask"}};
    } else if (!w.terminated) {
      ++K.not_terminated;
      problem = json{{"id", id}, {"problem", "accepting EOS did not terminate"}};
    }
    if (!problem.is_null()) K.problems.push_back(std::move(problem));
    else ++K.ok;
    double sum = 0;
    for (double s : steps) sum += s;
    rec["tokens"] = ids.size();
    rec["ok"] = problem.is_null();
    rec["violations"] = w.violations;
    rec["mask_us_mean"] = std::round(sum / static_cast<double>(steps.size()) * 1e8) / 100.0;
    json step_us = json::array();
    for (double x : steps) step_us.push_back(std::round(x * 1e8) / 100.0);
    rec["mask_us_steps"] = std::move(step_us);
    per_schema.push_back(std::move(rec));
    if ((si + 1) % 100 == 0) std::fprintf(stderr, "  %zu/%zu schemas\n", si + 1, schemas.size());
  }

  // Reasons (and warning kinds), most frequent first.
  auto by_count = [](const std::map<std::string, int64_t>& m) {
    std::vector<std::pair<std::string, int64_t>> v(m.begin(), m.end());
    std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return v;
  };
  const auto reasons = by_count(rejected);
  const auto warning_counts = by_count(warned);
  json reasons_json = json::object(), warnings_json = json::object();
  for (const auto& [k, n] : reasons) reasons_json[k] = n;
  for (const auto& [k, n] : warning_counts) warnings_json[k] = n;
  int64_t rejected_total = 0;
  for (const auto& [k, n] : reasons) rejected_total += n;
  const auto stats = compiler.stats();

  json result;
  result["engine"] = "deepinfer structured (XGrammar C++ core)";
  result["tokenizer"] = tokenizer_path;
  result["vocab_size"] = vocab_size;
  result["eos_token_id"] = eos;
  result["stop_token_ids"] = stop_ids;
  result["threads"] = "matcher: 1 (this thread); compile: XGrammar threads=2";
  result["hardware_threads"] = std::thread::hardware_concurrency();
  result["repeat"] = repeat;
  result["schemas_file"] = schemas_path;
  result["instances_file"] = instances_path;
  result["tokenizer_load_s"] = std::round(tokenizer_load_s * 1000) / 1000;
  result["vocabulary_index_build_ms"] = std::round(index_build_s * 1e6) / 1000;
  result["notes"] = json::array(
      {"compile = GrammarCompiler::compile() with a 0-entry cache: every call a full XGrammar compilation "
       "(any_whitespace=true), median of `repeat` calls",
       "mask = one TokenMatcher::fill_mask() into a preallocated bitmask, steady_clock around the call; "
       "steps = tokens + 1 per instance (the last must allow EOS); median over `repeat` walks, fresh matcher each",
       "violations: instance tokens the mask computed just before them left out",
       "compiled_with_warnings: schemas XGrammar compiled although it logged a warning (a keyword or regex "
       "feature ignored or approximated); warning_kinds counts schemas per kind"});
  result["schemas"] = schemas.size();
  result["compiled"] = compile_s.size();
  result["rejected_at_compile"] = rejected_total;
  result["rejected_reasons"] = reasons_json;
  result["compiled_with_warnings"] = compiled_with_warnings;
  result["warning_kinds"] = warnings_json;
  result["compile_stats"] = json{{"compiled", stats.compiled}, {"failed", stats.failed}, {"timed_out", stats.timed_out}};
  result["compile_ms"] = summary(compile_s, 1e3);
  result["instances_walked"] = K.walked;
  result["instances_ok"] = K.ok;
  result["no_instance"] = K.no_instance;
  result["violations"] = K.violations;
  result["instances_with_violations"] = K.instances_with_violations;
  result["accept_failures"] = K.accept_failures;
  result["eos_not_allowed_at_end"] = K.eos_missing;
  result["not_terminated_by_eos"] = K.not_terminated;
  result["instances_with_dead_end_mask"] = K.dead_ends;
  double tokens_total = 0;
  for (double t : K.tokens) tokens_total += t;
  result["tokens_total"] = static_cast<int64_t>(tokens_total);
  result["mask_steps_total"] = K.mask_s.size();
  result["tokens_per_instance"] = summary(K.tokens, 1);
  result["mask_us"] = summary(K.mask_s, 1e6);
  result["mask_us_after_first"] = summary(K.mask_after_first_s, 1e6);
  result["first_mask_us"] = summary(K.first_mask_s, 1e6);
  result["problems"] = K.problems;
  result["rejected_schemas"] = rejected_schemas;
  result["per_schema"] = per_schema;

  if (!out_path.empty()) {
    std::ofstream out(out_path);
    out << result.dump(1) << "\n";
  }

  // Readable summary.
  std::printf("deepinfer structured (XGrammar), tokenizer %s: vocab %d, eos %d; repeat %d\n", tokenizer_path.c_str(),
              vocab_size, eos, repeat);
  std::printf("instances: %s\n", instances_path.c_str());
  std::printf("vocabulary index build %.1f ms (tokenizer load %.1f ms)\n", index_build_s * 1e3, tokenizer_load_s * 1e3);
  std::printf("schemas %zu: compiled %zu, rejected at compile %lld\n", schemas.size(), compile_s.size(),
              static_cast<long long>(rejected_total));
  for (const auto& [k, n] : reasons) std::printf("  %4lld  %s\n", static_cast<long long>(n), k.c_str());
  auto line = [](const char* label, const json& s) {
    if (s.is_null()) return;
    std::printf("%s: p50 %.3f  p90 %.3f  p99 %.3f  mean %.3f  max %.3f  (n %zu)\n", label, s["p50"].get<double>(),
                s["p90"].get<double>(), s["p99"].get<double>(), s["mean"].get<double>(), s["max"].get<double>(),
                s["n"].get<size_t>());
  };
  std::printf("compiled with XGrammar warnings %lld (schemas per warning kind):\n",
              static_cast<long long>(compiled_with_warnings));
  for (const auto& [k, n] : warning_counts) std::printf("  %4lld  %s\n", static_cast<long long>(n), k.c_str());
  line("compile ms", result["compile_ms"]);
  std::printf("instances walked %lld: ok %lld, accept failures %lld, EOS not allowed at end %lld, not terminated %lld, "
              "no instance %lld\n",
              static_cast<long long>(K.walked), static_cast<long long>(K.ok), static_cast<long long>(K.accept_failures),
              static_cast<long long>(K.eos_missing), static_cast<long long>(K.not_terminated),
              static_cast<long long>(K.no_instance));
  std::printf("violations (instance token outside the mask) %lld in %lld instances; dead-end masks in %lld\n",
              static_cast<long long>(K.violations), static_cast<long long>(K.instances_with_violations),
              static_cast<long long>(K.dead_ends));
  for (const json& p : K.problems) std::printf("  %s\n", p.dump().c_str());
  std::printf("tokens %lld, mask steps %zu\n", static_cast<long long>(tokens_total), K.mask_s.size());
  line("  mask us (all steps)       ", result["mask_us"]);
  line("  mask us (without 1st step)", result["mask_us_after_first"]);
  line("  first mask us             ", result["first_mask_us"]);
  return 0;
}
