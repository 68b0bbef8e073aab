// The Engine's statistics, integrity check and timing steps (a step of a
// given shape on an idle engine, for the cost model and the KV tiers).
#include <chrono>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine_internal.h"
#include "engine/speculator.h"
#include "kv/kv_cache_manager.h"
#include "kv/prefix_cache.h"
#include "kv/tiers/kv_tiers.h"
#include "kv/transport/ucx_kv_server.h"
#include "moe/expert_load_monitor.h"
#include "runner/model_runner.h"
#include "sched/scheduler.h"
#include "sched/step_plan.h"
#include "structured/grammar_compiler.h"

namespace deepinfer {

std::optional<RequestSummary> Engine::summary(uint64_t request_id) const {
  auto it = finished_summaries_.find(request_id);
  if (it == finished_summaries_.end()) return std::nullopt;
  return it->second;
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  s.num_running = parts_.scheduler->num_running();
  s.num_waiting = parts_.scheduler->num_waiting();
  s.kv_usage = parts_.kv_manager->pool().usage();
  if (const PrefixCache* pc = parts_.kv_manager->prefix_cache()) {
    s.prefix_query_tokens = pc->stats().query_tokens;
    s.prefix_hit_tokens = pc->stats().hit_tokens;
  }
  if (speculator_) {
    s.speculative = true;
    s.spec = speculator_->stats();
  }
  if (parts_.kv_tiers) {
    s.kv_tiers = true;
    s.tier_hit_tokens = parts_.kv_manager->tier_hit_tokens();
    s.tiers = parts_.kv_tiers->stats();
  }
  if (parts_.kv_export_server) {
    s.kv_export_server = true;
    s.kv_export = parts_.kv_export_server->stats();
  }
  if (grammar_ready_.load(std::memory_order_acquire)) {
    // Made once under grammar_once_, possibly on a server thread; the flag
    // publishes it.
    const structured::GrammarCompiler::Stats g = grammar_compiler_->stats();
    s.grammar_compiled = g.compiled;
    s.grammar_cache_hits = g.cache_hits;
    s.grammar_invalid = g.failed;
    s.grammar_timed_out = g.timed_out;
  }
  if (parts_.expert_load && parts_.expert_load->balancing()) {
    s.eplb = true;
    s.moe_lb = parts_.expert_load->moe_lb();
    s.moe_lb_contiguous = parts_.expert_load->moe_lb_contiguous();
    s.eplb_replacements = parts_.expert_load->replacements();
  }
  return s;
}

void Engine::check_integrity() const {
  const KvCacheManager& kv = *parts_.kv_manager;
  kv.check_integrity();
  if (requests_.empty()) {
    // Blocks still referenced by a step in flight or by a tier's copy are not leaked.
    const BlockPool& pool = kv.pool();
    const auto pending = static_cast<int32_t>(kv.num_deferred_blocks() + kv.num_tier_held_blocks());
    DI_CHECK(pool.num_free() + pending == pool.num_blocks(), "KV leak: {} of {} blocks still held with no request in flight",
             pool.num_blocks() - pool.num_free() - pending, pool.num_blocks());
  }
}

double Engine::time_step(int32_t num_seqs, int32_t num_new_tokens, int32_t num_cached_tokens, int32_t rows_per_seq) {
  DI_CHECK(requests_.empty(), "a timing step needs an idle engine");
  const int32_t total = num_new_tokens + num_cached_tokens;
  const int32_t bs = parts_.config.block_size;
  DI_CHECK(num_seqs > 0 && num_seqs <= parts_.config.max_num_seqs && num_new_tokens > 0 && num_cached_tokens >= 0 &&
               int64_t{num_seqs} * num_new_tokens <= parts_.config.max_num_batched_tokens &&
               total <= parts_.max_model_len && rows_per_seq >= 1 && rows_per_seq <= num_new_tokens,
           "timing step of {} x ({} new + {} cached) tokens with {} rows each is out of range", num_seqs,
           num_new_tokens, num_cached_tokens, rows_per_seq);
  // Full-length tables in every group, filled straight from the pool: the
  // step only needs pages to write and read, not a sequence's bookkeeping.
  BlockPool& pool = parts_.kv_manager->pool();
  const int32_t n_groups = parts_.kv_manager->layout().num_groups();
  const int32_t pages = (total + bs - 1) / bs;
  auto blocks = pool.allocate(pages * n_groups * num_seqs);
  DI_CHECK(blocks.has_value(), "KV cache too small for a timing step of {} x {} tokens", num_seqs, total);
  StepPlan plan;
  plan.page_size = bs;
  plan.groups.resize(static_cast<size_t>(n_groups));
  for (int32_t s = 0; s < num_seqs; ++s) {
    plan.seqs.push_back({static_cast<uint64_t>(s), num_cached_tokens, num_new_tokens, s * num_new_tokens,
                         s * rows_per_seq, rows_per_seq});
    for (int32_t j = 0; j < rows_per_seq; ++j) {
      PlannedRow row{s, num_new_tokens - rows_per_seq + j, {}};
      row.sampling.params.temperature = 0.0f;
      plan.rows.push_back(row);
    }
    for (int32_t g = 0; g < n_groups; ++g) {
      GroupPages& gp = plan.groups[static_cast<size_t>(g)];
      const auto first = blocks->begin() + (int64_t{s} * n_groups + g) * pages;
      gp.pages.insert(gp.pages.end(), first, first + pages);
      gp.indptr.push_back(static_cast<int32_t>(gp.pages.size()));
      gp.first_pos.push_back(0);
    }
  }
  plan.tokens.assign(static_cast<size_t>(num_seqs) * num_new_tokens, TokenSource::host(0));
  const auto t0 = std::chrono::steady_clock::now();
  parts_.runner->wait(parts_.runner->launch(plan));
  parts_.backend->synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  pool.release(*blocks);
  return secs;
}

}  // namespace deepinfer
