#include "eval/sandbox.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"

namespace deepinfer::eval {
namespace {

void set_limit(int resource, rlim_t value) {
  rlimit r{value, value};
  setrlimit(resource, &r);
}

// Everything the child needs, prepared before fork: between fork and exec a
// child of a threaded process may only make async-signal-safe calls (no malloc).
struct ChildPlan {
  std::string dir;
  std::string python;  // absolute path
  std::vector<std::string> env;
  std::vector<char*> envp;
  std::vector<char*> argv;
  rlim_t cpu_s, memory, file_bytes;
  bool allow_network;
  int report_fd;  // write end of a close-on-exec pipe: one byte = no network isolation
};

[[noreturn]] void exec_child(const ChildPlan& plan) {
  setpgid(0, 0);
  if (unshare(CLONE_NEWNET) != 0) {
    // Without CAP_SYS_ADMIN a user namespace grants it for the new network namespace.
    if (unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0 && !plan.allow_network) {
      const char n = 'N';
      [[maybe_unused]] ssize_t w = write(plan.report_fd, &n, 1);
      _exit(126);
    }
  }
  if (chdir(plan.dir.c_str()) != 0) _exit(126);
  const int null_fd = open("/dev/null", O_RDONLY);
  const int out_fd = open("output.txt", O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (null_fd < 0 || out_fd < 0) _exit(126);
  dup2(null_fd, 0);
  dup2(out_fd, 1);
  dup2(out_fd, 2);
  set_limit(RLIMIT_CPU, plan.cpu_s);
  set_limit(RLIMIT_AS, plan.memory);
  set_limit(RLIMIT_FSIZE, plan.file_bytes);
  set_limit(RLIMIT_NOFILE, 64);
  set_limit(RLIMIT_CORE, 0);
  execve(plan.python.c_str(), plan.argv.data(), plan.envp.data());
  _exit(127);
}

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  fail("cannot find {} on PATH to run the tests", name);
}

std::string read_tail(const std::filesystem::path& path, int64_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > max_bytes ? size - max_bytes : 0;
  in.seekg(start);
  std::string s(static_cast<size_t>(size - start), '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  return s;
}

}  // namespace

const char* to_string(SandboxStatus s) {
  switch (s) {
    case SandboxStatus::Passed: return "passed";
    case SandboxStatus::Failed: return "failed";
    case SandboxStatus::TimedOut: return "timed out";
    case SandboxStatus::NoIsolation: return "no network isolation";
  }
  return "?";
}

SandboxResult run_python(const std::string& program, const SandboxLimits& limits, bool allow_network) {
  namespace fs = std::filesystem;
  std::string templ = (fs::temp_directory_path() / "deepinfer-eval-XXXXXX").string();
  DI_CHECK(mkdtemp(templ.data()) != nullptr, "cannot create a temporary directory: {}", std::strerror(errno));
  const fs::path dir = templ;
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};
  {
    std::ofstream f(dir / "program.py", std::ios::binary);
    f << program;
    DI_CHECK(f.good(), "cannot write {}", (dir / "program.py").string());
  }
  ChildPlan plan;
  plan.dir = dir.string();
  plan.python = find_program(limits.python);
  plan.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + plan.dir, "TMPDIR=" + plan.dir, "LANG=C.UTF-8",
              "PYTHONHASHSEED=0"};
  for (std::string& e : plan.env) plan.envp.push_back(e.data());
  plan.envp.push_back(nullptr);
  // -I: isolated mode (no user site, no PYTHON* variables, script dir not on sys.path); -B: no .pyc.
  static const char* kArgs[] = {"-I", "-B", "program.py"};
  plan.argv.push_back(plan.python.data());
  for (const char* a : kArgs) plan.argv.push_back(const_cast<char*>(a));
  plan.argv.push_back(nullptr);
  plan.cpu_s = static_cast<rlim_t>(limits.timeout_s) + 1;
  plan.memory = static_cast<rlim_t>(limits.memory_bytes);
  plan.file_bytes = static_cast<rlim_t>(limits.file_bytes);
  plan.allow_network = allow_network;
  int report[2];
  DI_CHECK(pipe2(report, O_CLOEXEC) == 0, "pipe failed: {}", std::strerror(errno));
  plan.report_fd = report[1];

  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    close(report[0]);
    close(report[1]);
    fail("fork failed: {}", std::strerror(errno));
  }
  if (pid == 0) exec_child(plan);
  close(report[1]);
  setpgid(pid, pid);  // also in the parent, so the kill below cannot miss the group

  SandboxResult result;
  int status = 0;
  bool timed_out = false;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > limits.timeout_s) {
      timed_out = true;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(elapsed < 0.1 ? 1 : 10));
  }
  kill(-pid, SIGKILL);  // whatever the program left running in its group
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  result.output = read_tail(dir / "output.txt", limits.output_bytes);
  char reported = 0;
  const bool no_isolation = read(report[0], &reported, 1) == 1 && reported == 'N';
  close(report[0]);
  if (no_isolation) {
    result.status = SandboxStatus::NoIsolation;
  } else if (timed_out) {
    result.status = SandboxStatus::TimedOut;
  } else {
    result.status = WIFEXITED(status) && WEXITSTATUS(status) == 0 ? SandboxStatus::Passed : SandboxStatus::Failed;
  }
  return result;
}

}  // namespace deepinfer::eval
