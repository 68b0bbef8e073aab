// Subcommands of the `deepinfer` CLI. Each tools/cmd_*.cpp registers one with
// DEEPINFER_COMMAND; main() dispatches on argv[1].
#pragma once

#include <string_view>
#include <vector>

namespace deepinfer::cli {

struct Command {
  std::string_view name;
  std::string_view summary;
  // argv[0] is the subcommand name; returns the process exit code.
  int (*run)(int argc, char** argv);
};

bool register_command(const Command& command);
const std::vector<Command>& commands();

}  // namespace deepinfer::cli

#define DEEPINFER_COMMAND(name, summary, fn) \
  static const bool fn##_registered = ::deepinfer::cli::register_command({name, summary, fn})
