#include <csignal>
#include <cstdio>
#include <exception>
#include <string_view>

#include "command.h"
#include "core/error.h"

namespace deepinfer::cli {

std::vector<Command>& registry() {
  static std::vector<Command> all;
  return all;
}

bool register_command(const Command& command) {
  registry().push_back(command);
  return true;
}

const std::vector<Command>& commands() { return registry(); }

}  // namespace deepinfer::cli

namespace {

void print_usage() {
  std::fprintf(stderr, "usage: deepinfer <command> [options]\n\ncommands:\n");
  for (const auto& c : deepinfer::cli::commands()) {
    std::fprintf(stderr, "  %-14.*s %.*s\n", static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  }
  std::fprintf(stderr, "\nRun `deepinfer <command> --help` for a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  // A write to a socket whose peer is gone (a client that hung up, a
  // data-parallel rank or KV peer that died, gloo's TCP pairs) must fail that
  // write with EPIPE, which its caller reports, not end the process with
  // SIGPIPE before anything is logged.
  std::signal(SIGPIPE, SIG_IGN);
  if (argc < 2 || std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h") {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  std::string_view name = argv[1];
  for (const auto& c : deepinfer::cli::commands()) {
    if (c.name == name) {
      try {
        return c.run(argc - 1, argv + 1);
      } catch (const deepinfer::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "internal error: %s\n", e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "deepinfer: unknown command '%.*s'\n\n", static_cast<int>(name.size()), name.data());
  print_usage();
  return 2;
}
