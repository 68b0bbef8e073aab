// DistConfig: who this process is in a multi-process job (rank, world size,
// rank on its node) and where the ranks meet (the rendezvous), read from the
// variables a launcher sets. One process per rank; see docs/distributed.md.
//
// Launchers, first match wins (torchrun inside a Slurm allocation sets both
// its own and Slurm's variables, and so does mpirun):
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK
//   mpirun    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   srun      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
// A missing local rank defaults to the rank (right for single-node launches,
// which is where it tends to be left out).
// Rendezvous: DEEPINFER_DIST_INIT ("tcp://host:port" or "file:///dir")
// when set, else MASTER_ADDR + MASTER_PORT (torchrun sets them; with mpirun
// and srun export them yourself). Under torchrun, whose agent already serves
// a store on MASTER_PORT, rank 0 serves ours on MASTER_PORT + 1.
// DEEPINFER_DIST_TIMEOUT_S: seconds any
// rendezvous or collective may wait for a peer (default 300).
// DEEPINFER_DIST_IFNAME: the network interface the ranks talk over.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace deepinfer {

struct DistConfig {
  static constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::seconds(300)};

  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // "tcp://host:port" (rank 0 serves a store on port) or "file:///dir" (a
  // directory every rank sees, fresh for each launch). Empty only for one rank.
  std::string init_method;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // Network interface for the ranks' connections; empty = the one that routes
  // to the rendezvous host (or this host's name when the rendezvous is a file).
  std::string ifname;
};

// Looks a variable up; std::nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;

// The process environment (std::getenv) as an EnvLookup.
EnvLookup process_environment();

// Builds the config from the launcher's variables; throws deepinfer::Error
// naming the variable for any value that is malformed, out of range, or
// missing where it is needed. No launcher variables: one rank.
DistConfig dist_config_from_env(const EnvLookup& env);

// A parsed init_method.
struct InitMethod {
  enum class Kind : uint8_t { Tcp, File };
  Kind kind = Kind::Tcp;
  std::string host;  // Tcp: a name or an address; IPv6 without its brackets
  uint16_t port = 0;  // Tcp: 1..65535
  std::string path;   // File: an absolute directory path
};

// "tcp://host:port", "tcp://[v6addr]:port" or "file:///abs/dir"; throws
// deepinfer::Error for anything else.
InitMethod parse_init_method(std::string_view init_method);

}  // namespace deepinfer
