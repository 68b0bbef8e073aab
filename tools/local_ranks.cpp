#include "local_ranks.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/logging.h"

namespace deepinfer::cli {

namespace {

// This process's own command line, as the kernel keeps it.
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t begin = 0;
  while (begin < raw.size()) {
    const size_t end = raw.find('\0', begin);
    args.push_back(raw.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  DI_CHECK(!args.empty(), "cannot read this process's command line");
  return args;
}

// Ends rank 0 when a follower dies: no step can run without it, and an idle
// server would otherwise notice only at its next request.
void watch_follower(int rank, pid_t pid) {
  int status = 0;
  pid_t got = -1;
  do {
    got = waitpid(pid, &status, 0);
  } while (got < 0 && errno == EINTR);
  if (got != pid) return;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;  // stopped by rank 0
  log_error("rank {} (pid {}) {} {}; stopping", rank, pid,
              WIFSIGNALED(status) ? "was killed by signal" : "exited with status",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  std::_Exit(1);
}

}  // namespace

DistConfig start_local_ranks(int world_size, std::chrono::milliseconds timeout) {
  DI_CHECK(world_size >= 2 && world_size <= 64, "{} ranks out of range [2, 64]", world_size);
  char dir_template[] = "/tmp/deepinfer-ranks-XXXXXX";
  DI_CHECK(mkdtemp(dir_template) != nullptr, "cannot create a rendezvous directory under /tmp");
  const std::string init = std::string("file://") + dir_template;
  const std::vector<std::string> args = own_command_line();
  std::vector<pid_t> pids;
  for (int rank = 1; rank < world_size; ++rank) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    DI_CHECK(pid >= 0, "cannot start rank {}", rank);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() == 1) _exit(1);  // rank 0 is already gone
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
      setenv("DEEPINFER_DIST_INIT", init.c_str(), 1);
      setenv("DEEPINFER_DIST_TIMEOUT_S", std::to_string(std::max<int64_t>(1, timeout.count() / 1000)).c_str(), 1);
      // A follower's output is logging only: keep rank 0's stdout for results.
      dup2(STDERR_FILENO, STDOUT_FILENO);
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "error: cannot start rank %d\n", rank);
      _exit(127);
    }
    pids.push_back(pid);
  }
  for (size_t i = 0; i < pids.size(); ++i) std::thread(watch_follower, static_cast<int>(i) + 1, pids[i]).detach();
  log_info("started ranks 1..{} on this machine (rendezvous {})", world_size - 1, init);
  DistConfig d;
  d.rank = 0;
  d.world_size = world_size;
  d.local_rank = 0;
  d.init_method = init;
  d.timeout = timeout;
  return d;
}

}  // namespace deepinfer::cli
