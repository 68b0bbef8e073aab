#include "engine/engine_builder.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>

#include <fmt/ranges.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/logging.h"
#include "dist/device_communicator.h"
#include "dist/gloo_communicator.h"
#include "engine/gloo_vote_channel.h"
#include "engine/step_broadcast.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_storage.h"
#include "kv/tiers/kv_tiers.h"
#include "kv/transport/ucx_kv_client.h"
#include "kv/transport/ucx_kv_server.h"
#include "model/model_loader.h"
#include "moe/expert_load_monitor.h"
#include "runner/model_runner.h"
#include "sched/group_vote.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

EngineParts::EngineParts() = default;
EngineParts::EngineParts(EngineParts&&) noexcept = default;
EngineParts& EngineParts::operator=(EngineParts&&) noexcept = default;
EngineParts::~EngineParts() = default;

int32_t default_max_num_batched_tokens(DeviceType device) { return device == DeviceType::CPU ? 512 : 8192; }

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sampling rows per sequence and step: a speculative step verifies up to K
// drafts, each with its row, after the row of the known token.
int32_t rows_per_seq(const EngineConfig& config) {
  return config.speculative.enabled() ? 1 + config.speculative.num_speculative_tokens : 1;
}

// KV blocks that fit in --gpu-memory-utilization of the device after the
// weights and activations.
int64_t plan_device_kv_blocks(const EngineConfig& config, Backend& backend, LoadedModel& model, size_t block_bytes) {
  DI_CHECK(config.gpu_memory_utilization > 0.0 && config.gpu_memory_utilization < 1.0,
           "--gpu-memory-utilization {} must be in (0, 1)", config.gpu_memory_utilization);
  // Activations first (the runner's reservation is then a no-op), so the
  // free memory measured below is what weights and activations left.
  const int32_t max_rows =
      max_sampling_rows(config.max_num_batched_tokens, config.max_num_seqs, rows_per_seq(config));
  model.model().reserve(config.max_num_batched_tokens, max_rows);
  const DeviceMemoryInfo mem = *backend.memory_info();
  const auto total = static_cast<double>(mem.total_bytes);
  const double in_use = total - static_cast<double>(mem.free_bytes);  // weights, activations, other processes
  // Still to come besides the cache: the runner's logits and step inputs, and
  // room for CUDA graphs and library workspaces.
  const double logits = double(max_rows) * model.config().vocab_size * 4.0;
  const double runner_inputs = 64.0 * (config.max_num_batched_tokens + 4.0 * config.max_num_seqs);
  constexpr double kGraphsAndLibraries = 512.0 * 1048576.0;
  const double budget = config.gpu_memory_utilization * total - in_use - logits - runner_inputs - kGraphsAndLibraries;
  const double per_block = static_cast<double>(block_bytes) + 8.0;  // + two page-table entries per block
  const auto blocks = static_cast<int64_t>(budget / per_block) - 1;  // - the padding block
  log_info("engine: device memory {:.1f} GiB, {:.1f} GiB in use after loading (weights {:.2f} GiB); "
           "--gpu-memory-utilization {:.2f} leaves {:.2f} GiB for the KV cache",
           total / 1073741824.0, in_use / 1073741824.0, model.model().weight_bytes() / 1073741824.0,
           config.gpu_memory_utilization, std::max(budget, 0.0) / 1073741824.0);
  DI_CHECK(blocks >= 2,
           "not enough device memory for a KV cache: {:.2f} GiB of {:.2f} GiB are in use after loading the model; "
           "raise --gpu-memory-utilization or lower --max-num-batched-tokens / --max-num-seqs",
           in_use / 1073741824.0, total / 1073741824.0);
  return std::min<int64_t>(blocks, (int64_t{1} << 30) - 2);
}

DType kv_cache_dtype_for(const std::string& flag, const Backend& backend) {
  DType t = DType::F32;
  if (flag == "auto") {
    t = backend.default_kv_dtype();
  } else if (flag == "fp8" || flag == "fp8_e4m3") {
    t = DType::F8E4M3;
  } else if (flag == "f16" || flag == "float16") {
    t = DType::F16;
  } else if (flag == "bf16" || flag == "bfloat16") {
    t = DType::BF16;
  } else if (flag == "f32" || flag == "float32") {
    t = DType::F32;
  } else {
    throw Error("--kv-cache-dtype must be auto, f32, f16, bf16, fp8 or fp8_e4m3, got '" + flag + "'");
  }
  DI_CHECK(backend.supports_kv_dtype(t), "--kv-cache-dtype {}: the {} backend cannot keep its KV cache in {}", flag,
           backend.name(), dtype_name(t));
  return t;
}

void build_kv_cache(EngineParts& p) {
  const EngineConfig& config = p.config;
  const ModelConfig& mc = p.model->config();
  const DType kv_dtype = kv_cache_dtype_for(config.kv_cache_dtype, *p.backend);
  KvCacheSpec spec = p.model->model().kv_spec(config.block_size, kv_dtype);
  std::vector<int32_t> windows = mc.layer_window;
  if (config.speculative.method == spec::SpecMethod::Mtp) {
    // The MTP layer's KV is one more full-attention layer of the cache, read
    // through the same page tables (MtpProposer).
    DI_CHECK(mc.mla.enabled() && mc.mtp_layers > 0,
             "--speculative-config: the \"mtp\" method needs a model with multi-token-prediction layers "
             "(DeepSeek-V3's num_nextn_predict_layers); {} has none",
             mc.arch);
    ++spec.n_layers;
    windows.push_back(0);
  }
  KvLayout layout = KvLayout::from_windows(windows);
  const size_t block_bytes = spec.bytes_per_block(layout.slots_per_block);
  int64_t blocks = 0;
  if (config.kv_cache_tokens > 0) {
    // A token budget counts positions of every layer: the bytes of that many
    // tokens in the classic layout, whatever the groups then make of them.
    const int64_t bytes = (config.kv_cache_tokens + config.block_size - 1) / config.block_size *
                          static_cast<int64_t>(spec.bytes_per_page());
    blocks = bytes / static_cast<int64_t>(block_bytes);
  } else if (p.backend->memory_info()) {
    blocks = plan_device_kv_blocks(config, *p.backend, *p.model, block_bytes);
  } else {
    blocks = config.kv_cache_memory_bytes / static_cast<int64_t>(block_bytes);
  }
  // Every rank of a group holds the same blocks (one block table for all).
  if (p.control_group) blocks = p.control_group->all_reduce_min(blocks);
  DI_CHECK(blocks >= 2 && blocks < (int64_t{1} << 30), "KV cache of {} blocks is out of range", blocks);
  p.kv = std::make_unique<KvStorage>(*p.backend, spec, static_cast<int32_t>(blocks), layout);
  KvManagerConfig kc;
  kc.block_size = config.block_size;
  kc.max_step_tokens = config.max_num_batched_tokens;
  kc.enable_prefix_caching = config.enable_prefix_caching;
  // The seed's rollback of 6 covers K = 5 drafts; longer drafts roll back further.
  if (config.speculative.enabled()) kc.swa_replay_rollback = std::max(6, config.speculative.num_speculative_tokens + 1);
  p.kv_manager = std::make_unique<KvCacheManager>(std::move(layout), static_cast<int32_t>(blocks), kc);
  const KvLayout& l = p.kv_manager->layout();
  int32_t windowed = 0;
  for (const KvGroup& g : l.groups) windowed += g.window > 0;
  const double per_seq = static_cast<double>(p.kv_manager->blocks_when_decoding(p.max_model_len));
  log_info("engine: KV cache ({}) {:.1f} MiB in {} blocks of {} tokens x {} layers; {} layer group(s), {} windowed; "
           "{:.1f} KiB per token at {} tokens",
           dtype_name(kv_dtype), p.kv->bytes() / 1048576.0, blocks, config.block_size, l.slots_per_block,
           l.num_groups(), windowed, per_seq * static_cast<double>(block_bytes) / p.max_model_len / 1024.0,
           p.max_model_len);
  log_info("engine: max concurrency at {} tokens: {:.1f}x", p.max_model_len, static_cast<double>(blocks) / per_seq);
}

// The cross-node KV transport (--kv-transport ucx): a prefill engine serves
// its host tier, a decode engine fetches into its own.
void build_kv_transport(EngineParts& p) {
  const EngineConfig& c = p.config;
  if (!c.kv_transport_listen.empty()) {
    const size_t colon = c.kv_transport_listen.rfind(':');
    DI_CHECK(colon != std::string::npos, "--kv-transport-address '{}': want HOST:PORT", c.kv_transport_listen);
    std::string host = c.kv_transport_listen.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    int port = -1;
    const std::string port_text = c.kv_transport_listen.substr(colon + 1);
    const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    DI_CHECK(ec == std::errc() && end == port_text.data() + port_text.size() && port >= 0 && port <= 65535,
             "--kv-transport-address '{}': bad port", c.kv_transport_listen);
    p.kv_export_server = std::make_unique<UcxKvServer>(p.kv_tiers->export_pool(), p.kv_tiers->fingerprint(), host,
                                                       static_cast<uint16_t>(port));
    const std::string& advertised = c.kv_transport_advertise_host.empty() ? host : c.kv_transport_advertise_host;
    p.kv_tiers->set_export_source(format_kv_source_address(advertised, p.kv_export_server->port()));
    log_info("kv transport: decode engines fetch this engine's KV from {}", p.kv_tiers->export_source());
  }
  if (c.kv_transport_fetch) {
    p.kv_tiers->set_remote_fetcher(std::make_unique<UcxKvClient>(), c.kv_transport_peers);
    log_info("kv transport: fetching prompts' KV over UCX from engines on {}", fmt::join(c.kv_transport_peers, ", "));
  }
}

void build_kv_tiers(EngineParts& p) {
  const EngineConfig& c = p.config;
  // A tensor-parallel follower's slice of the host tier follows rank 0's
  // copies (follow_steps); it has no tiers of its own.
  if (c.tensor_parallel_size > 1 && c.dist.rank % c.tensor_parallel_size != 0) return;
  const bool ucx = !c.kv_transport_listen.empty() || c.kv_transport_fetch;
  const bool shared = c.kv_shared_pool_bytes > 0 || c.kv_import_shared || ucx;
  if (c.kv_offloading_bytes == 0 && c.kv_cache_dir.empty() && !shared) return;
  DI_CHECK(c.enable_prefix_caching, "--kv-offloading-size, --kv-cache-dir and --kv-transport need prefix caching "
                                    "(drop --no-enable-prefix-caching)");
  DI_CHECK(c.kv_cache_ttl_s >= 0, "--kv-cache-ttl must not be negative, got {}", c.kv_cache_ttl_s);
  const KvCacheSpec& spec = p.kv->spec();
  const KvLayout& layout = p.kv->layout();
  std::string layout_text = fmt::format("kv {} page {} layers {} heads {} dim {} latent {} slots {} groups", dtype_name(spec.dtype),
                                        spec.page_size, spec.n_layers, spec.n_heads_kv, spec.head_dim,
                                        spec.latent_v_dim, layout.slots_per_block);
  for (const KvGroup& g : layout.groups) layout_text += fmt::format(" [w{}:{}]", g.window, g.layers.size());
  KvTierOptions o;
  o.host_bytes = c.kv_offloading_bytes;
  o.dir = c.kv_cache_dir;
  o.disk_bytes = c.kv_cache_dir_bytes;
  o.default_ttl_s = c.kv_cache_ttl_s;
  o.groups_per_block_index = static_cast<int32_t>(p.kv_manager->tier_groups().size());
  o.shared_pool_bytes = c.kv_shared_pool_bytes;
  o.import_shared = c.kv_import_shared;
  // Blocks other processes read name the weights too.
  o.fingerprint =
      c.kv_cache_dir.empty() && !shared ? layout_text : kv_cache_fingerprint(c.model_path, layout_text);
  p.kv_tiers = std::make_unique<KvTiers>(*p.backend, *p.kv, std::move(o));
  p.kv_manager->set_tier_link(p.kv_tiers.get());
  build_kv_transport(p);
}

// Draft-model and MTP speculation work: rank 0 alone proposes, with the
// draft model or MTP layer whole on its device (draft_model_proposer.cpp,
// mtp_proposer.h), and the verify steps reach the other ranks as any step.
// The host KV tier works: rank 0 decides its copies and the other ranks make
// them on their slices (kv/tiers/kv_tier_followers.h).
void check_tensor_parallel_limits(const EngineConfig& c) {
  DI_CHECK(c.kv_cache_dir.empty() && c.kv_shared_pool_bytes == 0 && !c.kv_import_shared &&
               c.kv_transport_listen.empty() && !c.kv_transport_fetch,
           "--tensor-parallel-size {}: the disk tier and the KV transports (--kv-cache-dir, --kv-transport) "
           "do not hold every rank's slice of the cache yet; --kv-offloading-size (host memory) does",
           c.tensor_parallel_size);
}

// Speculation of every method works: a rank's draft model or MTP layer runs
// whole on that rank (no experts spread, no collectives), so its forwards
// need no alignment; the verify steps are voted steps like any other.
void check_data_parallel_limits(const EngineConfig& c) {
  DI_CHECK(c.kv_transport_listen.empty() && !c.kv_transport_fetch,
           "--data-parallel-size {}: --kv-transport serves one engine per node; run one engine per rank behind "
           "`deepinfer router` instead",
           c.data_parallel_size);
}

// The ranks of --tensor-parallel-size x --data-parallel-size, one process
// each, joined through the launcher's rendezvous: global rank g is
// tensor-parallel rank g % tp of data-parallel rank g / tp.
//  - tp > 1: each data-parallel rank's tensor-parallel group, its control
//    channel (step plans) and device group (the model's collectives);
//  - dp > 1, on each data-parallel rank's first tensor-parallel rank (the one
//    that runs the engine): the data-parallel group, its vote, and with
//    expert parallelism the MoE layers' group;
//  - tp > 1 and dp > 1 with expert parallelism, on every rank: the MoE
//    layers' group of all ranks (each tensor-parallel group a token group in
//    it, model/expert_parallel.h). Followers join it after their
//    tensor-parallel group, first ranks after the data-parallel group: every
//    rank joins the groups in one order, so no join waits on another.
TensorParallel build_rank_group(EngineParts& p) {
  EngineConfig& c = p.config;
  const DistConfig& d = c.dist;
  const int tp = c.tensor_parallel_size, dp = c.data_parallel_size;
  if (tp <= 1 && dp <= 1 && d.world_size <= 1) return {};
  DI_CHECK(d.world_size == tp * dp,
           "--tensor-parallel-size {} x --data-parallel-size {} make {} ranks, but the launcher started {} "
           "(WORLD_SIZE or equivalent): one process per rank",
           tp, dp, tp * dp, d.world_size);
  if (tp > 1) check_tensor_parallel_limits(c);
  if (dp > 1) check_data_parallel_limits(c);
  const auto t0 = std::chrono::steady_clock::now();
  const std::shared_ptr<gloo::rendezvous::Store> store = open_rendezvous_store(d);
  const GlooTransport transport = gloo_transport_for(d);
  const int tp_rank = d.rank % tp, dp_rank = d.rank / tp;
  TensorParallel result;
  if (tp > 1) {
    const std::string suffix = dp > 1 ? fmt::format(".dp{}", dp_rank) : std::string();
    p.control_group = std::make_unique<GlooCommunicator>(store, "control" + suffix, tp_rank, tp, d.timeout, transport);
    p.device_group = make_device_communicator(*p.backend, d, *p.control_group, "tp" + suffix);
    log_info("engine: tensor-parallel rank {} of {}{} (local rank {}), {} collectives, joined through {} in {:.2f} s",
             tp_rank, tp, dp > 1 ? fmt::format(" of data-parallel rank {}", dp_rank) : std::string(), d.local_rank,
             p.device_group->name(), d.init_method, seconds_since(t0));
    result = TensorParallel{tp_rank, tp, p.device_group.get()};
    if (c.enable_expert_parallel) result.experts = p.device_group.get();
  }
  // The experts over every rank of both kinds of group.
  auto join_experts_of_all_ranks = [&] {
    p.experts_group = std::make_unique<GlooCommunicator>(store, "experts", d.rank, d.world_size, d.timeout, transport);
    p.experts_device_group = make_device_communicator(*p.backend, d, *p.experts_group, "ep");
    result.experts = p.experts_device_group.get();
  };
  const bool experts_of_all_ranks = c.enable_expert_parallel && tp > 1 && dp > 1;
  if (dp <= 1 || tp_rank != 0) {
    if (experts_of_all_ranks) join_experts_of_all_ranks();
    return result;
  }
  p.data_parallel_group = std::make_unique<GlooCommunicator>(store, "data_parallel", dp_rank, dp, d.timeout, transport);
  const bool votes = c.enable_expert_parallel || !c.data_parallel_independent_replicas;
  if (votes) {
    p.vote_channel = std::make_unique<GlooVoteChannel>(*p.data_parallel_group);
    p.group_vote = std::make_unique<GroupVote>(c.data_parallel_vote, *p.vote_channel);
  }
  if (c.enable_expert_parallel) {
    if (experts_of_all_ranks) {
      join_experts_of_all_ranks();
    } else {
      p.device_group = make_device_communicator(*p.backend, d, *p.data_parallel_group, "ep");
      result.experts = p.device_group.get();
    }
    // The experts move between ranks at a step boundary every rank reaches
    // at the same point: a step is finished before the next is planned.
    c.zero_overhead_scheduling = false;
  }
  const GroupVoteConfig& v = c.data_parallel_vote;
  log_info("engine: data-parallel rank {} of {} (local rank {}), joined through {} in {:.2f} s; {}; {}", dp_rank, dp,
           d.local_rank, d.init_method, seconds_since(t0),
           c.enable_expert_parallel
               ? fmt::format("experts spread over {} ({} collectives)",
                             experts_of_all_ranks ? fmt::format("all {} ranks", d.world_size) : std::string("the group"),
                             result.experts->name())
           : tp > 1 ? fmt::format("the model over {} tensor-parallel ranks", tp)
                                    : std::string("the whole model on every rank"),
           !votes ? std::string("the ranks step independently")
                  : fmt::format("group vote {} (every {} step(s){})", vote_mode_name(v.mode),
                                v.mode == VoteMode::All ? v.all_interval_steps : v.any_interval_steps,
                                v.mode == VoteMode::All ? fmt::format(", at most {} steps' wait", v.all_max_wait_steps)
                                                        : std::string()));
  return result;
}

void build_expert_load(EngineParts& p, RunnerLimits& limits) {
  const EngineConfig& config = p.config;
  // Expert parallelism balances for real: the placement's ranks are the group's.
  const int32_t ep_ranks = std::max(config.tensor_parallel_size, 1) * std::max(config.data_parallel_size, 1);
  const bool ep = config.enable_expert_parallel && ep_ranks > 1;
  DI_CHECK(!ep || config.eplb_ep_size == 0 || config.eplb_ep_size == ep_ranks,
           "--eplb-ep-size {} with --enable-expert-parallel over {} ranks: leave it out (the ranks are the group's)",
           config.eplb_ep_size, ep_ranks);
  if (config.eplb_ep_size == 0 && config.routing_trace_path.empty() && !ep) return;
  const ModelConfig& mc = p.model->config();
  std::vector<int32_t> moe_layers;
  for (int32_t i = 0; i < mc.n_layers; ++i) {
    if (mc.is_moe(i)) moe_layers.push_back(i);
  }
  DI_CHECK(!moe_layers.empty() && mc.moe.n_experts > 0,
           "--eplb-ep-size, --routing-trace and --enable-expert-parallel need a mixture-of-experts model; {} has "
           "no MoE layer",
           mc.arch);
  moe::ExpertLoadMonitorOptions eo;
  eo.num_ranks = ep ? ep_ranks : config.eplb_ep_size;
  eo.ranks_are_real = ep;
  eo.schedule = {config.eplb_window_steps, config.eplb_interval_steps, config.eplb_redundant_slots};
  eo.trace_path = config.routing_trace_path;
  p.expert_load = std::make_unique<moe::ExpertLoadMonitor>(moe_layers, mc.moe.n_experts, eo);
  limits.count_experts = true;
  if (p.expert_load->balancing()) {
    log_info("engine: EPLB statistics for {} MoE layers x {} experts, {} {} ranks: window {} steps, "
             "re-placement every {} steps, {} redundant slot(s) per rank",
             moe_layers.size(), mc.moe.n_experts, ep ? "placed over" : "simulating", eo.num_ranks,
             eo.schedule.window_steps,
             eo.schedule.interval_steps, eo.schedule.redundant_slots_per_rank);
  }
  if (!eo.trace_path.empty()) {
    log_info("engine: routing trace of {} MoE layers to {} (one file per layer)", moe_layers.size(),
             moe::ExpertLoadMonitor::trace_file(eo.trace_path, moe_layers.front()));
  }
}

}  // namespace

EngineParts build_engine(EngineConfig config) {
  EngineParts p;
  if (config.max_num_batched_tokens == 0) config.max_num_batched_tokens = default_max_num_batched_tokens(config.device);
  DI_CHECK(config.block_size > 0 && config.block_size <= 1024, "--block-size {} out of range", config.block_size);
  DI_CHECK(config.max_num_seqs > 0, "--max-num-seqs must be positive");
  DI_CHECK(config.max_num_batched_tokens > 0, "--max-num-batched-tokens must be positive");
  p.config = std::move(config);
  const EngineConfig& c = p.config;
  BackendOptions options;
  options.num_threads = c.num_threads;
  options.batch_invariant = c.batch_invariant;
  options.device_index = c.dist.local_rank;
  options.fp8_weights = parse_weight_quantization(c.quantization) == WeightQuantization::Fp8;
  p.backend = create_backend(c.device, options);
  log_info("engine: backend {}", p.backend->name());
  const TensorParallel tp = build_rank_group(p);
  p.model = LoadedModel::open(c.model_path, *p.backend, tp, parse_weight_quantization(c.quantization));
  const ModelConfig& mc = p.model->config();

  const auto t0 = std::chrono::steady_clock::now();
  if (!c.tokenizer_path.empty()) {
    p.tokenizer = Tokenizer::from_file(c.tokenizer_path);
  } else if (p.model->gguf()) {
    p.tokenizer = Tokenizer::from_gguf(*p.model->gguf());
  } else {
    p.tokenizer = Tokenizer::from_file(c.model_path);
  }
  log_info("engine: tokenizer with {} tokens loaded in {:.2f} s", p.tokenizer->vocab_size(), seconds_since(t0));
  if (!c.chat_template.empty()) {
    // A readable file's contents, else the text itself (vLLM's --chat-template).
    std::string source = c.chat_template;
    std::error_code ec;
    if (c.chat_template.find("{%") == std::string::npos && c.chat_template.find("{{") == std::string::npos) {
      DI_CHECK(std::filesystem::is_regular_file(c.chat_template, ec),
               "--chat-template '{}' is neither a file nor a Jinja template", c.chat_template);
      source = read_regular_file(c.chat_template, 1 << 20);
    }
    p.tokenizer->set_chat_template(std::move(source));
    log_info("engine: chat template from --chat-template ({} bytes)", p.tokenizer->chat_template().size());
  }

  p.max_model_len = c.max_model_len > 0 ? c.max_model_len : std::min(mc.max_position, 8192);
  DI_CHECK(p.max_model_len > 1, "--max-model-len must be at least 2");
  DI_CHECK(mc.max_position <= 0 || p.max_model_len <= mc.max_position,
           "--max-model-len {} exceeds the model's context length {}", p.max_model_len, mc.max_position);
  log_info("engine: per-step token budget {} (--max-num-batched-tokens{}), up to {} sequences",
           c.max_num_batched_tokens, c.cost_model ? ", chunks sized by the cost model" : "", c.max_num_seqs);

  build_kv_cache(p);
  build_kv_tiers(p);
  SchedulerConfig sc;
  sc.capacity.max_num_seqs = c.max_num_seqs;
  // MTP's draft chain writes KV past the verified positions.
  if (c.speculative.method == spec::SpecMethod::Mtp) sc.capacity.lookahead_slots = c.speculative.num_speculative_tokens;
  sc.planner.max_num_batched_tokens = c.max_num_batched_tokens;
  sc.planner.cost_model = c.cost_model;
  sc.planner.step_time_budget_s = c.step_time_budget_s;
  p.scheduler = std::make_unique<Scheduler>(sc, *p.kv_manager);

  RunnerLimits limits;
  limits.max_num_batched_tokens = c.max_num_batched_tokens;
  limits.max_num_seqs = c.max_num_seqs;
  limits.max_model_len = p.max_model_len;
  limits.max_rows_per_seq = rows_per_seq(c);
  // Expert-parallel MoE layers read their routing on the host mid-forward
  // (model/expert_parallel.h): such a step cannot be captured.
  limits.use_graphs = !c.enforce_eager && !tp.expert_parallel();
  limits.graph_shapes_eager = c.graph_shapes_eager;
  limits.hidden_states = c.speculative.method == spec::SpecMethod::Mtp;
  build_expert_load(p, limits);
  RunnerRank rank;
  if (tp.active()) {
    rank.device_group = p.device_group.get();
    rank.samples = tp.rank == 0;
    if (tp.rank == 0) {
      // Followers hear from rank 0 well within their timeout, even when idle.
      const auto beat = std::max<std::chrono::milliseconds>(std::chrono::seconds(1), c.dist.timeout / 4);
      p.step_broadcaster = std::make_unique<StepBroadcaster>(*p.control_group, beat);
      rank.publisher = p.step_broadcaster.get();
      if (p.kv_tiers) p.kv_tiers->set_followers(p.step_broadcaster.get());
    }
  }
  // A device's collectives can wait forever for a dead peer: steps are
  // waited for with the group's timeout (dist/step_wait.h). Host groups
  // (Gloo) time out in the calls themselves.
  if (p.backend->device().type != DeviceType::CPU) {
    for (Communicator* g : {tp.active() ? tp.comm : nullptr, tp.experts}) {
      if (g != nullptr && std::find(rank.watched_groups.begin(), rank.watched_groups.end(), g) ==
                              rank.watched_groups.end()) {
        rank.watched_groups.push_back(g);
      }
    }
    rank.step_timeout = c.dist.timeout;
  }
  p.runner = std::make_unique<ModelRunner>(p.model->model(), *p.backend, *p.kv, limits, rank);
  log_info("engine: {} step loop{}", c.zero_overhead_scheduling ? "pipelined (zero-overhead)" : "synchronous",
           p.backend->supports_graphs() && limits.use_graphs ? ", CUDA graphs for decode" : "");
  return p;
}

int run_follower_rank(EngineConfig config) {
  DI_CHECK(config.dist.rank % std::max(config.tensor_parallel_size, 1) != 0,
           "run_follower_rank on the first rank of a tensor-parallel group");
  EngineParts p = build_engine(std::move(config));
  try {
    follow_steps(*p.runner, *p.backend, *p.kv, *p.control_group);
  } catch (const CommError& e) {
    log_error("tensor parallel: rank {}: {}", p.config.dist.rank, e.what());
    return 1;
  }
  return 0;
}

}  // namespace deepinfer
