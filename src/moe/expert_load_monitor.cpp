#include "moe/expert_load_monitor.h"

#include "core/error.h"
#include "core/logging.h"

namespace deepinfer::moe {

ExpertLoadMonitor::ExpertLoadMonitor(std::vector<int32_t> moe_layers, int32_t num_experts,
                                     ExpertLoadMonitorOptions options)
    : moe_layers_(std::move(moe_layers)), num_experts_(num_experts), options_(std::move(options)) {
  DI_CHECK(!moe_layers_.empty(), "expert-load statistics need at least one MoE layer");
  DI_CHECK(num_experts_ >= 1, "expert-load statistics: {} experts", num_experts_);
  DI_CHECK(options_.num_ranks >= 0, "--eplb-ep-size must be >= 0, got {}", options_.num_ranks);
  options_.schedule.validate();
  if (balancing()) {
    DI_CHECK(num_experts_ % options_.num_ranks == 0, "--eplb-ep-size {} must divide the model's {} experts",
             options_.num_ranks, num_experts_);
    contiguous_ = contiguous_placement(num_experts_, options_.num_ranks);
    stats_.reserve(moe_layers_.size());
    for (size_t k = 0; k < moe_layers_.size(); ++k) {
      stats_.emplace_back(num_experts_, options_.schedule);
      stats_.back().set_placement(contiguous_);
    }
  }
  if (!options_.trace_path.empty()) {
    for (int32_t layer : moe_layers_) {
      const std::string file = trace_file(options_.trace_path, layer);
      auto out = std::make_unique<std::ofstream>(file, std::ios::trunc);
      DI_CHECK(out->good(), "cannot write routing trace '{}'", file);
      *out << "# deepinfer routing trace: one step per line, tokens per expert (" << num_experts_
           << " experts), model layer " << layer << "\n";
      traces_.push_back(std::move(out));
    }
  }
  row_.resize(static_cast<size_t>(num_experts_));
}

ExpertLoadMonitor::~ExpertLoadMonitor() = default;

std::string ExpertLoadMonitor::trace_file(const std::string& path, int32_t layer) {
  std::string stem = path;
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".csv") == 0) stem.resize(stem.size() - 4);
  return stem + ".layer" + std::to_string(layer) + ".csv";
}

void ExpertLoadMonitor::record_step(std::span<const int32_t> counts) {
  const size_t experts = static_cast<size_t>(num_experts_);
  DI_CHECK(counts.size() == moe_layers_.size() * experts,
           "expert-load statistics: {} counts for {} layers x {} experts", counts.size(), moe_layers_.size(), experts);
  for (size_t i = 0; i < counts.size(); ++i) {
    DI_CHECK(counts[i] >= 0, "expert-load statistics: negative count {} (MoE layer {}, expert {})", counts[i],
             moe_layers_[i / experts], i % experts);
  }
  ++steps_;
  for (size_t k = 0; k < moe_layers_.size(); ++k) {
    const std::span<const int32_t> layer = counts.subspan(k * experts, experts);
    if (!traces_.empty()) {
      std::ofstream& out = *traces_[k];
      for (size_t e = 0; e < experts; ++e) out << (e ? "," : "") << layer[e];
      out << '\n';
      DI_CHECK(out.good(), "failed writing routing trace '{}'", trace_file(options_.trace_path, moe_layers_[k]));
    }
    if (balancing()) {
      row_.assign(layer.begin(), layer.end());
      stats_[k].record_step(row_);
    }
  }
  if (!balancing() || !stats_.front().replacement_due()) return;
  EplbConfig topology;
  topology.num_ranks = options_.num_ranks;
  const double before = moe_lb();
  for (ExpertLoadStats& s : stats_) s.rebalance(topology);
  ++replacements_;
  log_info("eplb: step {}: re-placement {}: experts of {} MoE layers over {} {} ranks ({} redundant slot(s) "
           "each) from a {}-step window: moe_lb {:.3f} -> {:.3f} (contiguous {:.3f}){}",
           steps_, replacements_, stats_.size(), options_.num_ranks, options_.ranks_are_real ? "expert-parallel" : "simulated",
           options_.schedule.redundant_slots_per_rank, stats_.front().window_fill(), before, moe_lb(),
           moe_lb_contiguous(), options_.ranks_are_real ? "" : "; simulation: no weights move");
}

double ExpertLoadMonitor::mean_window_lb(bool contiguous) const {
  if (!balancing() || steps_ == 0) return 1.0;
  double sum = 0.0;
  for (const ExpertLoadStats& s : stats_) {
    sum += contiguous ? moe::moe_lb(s.window_load(), contiguous_) : s.window_moe_lb();
  }
  return sum / static_cast<double>(stats_.size());
}

double ExpertLoadMonitor::moe_lb() const { return mean_window_lb(false); }

double ExpertLoadMonitor::moe_lb_contiguous() const { return mean_window_lb(true); }

}  // namespace deepinfer::moe
