// Runs untrusted Python (a model's code plus a task's tests) in a separate
// process: its own empty temporary directory as working and home directory,
// no network (a new network namespace, in which no interface is up), limits
// on CPU time, address space, file size and open files, a wall-clock timeout
// that kills the whole process group, and a minimal environment. It is not a
// file-system jail: the program can read what the user running it can read.
#pragma once

#include <string>

namespace deepinfer::eval {

struct SandboxLimits {
  double timeout_s = 10.0;            // wall clock; CPU time is capped just above it
  int64_t memory_bytes = 1ll << 30;   // RLIMIT_AS
  int64_t file_bytes = 16ll << 20;    // RLIMIT_FSIZE: largest file it may write
  int64_t output_bytes = 4096;        // of stdout+stderr kept for the report
  std::string python = "python3";
};

enum class SandboxStatus { Passed, Failed, TimedOut, NoIsolation };

struct SandboxResult {
  SandboxStatus status = SandboxStatus::Failed;
  int exit_code = -1;   // or the negated signal number
  double wall_s = 0.0;
  std::string output;   // the tail of stdout+stderr
};

const char* to_string(SandboxStatus s);

// Runs `program` as a Python script. Thread-safe: callers run several at once.
// NoIsolation means the network namespace could not be made (the program did
// not run): the caller decides whether to run unisolated (allow_network).
SandboxResult run_python(const std::string& program, const SandboxLimits& limits, bool allow_network = false);

}  // namespace deepinfer::eval
