#include "engine_flags.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/engine_builder.h"
#include "local_ranks.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer::cli {

void add_engine_flags(CLI::App& app, EngineFlags& f) {
  EngineConfig& c = f.config;
  app.add_option("--model,-m", c.model_path,
                 "GGUF file or Hugging Face folder (default: built-in SmolLM2-135M-Instruct; "
                 "DEEPINFER_HF_MODEL_DIR also sets it)");
  app.add_option("--tokenizer", c.tokenizer_path, "tokenizer.json or folder (default: the model's)");
  app.add_option("--chat-template", c.chat_template,
                 "chat template: a Jinja file, or the template text (default: the tokenizer's)");
  app.add_option("--device", f.device, "compute device: cpu or cuda (DEEPINFER_ACCELERATOR also sets it)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--tensor-parallel-size,--tp", c.tensor_parallel_size,
                 "ranks (processes) that split every layer's heads and widths; without a launcher (torchrun, "
                 "mpirun, srun) the ranks are started on this machine")
      ->check(CLI::Range(1, 64));
  app.add_flag("--enable-expert-parallel", c.enable_expert_parallel,
               "MoE models on several ranks: each rank holds whole experts (an EPLB placement with live "
               "re-placement: --eplb-window-steps, --eplb-interval-steps, --eplb-redundant-slots) and tokens "
               "travel to them; CPU only for now");
  app.add_option("--data-parallel-size,--dp", c.data_parallel_size,
                 "ranks (processes) that each run the whole model on their own requests; with "
                 "--enable-expert-parallel their MoE layers share one expert-parallel group and vote on every "
                 "step's type; without a launcher the ranks are started on this machine")
      ->check(CLI::Range(1, 64));
  app.add_option("--dp-vote-mode", f.dp_vote_mode,
                 "data parallel + expert parallel: when the group prefills: any (a rank's waiting prompt, at most "
                 "every --dp-vote-interval steps) or all (when every rank is ready)")
      ->check(CLI::IsMember({"any", "all"}));
  app.add_option("--dp-vote-interval", f.dp_vote_interval,
                 "data parallel + expert parallel: steps between two group prefills (default: 4 for any, 1 for all)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--threads", c.num_threads, "CPU threads (0 = all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--max-model-len", c.max_model_len, "maximum tokens per sequence (prompt + output)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--max-num-seqs", c.max_num_seqs, "maximum sequences per step")->check(CLI::Range(1, 65536));
  app.add_option("--max-num-batched-tokens", c.max_num_batched_tokens,
                 "token budget per step (default: 512 on the CPU, 8192 on a GPU)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--block-size", c.block_size, "tokens per KV-cache page")->check(CLI::Range(1, 1024));
  app.add_option("--kv-cache-tokens", c.kv_cache_tokens, "KV cache size in tokens (overrides --kv-cache-memory)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 34));
  app.add_option("--kv-cache-memory", c.kv_cache_memory_bytes, "KV cache size in bytes")
      ->check(CLI::Range(int64_t{1} << 16, int64_t{1} << 42));
  app.add_option("--kv-cache-dtype", c.kv_cache_dtype,
                 "KV cache element type: auto (f16 on the CPU, bf16 on GPUs), f32 or f16 (CPU), bf16 (GPU), or "
                 "fp8 / fp8_e4m3 (half the memory and attention reads of 16-bit; values rounded to e4m3, scale 1)")
      ->check(CLI::IsMember({"auto", "f32", "float32", "f16", "float16", "bf16", "bfloat16", "fp8", "fp8_e4m3"}));
  app.add_option("--quantization", c.quantization,
                 "quantise weights at load: fp8 (the linear layers' weights as e4m3, one scale per 64 elements of "
                 "a row: half the bytes of bf16; CPU backend) or none. FP8 checkpoints load as FP8 without it")
      ->check(CLI::IsMember({"none", "fp8"}));
  app.add_flag("--no-enable-prefix-caching", f.no_prefix_caching, "disable prefix caching");
  app.add_option("--kv-offloading-size", f.kv_offloading_gib,
                 "GiB of host memory for a KV tier below the device's pages (0 = none): prefix blocks are "
                 "copied there and loaded back on a hit")
      ->check(CLI::Range(0.0, 1048576.0));
  app.add_option("--kv-cache-dir", c.kv_cache_dir,
                 "directory of a persistent KV tier (block files; a shared file system lets replicas and "
                 "restarts share prefixes)");
  app.add_option("--kv-cache-dir-size", f.kv_cache_dir_gib, "GiB the --kv-cache-dir tier may hold (LRU beyond)")
      ->check(CLI::Range(0.001, 16777216.0));
  app.add_option("--kv-cache-ttl", c.kv_cache_ttl_s,
                 "seconds the KV tiers keep a block of a request without cache_ttl (0 = no expiry; "
                 "default 7 days; requests with tools default to 3 days)")
      ->check(CLI::Range(int64_t{0}, SamplingParams::kMaxCacheTtl));
  app.add_option("--cost-model", f.cost_model_path, "chunked-prefill cost model (JSON from `deepinfer bench`)");
  app.add_option("--step-time-budget", c.step_time_budget_s, "seconds per step for the cost model")
      ->check(CLI::Range(1e-4, 100.0));
  app.add_option("--gpu-memory-utilization", c.gpu_memory_utilization,
                 "share of the GPU's memory for weights, activations and the KV cache (sizes the KV cache "
                 "on GPUs unless --kv-cache-tokens is given)")
      ->check(CLI::Range(0.05, 0.99));
  app.add_flag("--enforce-eager", c.enforce_eager, "never run decode steps as CUDA graphs");
  app.add_option("--eplb-ep-size", c.eplb_ep_size,
                 "MoE models: collect expert-load statistics and simulate EPLB over this many ranks "
                 "(0 = off; exports moe_lb)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--eplb-window-steps", c.eplb_window_steps, "EPLB: steps of expert load kept")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--eplb-interval-steps", c.eplb_interval_steps, "EPLB: re-place experts every this many steps")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--eplb-redundant-slots", c.eplb_redundant_slots, "EPLB: extra expert slots per rank")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--speculative-config", f.speculative_config,
                 "speculative decoding as JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 5}' "
                 "(methods: ngram, suffix; \"dynamic\": false verifies every draft)");
  app.add_option("--routing-trace", c.routing_trace_path,
                 "MoE models: write each step's tokens per expert to PATH.layer<L>.csv, one file per MoE layer "
                 "(input of `deepinfer eplb-sim --trace`)");
}

std::string default_model_path(const char* argv0) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path exe = fs::canonical("/proc/self/exe", ec);
  if (ec) exe = fs::absolute(argv0);
  const std::string name = "SmolLM2-135M-Instruct.Q4_1.gguf";
  for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
    fs::path candidate = dir / "models" / name;
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  fail("the built-in default model {} was not found in a models/ folder above {}; run ./build.sh "
       "(it fetches it) or pass --model",
       name, exe.string());
}

EngineConfig finish_engine_flags(EngineFlags& f, const char* argv0) {
  EngineConfig c = f.config;
  if (c.model_path.empty()) {
    if (const char* dir = std::getenv("DEEPINFER_HF_MODEL_DIR"); dir && *dir) {
      c.model_path = dir;
    } else {
      c.model_path = default_model_path(argv0);
    }
  }
  std::string device = f.device;
  if (device.empty()) {
    const char* acc = std::getenv("DEEPINFER_ACCELERATOR");
    device = acc && *acc ? acc : "cpu";
  }
  DI_CHECK(device == "cpu" || device == "cuda", "unknown device '{}': expected cpu or cuda", device);
  c.device = device == "cuda" ? DeviceType::CUDA : DeviceType::CPU;
  c.enable_prefix_caching = !f.no_prefix_caching;
  c.kv_offloading_bytes = static_cast<uint64_t>(f.kv_offloading_gib * 1073741824.0);
  c.kv_cache_dir_bytes = static_cast<uint64_t>(f.kv_cache_dir_gib * 1073741824.0);
  if (!f.speculative_config.empty()) c.speculative = spec::SpeculativeConfig::parse(f.speculative_config);
  c = with_environment(std::move(c));
  GroupVoteConfig& vote = c.data_parallel_vote;
  vote.mode = f.dp_vote_mode == "all" ? VoteMode::All : VoteMode::Any;
  if (f.dp_vote_interval > 0) {
    (vote.mode == VoteMode::All ? vote.all_interval_steps : vote.any_interval_steps) = f.dp_vote_interval;
  }
  const int32_t ranks = c.tensor_parallel_size * c.data_parallel_size;
  if (ranks > 1 && c.dist.world_size == 1) {
    DI_CHECK(f.start_local_ranks,
             "--tensor-parallel-size / --data-parallel-size {} from Python needs a launcher (torchrun, mpirun or "
             "srun) to start the ranks",
             ranks);
    c.dist = start_local_ranks(ranks, c.dist.timeout);
  }
  // A tensor-parallel follower (every rank but the first of its data-parallel
  // rank's group) never returns to the command: it runs its first rank's
  // steps. A data-parallel rank runs the command on its own share of the work.
  if (c.dist.rank % c.tensor_parallel_size != 0) std::exit(run_follower_rank(std::move(c)));
  if (!f.cost_model_path.empty()) {
    std::ifstream in(f.cost_model_path);
    DI_CHECK(in.good(), "cannot read cost model file '{}'", f.cost_model_path);
    std::stringstream ss;
    ss << in.rdbuf();
    c.cost_model = StepCostModel::from_json(ss.str());
  }
  return c;
}

}  // namespace deepinfer::cli
