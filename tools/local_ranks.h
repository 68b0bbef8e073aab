// `--tensor-parallel-size N` or `--data-parallel-size N` without a launcher: this process becomes rank 0
// and starts ranks 1..N-1 itself — the same binary and command line, told
// their rank through the launcher variables (RANK, WORLD_SIZE, LOCAL_RANK)
// and a rendezvous directory of their own. The followers die with rank 0
// (PR_SET_PDEATHSIG); rank 0 ends with an error as soon as a follower dies
// before the group is stopped.
#pragma once

#include <chrono>

#include "dist/dist_config.h"

namespace deepinfer::cli {

// Starts the follower processes and returns rank 0's DistConfig.
DistConfig start_local_ranks(int world_size, std::chrono::milliseconds timeout);

}  // namespace deepinfer::cli
