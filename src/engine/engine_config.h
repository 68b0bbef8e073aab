// EngineConfig: every knob of an Engine, with the well-known flag names of
// other engines noted. Filled by the CLI / server from flags
// (tools/engine_flags.cpp) and the environment (with_environment(), the one
// place that reads the engine's variables); the engine itself reads none.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/dist_config.h"
#include "sched/group_vote.h"
#include "sched/cost_model.h"
#include "spec/speculative_config.h"

namespace deepinfer {

struct EngineConfig {
  std::string model_path;
  // --tensor-parallel-size: ranks that split every layer (one process each);
  // `dist` says which of them this process is and where they meet
  // (dist/dist_config.h; the launcher's variables, or the local ranks the
  // CLI starts itself).
  int32_t tensor_parallel_size = 1;
  // --enable-expert-parallel: the MoE layers' experts spread whole over those
  // ranks (EPLB placement, live re-placement) instead of split in width.
  bool enable_expert_parallel = false;
  // --data-parallel-size: ranks (one process each) that each run a whole
  // engine on their own requests. With --enable-expert-parallel their MoE
  // layers form one expert-parallel group, and a vote before every step
  // (`data_parallel_vote`, sched/group_vote.h) keeps the ranks' steps aligned.
  int32_t data_parallel_size = 1;
  GroupVoteConfig data_parallel_vote;
  // Without expert parallelism nothing crosses ranks inside a step: `serve`
  // lets such ranks step on their own (replicas behind its router, which
  // routes around one that fails); `generate` keeps them voting, so that they
  // finish together and a lost rank is noticed within the timeout.
  bool data_parallel_independent_replicas = false;
  DistConfig dist;
  std::string tokenizer_path;  // empty = the model's own (GGUF metadata or the model folder)
  // --chat-template: a Jinja file or the template itself, replacing the
  // tokenizer's (or supplying one for models that ship none).
  std::string chat_template;
  DeviceType device = DeviceType::CPU;
  int32_t num_threads = 0;          // CPU backend threads (0 = all cores)
  int32_t max_model_len = 0;        // --max-model-len; 0 = min(model's context, 8192)
  int32_t max_num_seqs = 64;        // --max-num-seqs
  // --max-num-batched-tokens (fixed budget without a cost model); 0 = the
  // device's default (default_max_num_batched_tokens in engine_builder.h).
  int32_t max_num_batched_tokens = 0;
  int32_t block_size = 16;          // --block-size (tokens per KV page)
  int64_t kv_cache_tokens = 0;      // 0 = sized from kv_cache_memory_bytes
  int64_t kv_cache_memory_bytes = 512ll << 20;  // --kv-cache-memory on the CPU
  // --kv-cache-dtype: "auto" (the backend's default: f16 on the CPU, bf16 on
  // GPUs), "f32"/"f16" (CPU), "bf16" (GPU), or "fp8" (= "fp8_e4m3"): K and V
  // are rounded to e4m3 when stored (scale 1, saturating at +-448), which
  // halves the cache's memory and the bytes decode attention reads.
  std::string kv_cache_dtype = "auto";
  // --quantization (vLLM's flag): "fp8" stores the linear weights of a 16/32-bit
  // checkpoint as e4m3 with one scale per 64 elements of a row
  // (model/fp8_weights.h; CPU backend). FP8 checkpoints need no flag.
  std::string quantization;
  bool enable_prefix_caching = true;  // --enable-prefix-caching / --no-enable-prefix-caching
  // KV tiers below the device pages (kv/tiers/kv_tiers.h), used with prefix
  // caching: --kv-offloading-size (GiB of host memory, vLLM's flag; 0 = off,
  // or only staging for the disk tier), --kv-cache-dir (block files; on a
  // cluster a shared file system) with --kv-cache-dir-size (GiB), and the
  // time to live of blocks whose request gives no cache_ttl (--kv-cache-ttl,
  // seconds; the seed's chat default of 7 days; agent requests, those with
  // tools, default to 3 days).
  uint64_t kv_offloading_bytes = 0;
  std::string kv_cache_dir;
  uint64_t kv_cache_dir_bytes = uint64_t{64} << 30;
  int64_t kv_cache_ttl_s = 7 * 86400;
  // KV handed between engines on one node through shared memory
  // (`serve --kv-transport shared`, kv/tiers/shared_pool.h): a prefill engine
  // exports through a pool of kv_shared_pool_bytes; a decode engine imports
  // from the pools its requests name.
  uint64_t kv_shared_pool_bytes = 0;
  bool kv_import_shared = false;
  // KV handed between engines on different nodes over UCX (`serve
  // --kv-transport ucx`, kv/transport): a prefill engine serves its host tier
  // at kv_transport_listen (host:port, port 0 = any) and names itself
  // ucx://kv_transport_advertise_host:port in its answers; a decode engine
  // fetches from the engines its requests name, on kv_transport_peers only.
  std::string kv_transport_listen;
  std::string kv_transport_advertise_host;
  bool kv_transport_fetch = false;
  std::vector<std::string> kv_transport_peers;
  std::optional<StepCostModel> cost_model;  // from `deepinfer bench --fit-cost-model`
  double step_time_budget_s = 0.25;
  bool batch_invariant = false;  // DEEPINFER_BATCH_INVARIANT=1
  uint64_t seed = 0;  // derives per-request seeds for requests without one
  // Pipelined step loop: the host schedules and launches step N+1 while the
  // device runs step N (DEEPINFER_ZERO_OVERHEAD_SCHEDULING=0 turns it off).
  bool zero_overhead_scheduling = true;
  bool enforce_eager = false;  // --enforce-eager: no CUDA graphs
  // Testing (no flag): every step staged in the padded shape a CUDA graph
  // would replay, run eagerly (RunnerLimits::graph_shapes_eager), so that the
  // CPU tests check the graphs' padding too.
  bool graph_shapes_eager = false;
  // --gpu-memory-utilization: share of the device's memory this engine may
  // use (weights, activations, KV cache); sizes the KV cache on GPUs.
  double gpu_memory_utilization = 0.9;
  // Expert-load statistics of MoE models (EPLB, docs/eplb.md). eplb_ep_size
  // > 0 (--eplb-ep-size) simulates expert parallelism over that many ranks:
  // every step's routed tokens per expert feed a window of eplb_window_steps
  // steps, and the experts are re-placed every eplb_interval_steps steps with
  // eplb_redundant_slots extra slots per rank (on one GPU nothing moves; the
  // moe_lb metric shows the effect). Defaults: EplbSchedule::decode().
  int32_t eplb_ep_size = 0;
  int32_t eplb_window_steps = 1000;      // --eplb-window-steps
  int32_t eplb_interval_steps = 10000;   // --eplb-interval-steps
  int32_t eplb_redundant_slots = 1;      // --eplb-redundant-slots
  // --routing-trace: each step's counts appended to one CSV per MoE layer
  // (ExpertLoadMonitor::trace_file), the format `deepinfer eplb-sim --trace` reads.
  std::string routing_trace_path;
  // --speculative-config: drafting and verifying several tokens per step
  // (method none = off).
  spec::SpeculativeConfig speculative;
};

// The configuration with the engine's environment switches applied:
// DEEPINFER_BATCH_INVARIANT=1 and DEEPINFER_ZERO_OVERHEAD_SCHEDULING=0|1.
EngineConfig with_environment(EngineConfig config);

}  // namespace deepinfer
