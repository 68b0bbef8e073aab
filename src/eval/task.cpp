#include "eval/task.h"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/json_parse.h"

namespace deepinfer::eval {
namespace {

std::string string_field(const nlohmann::ordered_json& j, const char* key, const std::string& where) {
  DI_CHECK(j.contains(key) && j[key].is_string(), "{}: field \"{}\" must be a string", where, key);
  return j[key].get<std::string>();
}

// HumanEval (Chen et al. 2021): complete the function whose signature and
// docstring are the prompt; the task's check() runs its asserts.
Problem humaneval_problem(const nlohmann::ordered_json& j, const std::string& where) {
  Problem p;
  p.task_id = string_field(j, "task_id", where);
  p.prompt = string_field(j, "prompt", where);
  p.entry_point = string_field(j, "entry_point", where);
  p.program_prefix = p.prompt;
  p.program_suffix = "\n\n" + string_field(j, "test", where) + "\n\ncheck(" + p.entry_point + ")\n";
  p.chat_prompt = "Complete the following Python function. Reply with the whole function in one Python code "
                  "block.\n\n```python\n" + p.prompt + "```";
  // The stub (a function whose body is its docstring) brings the imports and
  // helpers; the answer's definition then replaces it.
  p.chat_prefix = p.prompt + "\n";
  return p;
}

// MBPP (Austin et al. 2021), in the docstring form code models complete: the
// description and the first test as a docstring, then the code; all three
// tests (after the problem's setup code) decide.
Problem mbpp_problem(const nlohmann::ordered_json& j, const std::string& where) {
  Problem p;
  p.task_id = string_field(j, "task_id", where);
  const std::string text = string_field(j, "text", where);
  DI_CHECK(j.contains("test_list") && j["test_list"].is_array() && !j["test_list"].empty(),
           "{}: field \"test_list\" must be a non-empty list", where);
  std::string tests;
  for (const auto& t : j["test_list"]) {
    DI_CHECK(t.is_string(), "{}: test_list must hold strings", where);
    tests += t.get<std::string>() + "\n";
  }
  const std::string first_test = j["test_list"][0].get<std::string>();
  p.prompt = "\"\"\"\n" + text + "\n" + first_test + "\n\"\"\"\n";
  p.program_prefix = p.prompt;
  p.chat_prompt = text + " Your code should pass this test:\n\n```python\n" + first_test +
                  "\n```\n\nReply with the code in one Python code block.";
  // The function the tests call: the name after "assert " (e.g. "assert f(x) == y").
  const size_t open = first_test.find('(');
  const size_t name_start = first_test.rfind(' ', open) + 1;
  if (open != std::string::npos && name_start <= open) p.entry_point = first_test.substr(name_start, open - name_start);
  std::string setup = j.contains("test_setup_code") && j["test_setup_code"].is_string()
                          ? j["test_setup_code"].get<std::string>()
                          : std::string();
  p.program_suffix = "\n\n" + setup + "\n" + tests;
  return p;
}

// GSM8K (Cobbe et al. 2021), zero-shot with a step-by-step cue; the final
// number of the answer is compared with the reference.
Problem gsm8k_problem(const nlohmann::ordered_json& j, const std::string& where) {
  Problem p;
  p.task_id = string_field(j, "task_id", where);
  const std::string question = string_field(j, "question", where);
  p.answer = string_field(j, "answer", where);
  p.prompt = "Question: " + question + "\nAnswer: Let's think step by step.";
  p.chat_prompt = question + "\n\nSolve it step by step. End with a line of the form \"The answer is N.\"";
  return p;
}

std::string clean_number(std::string s) {
  std::string out;
  for (char c : s) {
    if (c != ',' && c != '$') out += c;
  }
  while (!out.empty() && (out.back() == '.')) out.pop_back();
  return out;
}

// The numbers of a text, in order ("-1,234.5" is one).
std::vector<std::string> numbers_in(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    const bool sign = text[i] == '-' && i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1]));
    if (!std::isdigit(static_cast<unsigned char>(text[i])) && !sign) {
      ++i;
      continue;
    }
    size_t j = i + (sign ? 1 : 0);
    while (j < text.size() &&
           (std::isdigit(static_cast<unsigned char>(text[j])) ||
            ((text[j] == ',' || text[j] == '.') && j + 1 < text.size() &&
             std::isdigit(static_cast<unsigned char>(text[j + 1]))))) {
      ++j;
    }
    out.push_back(clean_number(text.substr(i, j - i)));
    i = j;
  }
  return out;
}

}  // namespace

std::string extract_answer(const std::string& text) {
  for (const char* marker : {"The answer is", "the answer is", "####"}) {
    const size_t at = text.rfind(marker);
    if (at == std::string::npos) continue;
    std::vector<std::string> after = numbers_in(text.substr(at + std::strlen(marker)));
    if (!after.empty()) return after.front();
  }
  std::vector<std::string> all = numbers_in(text);
  return all.empty() ? std::string() : all.back();
}

bool same_answer(const std::string& a, const std::string& b) {
  const std::string x = clean_number(a), y = clean_number(b);
  if (x.empty() || y.empty()) return false;
  char* end_x = nullptr;
  char* end_y = nullptr;
  const double vx = std::strtod(x.c_str(), &end_x);
  const double vy = std::strtod(y.c_str(), &end_y);
  if (*end_x == '\0' && *end_y == '\0') return vx == vy;
  return x == y;
}

std::string extract_code(const std::string& answer, const std::string& entry_point) {
  std::vector<std::string> blocks;
  size_t pos = 0;
  for (;;) {
    const size_t fence = answer.find("```", pos);
    if (fence == std::string::npos) break;
    const size_t body = answer.find('\n', fence);  // skips the language tag
    if (body == std::string::npos) break;
    const size_t end = answer.find("```", body + 1);
    blocks.push_back(answer.substr(body + 1, end == std::string::npos ? std::string::npos : end - body - 1));
    if (end == std::string::npos) break;  // an unclosed block runs to the end (cut by max_tokens)
    pos = end + 3;
  }
  if (blocks.empty()) return answer;
  if (!entry_point.empty()) {
    for (const std::string& b : blocks) {
      if (b.find("def " + entry_point) != std::string::npos) return b;
    }
  }
  return blocks.front();
}

const Problem& Task::problem(const std::string& task_id) const {
  for (const Problem& p : problems) {
    if (p.task_id == task_id) return p;
  }
  fail("task {} has no problem '{}'", name, task_id);
}

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = {"humaneval", "mbpp", "gsm8k"};
  return names;
}

Task load_task(const std::string& name, const std::string& data_dir) {
  Task task;
  task.name = name;
  Problem (*make)(const nlohmann::ordered_json&, const std::string&) = nullptr;
  if (name == "humaneval") {
    make = humaneval_problem;
    task.stop = {"\nclass", "\ndef", "\n#", "\nif", "\nprint"};
  } else if (name == "mbpp") {
    make = mbpp_problem;
    task.stop = {"\nclass", "\nassert", "\n\"\"\"", "\nprint", "\nif", "\n```"};
  } else if (name == "gsm8k") {
    make = gsm8k_problem;
    task.runs_code = false;
    task.stop = {"\nQuestion:", "\n\n\n"};
  } else {
    fail("unknown evaluation task '{}' (known: humaneval, mbpp, gsm8k)", name);
  }
  const std::string path = (std::filesystem::path(data_dir) / (name + ".jsonl")).string();
  DI_CHECK(std::ifstream(path).good(), "cannot read {} (run scripts/fetch_eval_data.sh, or set --data-dir)", path);
  for_each_jsonl_object(path, {}, [&](nlohmann::ordered_json&& j, const std::string& where) {
    task.problems.push_back(make(j, where));
  });
  DI_CHECK(!task.problems.empty(), "{} holds no problems", path);
  return task;
}

std::string default_data_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("DEEPINFER_EVAL_DATA"); env && *env) return env;
  std::error_code exe_error;
  const fs::path exe = fs::canonical("/proc/self/exe", exe_error);
  for (fs::path dir = exe.parent_path(); !exe_error && !dir.empty() && dir != dir.root_path();
       dir = dir.parent_path()) {
    std::error_code ec;  // not-found is not an error here
    if (fs::is_directory(dir / ".cache" / "eval", ec)) return (dir / ".cache" / "eval").string();
  }
  return ".cache/eval";
}

}  // namespace deepinfer::eval
