// Builds what an Engine runs on from its configuration: backend, model,
// tokenizer, the KV cache (sized for the device and laid out by layer group),
// the scheduler, the runner and the expert-load monitor. Resolves the
// settings left to the device (the per-step token budget) and logs every
// phase with its figures.
#pragma once

#include <memory>

#include "engine/engine_config.h"

namespace deepinfer {

class Backend;
class LoadedModel;
class Tokenizer;
class KvStorage;
class KvCacheManager;
class Scheduler;
class ModelRunner;
class KvTiers;
class UcxKvServer;
class GlooCommunicator;
class Communicator;
class StepBroadcaster;
class GlooVoteChannel;
class GroupVote;
namespace moe {
class ExpertLoadMonitor;
}

struct EngineParts {
  EngineConfig config;  // with the device-dependent defaults resolved
  std::unique_ptr<Backend> backend;
  // Tensor parallelism (--tensor-parallel-size > 1): the ranks' host control
  // channel (step plans) and the group the model's collectives run on (NCCL
  // on GPUs); rank 0 publishes its steps through step_broadcaster. Declared
  // before the model and runner, which use them, so they outlive them.
  std::unique_ptr<GlooCommunicator> control_group;
  std::unique_ptr<Communicator> device_group;
  std::unique_ptr<StepBroadcaster> step_broadcaster;
  // Data parallelism (--data-parallel-size > 1), on the rank that runs a
  // data-parallel rank's engine: data_parallel_group carries the vote before
  // every step (and, outside steps, the commands' own exchanges);
  // device_group, with --enable-expert-parallel, the MoE layers' all-to-alls.
  std::unique_ptr<GlooCommunicator> data_parallel_group;
  // With tensor and data parallelism and --enable-expert-parallel, on every
  // rank: the group of all ranks (host) and its device group, the MoE
  // layers' all-to-alls.
  std::unique_ptr<GlooCommunicator> experts_group;
  std::unique_ptr<Communicator> experts_device_group;
  std::unique_ptr<GlooVoteChannel> vote_channel;
  std::unique_ptr<GroupVote> group_vote;
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<KvStorage> kv;
  std::unique_ptr<KvCacheManager> kv_manager;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<moe::ExpertLoadMonitor> expert_load;  // with --eplb-ep-size or --routing-trace
  // Host and disk tiers (--kv-offloading-size, --kv-cache-dir); declared
  // last so it finishes its copies before the storage and backend go.
  std::unique_ptr<KvTiers> kv_tiers;
  // Serves kv_tiers' host tier to other nodes' engines (--kv-transport ucx,
  // prefill role); declared after the tiers so it stops before they go.
  std::unique_ptr<UcxKvServer> kv_export_server;
  int32_t max_model_len = 0;

  EngineParts();
  EngineParts(EngineParts&&) noexcept;
  EngineParts& operator=(EngineParts&&) noexcept;
  ~EngineParts();
};

// Per-step token budget when --max-num-batched-tokens is not given: a CPU
// step's time grows with its tokens from the first, so a small budget keeps
// decodes responsive; a GPU step costs about the same up to thousands of
// tokens, so a large budget lets prefill chunks ride along with decodes.
int32_t default_max_num_batched_tokens(DeviceType device);

EngineParts build_engine(EngineConfig config);

// A follower rank of a tensor-parallel group (config.dist.rank > 0): builds
// this rank's part of the engine and runs rank 0's steps until it stops the
// group. Returns the process exit code.
int run_follower_rank(EngineConfig config);

}  // namespace deepinfer
