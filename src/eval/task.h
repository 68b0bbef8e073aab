// Evaluation tasks whose answers a program checks: each problem has a prompt
// the model completes and a way to turn a completion into a Python program
// that exits 0 exactly when the completion is correct.
#pragma once

#include <string>
#include <vector>

namespace deepinfer::eval {

struct Problem {
  std::string task_id;
  std::string prompt;  // what the model continues (completion mode, no chat template)
  // The program is program_prefix + completion + program_suffix.
  std::string program_prefix;
  std::string program_suffix;
};

struct Task {
  std::string name;
  std::vector<std::string> stop;  // where a completion ends (the end of the function)
  std::vector<Problem> problems;

  const Problem& problem(const std::string& task_id) const;  // throws for an unknown id
  std::string program(const Problem& p, const std::string& completion) const {
    return p.program_prefix + completion + p.program_suffix;
  }
};

// The names load_task knows.
const std::vector<std::string>& task_names();

// Reads <data_dir>/<name>.jsonl (scripts/fetch_eval_data.sh writes it).
// Throws Error for an unknown task, a missing file or a malformed record.
Task load_task(const std::string& name, const std::string& data_dir);

// Where the task files are: $DEEPINFER_EVAL_DATA, else .cache/eval in the
// first folder above the executable that has one.
std::string default_data_dir();

}  // namespace deepinfer::eval
