#include "eval/grading.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"

namespace deepinfer::eval {

double pass_at_k(int64_t n, int64_t c, int64_t k) {
  DI_CHECK(n >= 1 && c >= 0 && c <= n && k >= 1 && k <= n, "pass@k needs 1 <= k <= n and 0 <= c <= n");
  if (n - c < k) return 1.0;
  // C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i), computed as a product to stay finite.
  double miss = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) miss *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  return 1.0 - miss;
}

std::vector<TaskScore> score(const std::vector<GradedSample>& graded, const std::vector<int64_t>& ks) {
  struct Counts {
    int64_t n = 0, c = 0;
  };
  std::map<std::string, std::map<std::string, Counts>> by_task;
  std::map<std::string, TaskScore> scores;
  for (const GradedSample& g : graded) {
    Counts& counts = by_task[g.sample.task][g.sample.task_id];
    ++counts.n;
    TaskScore& s = scores[g.sample.task];
    s.task = g.sample.task;
    ++s.samples;
    if (g.result.status == SandboxStatus::Passed) {
      ++counts.c;
      ++s.passed;
    }
    if (g.result.status == SandboxStatus::TimedOut) ++s.timed_out;
  }
  std::vector<TaskScore> out;
  for (auto& [task, problems] : by_task) {
    TaskScore& s = scores[task];
    s.problems = static_cast<int64_t>(problems.size());
    s.min_samples_per_problem = INT64_MAX;
    for (const auto& [id, counts] : problems) s.min_samples_per_problem = std::min(s.min_samples_per_problem, counts.n);
    for (int64_t k : ks) {
      if (k < 1 || k > s.min_samples_per_problem) continue;
      double sum = 0;
      for (const auto& [id, counts] : problems) sum += pass_at_k(counts.n, counts.c, k);
      s.pass_at[k] = sum / static_cast<double>(problems.size());
    }
    out.push_back(s);
  }
  return out;
}

std::vector<GradedSample> grade(const std::vector<Sample>& samples, const std::map<std::string, Task>& tasks,
                                const GradeOptions& options,
                                const std::function<void(size_t done, size_t total)>& progress) {
  // Resolve every program first, so an unknown task or problem fails before
  // anything runs. Answer tasks are graded here and run nothing.
  std::vector<std::string> programs(samples.size());
  std::vector<std::optional<SandboxResult>> answered(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    auto it = tasks.find(s.task);
    DI_CHECK(it != tasks.end(), "no data loaded for task '{}'", s.task);
    const Task& task = it->second;
    const Problem& problem = task.problem(s.task_id);
    if (task.runs_code) {
      programs[i] = task.program(problem, s.completion, s.chat);
    } else {
      SandboxResult r;
      r.status = answer_correct(problem, s.completion) ? SandboxStatus::Passed : SandboxStatus::Failed;
      r.exit_code = r.status == SandboxStatus::Passed ? 0 : 1;
      r.output = "answer: " + extract_answer(s.completion) + ", expected: " + problem.answer;
      answered[i] = std::move(r);
    }
  }
  std::vector<GradedSample> graded(samples.size());
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  std::atomic<bool> no_isolation{false};
  std::mutex progress_mutex;
  std::exception_ptr error;
  const size_t workers = std::max<size_t>(
      1, std::min<size_t>(samples.size(),
                          options.workers > 0 ? static_cast<size_t>(options.workers)
                                              : std::max(1u, std::thread::hardware_concurrency())));
  auto work = [&] {
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= samples.size() || no_isolation.load()) return;
      try {
        graded[i].sample = samples[i];
        graded[i].result = answered[i] ? *answered[i] : run_python(programs[i], options.limits, options.allow_network);
      } catch (...) {
        std::lock_guard lock(progress_mutex);
        if (!error) error = std::current_exception();
        no_isolation = true;  // stop the others too
        return;
      }
      if (graded[i].result.status == SandboxStatus::NoIsolation) {
        no_isolation = true;
        return;
      }
      const size_t d = done.fetch_add(1) + 1;
      if (progress) {
        std::lock_guard lock(progress_mutex);
        progress(d, samples.size());
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  DI_CHECK(!no_isolation.load(),
           "the sandbox cannot make a network namespace here (unshare failed); run where it can, or pass "
           "--allow-network to grade without network isolation");
  return graded;
}

}  // namespace deepinfer::eval
