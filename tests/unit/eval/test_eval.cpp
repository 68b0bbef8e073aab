#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "eval/grading.h"
#include "eval/sandbox.h"
#include "eval/task.h"

namespace deepinfer::eval {
namespace {

double binomial(int64_t n, int64_t k) {
  if (k < 0 || k > n) return 0.0;
  double r = 1.0;
  for (int64_t i = 1; i <= k; ++i) r = r * static_cast<double>(n - k + i) / static_cast<double>(i);
  return r;
}

TEST(PassAtK, MatchesTheCombinatorialDefinition) {
  for (int64_t n = 1; n <= 12; ++n) {
    for (int64_t c = 0; c <= n; ++c) {
      for (int64_t k = 1; k <= n; ++k) {
        const double expected = 1.0 - binomial(n - c, k) / binomial(n, k);
        EXPECT_NEAR(pass_at_k(n, c, k), expected, 1e-12) << n << " " << c << " " << k;
      }
    }
  }
  EXPECT_DOUBLE_EQ(pass_at_k(10, 3, 1), 0.3);  // pass@1 is the fraction correct
  EXPECT_DOUBLE_EQ(pass_at_k(200, 0, 100), 0.0);
  EXPECT_NEAR(pass_at_k(200, 1, 100), 0.5, 1e-12);
  EXPECT_THROW(pass_at_k(5, 1, 6), Error);
  EXPECT_THROW(pass_at_k(5, 6, 1), Error);
}

GradedSample graded(const std::string& task, const std::string& id, SandboxStatus status) {
  GradedSample g;
  g.sample.task = task;
  g.sample.task_id = id;
  g.result.status = status;
  return g;
}

TEST(Score, AveragesPassAtKOverProblemsAndSkipsLargeK) {
  std::vector<GradedSample> all;
  // Problem a: 2 of 4 pass; problem b: 0 of 4 (one timed out).
  for (int i = 0; i < 4; ++i) all.push_back(graded("t", "a", i < 2 ? SandboxStatus::Passed : SandboxStatus::Failed));
  for (int i = 0; i < 4; ++i) all.push_back(graded("t", "b", i == 0 ? SandboxStatus::TimedOut : SandboxStatus::Failed));
  all.push_back(graded("u", "x", SandboxStatus::Passed));
  std::vector<TaskScore> s = score(all, {1, 2, 10});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].task, "t");
  EXPECT_EQ(s[0].problems, 2);
  EXPECT_EQ(s[0].samples, 8);
  EXPECT_EQ(s[0].passed, 2);
  EXPECT_EQ(s[0].timed_out, 1);
  EXPECT_DOUBLE_EQ(s[0].pass_at.at(1), (0.5 + 0.0) / 2);
  EXPECT_DOUBLE_EQ(s[0].pass_at.at(2), (pass_at_k(4, 2, 2) + 0.0) / 2);
  EXPECT_EQ(s[0].pass_at.count(10), 0u);  // more than the 4 samples per problem
  EXPECT_DOUBLE_EQ(s[1].pass_at.at(1), 1.0);
}

SandboxLimits quick() {
  SandboxLimits l;
  l.timeout_s = 5.0;
  l.memory_bytes = 512ll << 20;
  return l;
}

TEST(Sandbox, PassesAndFailsOnTheExitStatus) {
  EXPECT_EQ(run_python("assert 1 + 1 == 2\n", quick()).status, SandboxStatus::Passed);
  SandboxResult r = run_python("assert 1 + 1 == 3, 'arithmetic'\n", quick());
  EXPECT_EQ(r.status, SandboxStatus::Failed);
  EXPECT_NE(r.output.find("AssertionError: arithmetic"), std::string::npos) << r.output;
  EXPECT_EQ(run_python("def f(:\n", quick()).status, SandboxStatus::Failed);  // syntax error
  // An exit code that could be mistaken for a sandbox signal is still the program's failure.
  EXPECT_EQ(run_python("import sys\nsys.exit(125)\n", quick()).status, SandboxStatus::Failed);
}

TEST(Sandbox, KillsAProgramThatRunsTooLongWithItsChildren) {
  SandboxLimits l = quick();
  l.timeout_s = 0.5;
  // The program starts a grandchild that would outlive it; the process group is killed.
  SandboxResult r = run_python(
      "import subprocess, sys\n"
      "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
      "while True: pass\n",
      l);
  EXPECT_EQ(r.status, SandboxStatus::TimedOut);
  EXPECT_LT(r.wall_s, 3.0);
}

TEST(Sandbox, LimitsMemory) {
  SandboxLimits l = quick();
  l.memory_bytes = 256ll << 20;
  SandboxResult r = run_python("x = bytearray(1 << 30)\n", l);
  EXPECT_EQ(r.status, SandboxStatus::Failed);
  EXPECT_NE(r.output.find("MemoryError"), std::string::npos) << r.output;
}

TEST(Sandbox, HasNoNetworkAndAnEmptyWorkingDirectory) {
  SandboxResult probe = run_python("pass\n", quick());
  if (probe.status == SandboxStatus::NoIsolation) GTEST_SKIP() << "this machine cannot make network namespaces";
  // In a fresh network namespace only the loopback interface exists, and it is down.
  SandboxResult r = run_python(
      "import os, socket\n"
      "names = [n for _, n in socket.if_nameindex()]\n"
      "assert names == ['lo'], names\n"
      "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
      "s.settimeout(2)\n"
      "try:\n"
      "    s.connect(('127.0.0.1', 9))\n"
      "    raise SystemExit('connected')\n"
      "except OSError as e:\n"
      "    print('refused', e)\n"
      "assert sorted(os.listdir('.')) == ['output.txt', 'program.py'], os.listdir('.')\n"
      "assert os.environ['HOME'] == os.getcwd()\n",
      quick());
  EXPECT_EQ(r.status, SandboxStatus::Passed) << r.output;
}

TEST(Sandbox, RemovesItsTemporaryDirectory) {
  SandboxResult r = run_python("import os\nprint(os.getcwd())\nopen('junk', 'w').write('x' * 1000)\n", quick());
  ASSERT_EQ(r.status, SandboxStatus::Passed) << r.output;
  std::string dir = r.output.substr(0, r.output.find('\n'));
  ASSERT_FALSE(dir.empty());
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
}

class TaskFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("deepinfer-task-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::filesystem::path dir_;
};

TEST_F(TaskFiles, HumanEvalProgramRunsTheChecks) {
  write("humaneval.jsonl",
        R"({"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Adds.\"\"\"\n", )"
        R"("test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"})"
        "\n");
  Task t = load_task("humaneval", dir_.string());
  ASSERT_EQ(t.problems.size(), 1u);
  const Problem& p = t.problem("HumanEval/0");
  EXPECT_EQ(run_python(t.program(p, "    return a + b\n"), quick()).status, SandboxStatus::Passed);
  EXPECT_EQ(run_python(t.program(p, "    return a - b\n"), quick()).status, SandboxStatus::Failed);
  EXPECT_THROW(t.problem("HumanEval/1"), Error);
}

TEST_F(TaskFiles, MbppProgramRunsSetupThenEveryTest) {
  write("mbpp.jsonl",
        R"({"task_id": "mbpp/1", "text": "Write a function to double a number.", )"
        R"("test_list": ["assert double(2) == 4", "assert double(0) == 0", "assert double(-1) == -2"], )"
        R"("test_setup_code": ""})"
        "\n");
  Task t = load_task("mbpp", dir_.string());
  const Problem& p = t.problem("mbpp/1");
  EXPECT_NE(p.prompt.find("assert double(2) == 4"), std::string::npos);
  EXPECT_EQ(p.prompt.find("assert double(0) == 0"), std::string::npos);  // only the first test is shown
  EXPECT_EQ(run_python(t.program(p, "def double(x):\n    return 2 * x\n"), quick()).status, SandboxStatus::Passed);
  // Right on the shown test, wrong on a hidden one.
  EXPECT_EQ(run_python(t.program(p, "def double(x):\n    return 4 if x == 2 else 0\n"), quick()).status,
            SandboxStatus::Failed);
}

TEST_F(TaskFiles, MalformedDataIsAnErrorNamingTheLine) {
  write("humaneval.jsonl", "{\"task_id\": \"x\", \"prompt\": 3}\n");
  try {
    load_task("humaneval", dir_.string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("humaneval.jsonl:1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_task("mbpp", dir_.string()), Error);  // missing file
  EXPECT_THROW(load_task("nosuchtask", dir_.string()), Error);
}

TEST(Answers, TheFinalNumberIsExtractedAndComparedByValue) {
  EXPECT_EQ(extract_answer("She sells 9 eggs for $2 each, so 9 * 2 = 18. The answer is 18."), "18");
  EXPECT_EQ(extract_answer("The answer is $1,234.50 in total."), "1234.50");
  EXPECT_EQ(extract_answer("work...\n#### 72"), "72");
  EXPECT_EQ(extract_answer("3 apples and 4 pears make 7"), "7");  // no marker: the last number
  EXPECT_EQ(extract_answer("The answer is -5, since 2 - 7 = -5"), "-5");
  EXPECT_EQ(extract_answer("The answer is 12. Then 99 more words"), "12");  // the marker wins over later numbers
  EXPECT_EQ(extract_answer("no numbers here"), "");
  EXPECT_TRUE(same_answer("18", "18.0"));
  EXPECT_TRUE(same_answer("1,000", "1000"));
  EXPECT_FALSE(same_answer("18", "19"));
  EXPECT_FALSE(same_answer("", "0"));
}

TEST_F(TaskFiles, Gsm8kIsGradedByItsAnswerWithoutRunningCode) {
  write("gsm8k.jsonl", R"({"task_id": "gsm8k/0", "question": "What is 6 times 7?", "answer": "42"})"
                       "\n");
  Task t = load_task("gsm8k", dir_.string());
  EXPECT_FALSE(t.runs_code);
  EXPECT_NE(t.problems[0].prompt.find("What is 6 times 7?"), std::string::npos);
  std::map<std::string, Task> tasks{{"gsm8k", t}};
  // A completion that is also a harmful program: answers are never executed.
  std::vector<Sample> samples = {{"gsm8k", "gsm8k/0", 0, " 6 * 7 = 42. The answer is 42."},
                                 {"gsm8k", "gsm8k/0", 1, "import os; os.system('false')  # 41"}};
  GradeOptions options;
  options.limits = quick();
  options.allow_network = true;
  std::vector<GradedSample> g = grade(samples, tasks, options);
  EXPECT_EQ(g[0].result.status, SandboxStatus::Passed);
  EXPECT_EQ(g[1].result.status, SandboxStatus::Failed);
  EXPECT_NE(g[1].result.output.find("answer: 41"), std::string::npos) << g[1].result.output;
}

TEST(Grade, RunsSamplesInParallelAndKeepsTheirOrder) {
  Task t;
  t.name = "t";
  for (int i = 0; i < 6; ++i) {
    Problem p;
    p.task_id = "p" + std::to_string(i);
    p.program_prefix = "x = ";
    p.program_suffix = "\nassert x == " + std::to_string(i) + "\n";
    t.problems.push_back(p);
  }
  std::map<std::string, Task> tasks{{"t", t}};
  std::vector<Sample> samples;
  for (int i = 0; i < 6; ++i) samples.push_back({"t", "p" + std::to_string(i), 0, std::to_string(i % 2 == 0 ? i : 99)});
  GradeOptions options;
  options.limits = quick();
  options.workers = 3;
  options.allow_network = true;  // the order is what is tested here
  std::vector<GradedSample> g = grade(samples, tasks, options);
  ASSERT_EQ(g.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(g[i].sample.task_id, "p" + std::to_string(i));
    EXPECT_EQ(g[i].result.status, i % 2 == 0 ? SandboxStatus::Passed : SandboxStatus::Failed) << i;
  }
  samples.push_back({"t", "missing", 0, "1"});
  EXPECT_THROW(grade(samples, tasks, options), Error);  // before anything runs
}

}  // namespace
}  // namespace deepinfer::eval
