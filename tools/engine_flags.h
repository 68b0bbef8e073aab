// Engine flags shared by the subcommands that run a model (generate, bench,
// serve), named as in other engines (--max-model-len, --max-num-seqs, ...).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/engine_config.h"

namespace deepinfer::cli {

struct EngineFlags {
  EngineConfig config;
  std::string cost_model_path;
  std::string speculative_config;  // --speculative-config JSON
  bool no_prefix_caching = false;
  double kv_offloading_gib = 0.0;   // --kv-offloading-size
  double kv_cache_dir_gib = 64.0;   // --kv-cache-dir-size
  std::string device;  // --device cpu|cuda; empty = DEEPINFER_ACCELERATOR or cpu
  // --tensor-parallel-size without a launcher starts the other ranks as
  // copies of this process (the CLI); an embedding process (Python) cannot.
  bool start_local_ranks = true;
  std::string dp_vote_mode = "any";  // --dp-vote-mode
  int32_t dp_vote_interval = 0;      // --dp-vote-interval; 0 = the mode's default
};

void add_engine_flags(CLI::App& app, EngineFlags& flags);
// Resolves defaults (built-in model, environment) and loads the cost model
// file. On a follower rank of a tensor-parallel group it runs the rank and
// exits the process.
EngineConfig finish_engine_flags(EngineFlags& flags, const char* argv0);

// The built-in default model: models/SmolLM2-135M-Instruct.Q4_1.gguf next to
// the build folder (placed there by scripts/fetch_models.sh).
std::string default_model_path(const char* argv0);

}  // namespace deepinfer::cli
