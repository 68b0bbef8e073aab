// Evaluation tasks whose answers are checked automatically. Code tasks
// (HumanEval, MBPP) turn a completion into a Python program that exits 0
// exactly when the completion is correct; answer tasks (GSM8K) compare the
// completion's final number with the reference.
#pragma once

#include <string>
#include <vector>

namespace deepinfer::eval {

struct Problem {
  std::string task_id;
  std::string prompt;       // completion mode: what the model continues (no chat template)
  std::string chat_prompt;  // chat mode: the user message (the answer holds the code in a fenced block)
  std::string entry_point;  // the function the tests call
  // Completion mode: the program is program_prefix + completion + program_suffix.
  // Chat mode: chat_prefix + the answer's code + program_suffix.
  std::string program_prefix;
  std::string chat_prefix;
  std::string program_suffix;
  std::string answer;  // answer tasks: the reference (a number)
};

// The code of a chat answer: the first fenced block that defines `entry_point`,
// else the first fenced block, else the whole answer.
std::string extract_code(const std::string& answer, const std::string& entry_point);

// The final answer a solution states: the number after "The answer is" or
// "####" when present, else the last number in the text; commas, "$" and a
// trailing "." removed. "" when there is none.
std::string extract_answer(const std::string& text);
// Numbers equal as written (18 == 18.0 == 18.00); non-numbers compare as text.
bool same_answer(const std::string& a, const std::string& b);

struct Task {
  std::string name;
  bool runs_code = true;  // false: graded by comparing answers, no program runs
  std::vector<std::string> stop;  // where a completion ends (the end of the function)
  std::vector<Problem> problems;

  const Problem& problem(const std::string& task_id) const;  // throws for an unknown id
  std::string program(const Problem& p, const std::string& completion, bool chat = false) const {
    if (chat) return p.chat_prefix + extract_code(completion, p.entry_point) + p.program_suffix;
    return p.program_prefix + completion + p.program_suffix;
  }
};

// The names load_task knows.
const std::vector<std::string>& task_names();

// Answer tasks: whether a completion states the reference answer.
inline bool answer_correct(const Problem& p, const std::string& completion) {
  return same_answer(extract_answer(completion), p.answer);
}

// Reads <data_dir>/<name>.jsonl (scripts/fetch_eval_data.sh writes it).
// Throws Error for an unknown task, a missing file or a malformed record.
Task load_task(const std::string& name, const std::string& data_dir);

// Where the task files are: $DEEPINFER_EVAL_DATA, else .cache/eval in the
// first folder above the executable that has one.
std::string default_data_dir();

}  // namespace deepinfer::eval
