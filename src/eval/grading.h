// Grading generated completions: each sample's program runs in the sandbox,
// and pass@k per task comes from the unbiased estimator of Chen et al. (2021)
// over the n samples drawn per problem.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "eval/sandbox.h"
#include "eval/task.h"

namespace deepinfer::eval {

// One line of a generation file (`deepinfer eval generate --output`).
struct Sample {
  std::string task;
  std::string task_id;
  int32_t index = 0;  // which of the problem's samples
  std::string completion;
  bool chat = false;  // a chat answer: its code is taken from a fenced block
};

struct GradedSample {
  Sample sample;
  SandboxResult result;
};

// Probability that at least one of k samples, drawn without replacement from
// n of which c are correct, is correct: 1 - C(n-c, k) / C(n, k).
double pass_at_k(int64_t n, int64_t c, int64_t k);

struct TaskScore {
  std::string task;
  int64_t problems = 0;
  int64_t samples = 0;
  int64_t min_samples_per_problem = 0;
  int64_t passed = 0;
  int64_t timed_out = 0;
  std::map<int64_t, double> pass_at;  // k -> mean over problems (only k <= min samples per problem)
};

std::vector<TaskScore> score(const std::vector<GradedSample>& graded, const std::vector<int64_t>& ks);

struct GradeOptions {
  SandboxLimits limits;
  int32_t workers = 0;  // 0 = hardware threads
  bool allow_network = false;
};

// Runs every sample's program, `workers` at a time. Throws if the sandbox
// cannot isolate the network and allow_network is off.
std::vector<GradedSample> grade(const std::vector<Sample>& samples, const std::map<std::string, Task>& tasks,
                                const GradeOptions& options,
                                const std::function<void(size_t done, size_t total)>& progress = {});

}  // namespace deepinfer::eval
