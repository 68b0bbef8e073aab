#include "runner/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "dist/communicator.h"
#include "dist/step_wait.h"
#include "ops/ops.h"
#include "runner/model_runner_internal.h"

namespace deepinfer {

using runner_detail::round_up;

namespace {

// First size of the penalty entry buffers; they double when a step needs more.
constexpr int64_t kMinPenaltyEntries = 4096;

// Padded batch sizes captured as graphs: fine steps where batches are small,
// coarser ones above (a padded row costs little next to the weight reads).
std::vector<int32_t> graph_sizes_up_to(int32_t limit) {
  std::vector<int32_t> sizes;
  for (int32_t b : {1, 2, 4}) sizes.push_back(b);
  for (int32_t b = 8; b <= 64; b += 8) sizes.push_back(b);
  for (int32_t b = 80; b <= 256; b += 16) sizes.push_back(b);
  for (int32_t b = 288; b <= 512; b += 32) sizes.push_back(b);
  std::erase_if(sizes, [&](int32_t b) { return b > limit; });
  return sizes;
}

}  // namespace

int32_t max_sampling_rows(int32_t max_num_batched_tokens, int32_t max_num_seqs, int32_t max_rows_per_seq) {
  return static_cast<int32_t>(
      std::min<int64_t>(max_num_batched_tokens, int64_t{max_num_seqs} * std::max(max_rows_per_seq, 1)));
}

ModelRunner::ModelRunner(Model& model, Backend& backend, KvStorage& kv, RunnerLimits limits, RunnerRank rank)
    : model_(model), backend_(backend), kv_(kv), limits_(limits), rank_(rank) {
  DI_CHECK(limits.max_num_batched_tokens > 0 && limits.max_num_seqs > 0 && limits.max_model_len > 0,
           "ModelRunner: invalid limits");
  const int32_t T = limits.max_num_batched_tokens, S = limits.max_num_seqs;
  max_rows_ = max_sampling_rows(T, S, limits.max_rows_per_seq);
  // A page can appear in many sequences' tables (a shared prefix is listed by
  // every sequence that reads it), so the bound is per sequence: at most the
  // pages of its longest context plus lookahead slots; padding sequences list
  // the padding page once each.
  const int64_t pages_per_seq =
      (int64_t{limits.max_model_len} + limits.max_rows_per_seq + kv.page_size() - 1) / kv.page_size() + 1;
  const int64_t max_pages = int64_t{S} * pages_per_seq + 2 * S;
  DI_CHECK(max_pages < (int64_t{1} << 30), "ModelRunner: {} sequences of up to {} tokens need {} page-table entries "
           "per step; lower --max-num-seqs or --max-model-len", S, limits.max_model_len, max_pages);
  max_kv_pages_ = static_cast<int32_t>(max_pages);
  num_groups_ = kv.layout().num_groups();
  sampled_ints_ = round_up(int64_t{kSlots} * max_rows_, 16);
  staging_ints_ = layout(T, S, max_rows_).groups.back().kv_pages + max_kv_pages_;
  const int64_t vocab = model.config().vocab_size;
  mask_words_ = static_cast<int32_t>((vocab + 31) / 32);
  step_dev_ = Buffer(backend, static_cast<size_t>(sampled_ints_ + staging_ints_) * 4);
  token_ids_dev_ = Buffer(backend, static_cast<size_t>(T) * 4);
  logits_dev_ = Buffer(backend, static_cast<size_t>(max_rows_) * static_cast<size_t>(vocab) * 4);
  model.reserve(T, max_rows_);
  for (Slot& s : slots_) {
    s.staging = static_cast<int32_t*>(backend.allocate_host(static_cast<size_t>(staging_ints_) * 4));
    s.tokens_host = static_cast<int32_t*>(backend.allocate_host(static_cast<size_t>(max_rows_) * 4));
    s.start = backend.create_event();
    s.end = backend.create_event();
  }
  // Graphs run steps that sample every token (graph_shape).
  if ((limits.use_graphs && backend.supports_graphs()) || limits.graph_shapes_eager) {
    graph_sizes_ = graph_sizes_up_to(std::min(T, S));
  }
  if (limits.hidden_states) {
    const int64_t hidden = model.config().hidden_size;
    const size_t bytes = static_cast<size_t>(T) * row_bytes(backend.activation_dtype(), hidden);
    hidden_in_dev_ = Buffer(backend, bytes);
    hidden_out_dev_ = Buffer(backend, bytes);
    for (Buffer& b : hidden_slots_dev_) b = Buffer(backend, bytes);
    // Padding tokens of a graph batch read rows no plan wrote: zeros, not
    // whatever the allocation held (a NaN there would reach the MoE router).
    const std::vector<uint8_t> zeros(bytes, 0);
    backend.copy(hidden_in_dev_.view(DType::U8, {static_cast<int64_t>(bytes)}),
                 Tensor(const_cast<uint8_t*>(zeros.data()), DType::U8, {static_cast<int64_t>(bytes)}));
  }
  if (limits.sampled_probs) {
    probs_dev_ = Buffer(backend, static_cast<size_t>(max_rows_) * 4);
    for (Slot& s : slots_) {
      s.probs_host = static_cast<float*>(backend.allocate_host(static_cast<size_t>(max_rows_) * 4));
    }
  }
  if (limits.count_experts) {
    const ModelConfig& c = model.config();
    for (int i = 0; i < c.n_layers; ++i) moe_layers_ += c.is_moe(i) ? 1 : 0;
    DI_CHECK(moe_layers_ > 0 && c.moe.n_experts > 0,
             "expert-load statistics need a mixture-of-experts model; {} has no MoE layer", c.arch);
    count_cells_ = int64_t{moe_layers_} * c.moe.n_experts;
    const size_t bytes = static_cast<size_t>(count_cells_) * 4;
    counts_dev_ = Buffer(backend, bytes);
    counts_zero_host_ = static_cast<int32_t*>(backend.allocate_host(bytes));
    std::memset(counts_zero_host_, 0, bytes);
    for (Slot& s : slots_) s.counts_host = static_cast<int32_t*>(backend.allocate_host(bytes));
  }
}

ModelRunner::~ModelRunner() {
  try {
    backend_.synchronize();
  } catch (...) {
    // Destruction must not throw; a device error here has nobody left to report to.
  }
  graphs_.clear();
  for (Slot& s : slots_) {
    backend_.deallocate_host(s.staging);
    backend_.deallocate_host(s.tokens_host);
    backend_.deallocate_host(s.logits_host);
    backend_.deallocate_host(s.counts_host);
    backend_.deallocate_host(s.probs_host);
    backend_.deallocate_host(s.penalties_host);
    backend_.deallocate_host(s.mask_rows_host);
    backend_.deallocate_host(s.masks_host);
  }
  backend_.deallocate_host(counts_zero_host_);
}

void ModelRunner::ensure_penalty_capacity(int slot, int64_t entries) {
  Slot& s = slots_[slot];
  const int64_t want = std::max(entries, kMinPenaltyEntries);
  if (want > penalty_entries_capacity_) {
    // Steps in flight may still read the old device list.
    for (Slot& other : slots_) {
      if (other.in_flight) other.end->synchronize();
    }
    penalty_entries_capacity_ = std::max(want, penalty_entries_capacity_ * 2);
    penalty_entries_dev_ = Buffer();
    penalty_entries_dev_ = Buffer(backend_, static_cast<size_t>(penalty_entries_capacity_) * sizeof(PenaltyEntry));
  }
  if (want <= s.penalty_entries_capacity) return;
  // The slot is not in flight, so nothing copies from its old staging.
  backend_.deallocate_host(s.penalties_host);
  s.penalties_host = nullptr;
  s.penalty_entries_capacity = std::max(want, s.penalty_entries_capacity * 2);
  s.penalties_host = static_cast<PenaltyEntry*>(
      backend_.allocate_host(static_cast<size_t>(s.penalty_entries_capacity) * sizeof(PenaltyEntry)));
}

void ModelRunner::ensure_logits_capacity(int slot, int64_t rows) {
  Slot& s = slots_[slot];
  if (rows <= s.logits_rows_capacity) return;
  const int64_t vocab = model_.config().vocab_size;
  const int64_t want = std::min<int64_t>(max_rows_, std::max(rows, s.logits_rows_capacity * 2));
  backend_.deallocate_host(s.logits_host);
  s.logits_host = nullptr;
  s.logits_host = static_cast<float*>(backend_.allocate_host(static_cast<size_t>(want * vocab) * 4));
  s.logits_rows_capacity = want;
}

void ModelRunner::ensure_mask_capacity(int slot, int64_t rows) {
  Slot& s = slots_[slot];
  if (s.mask_rows_host == nullptr) {
    s.mask_rows_host = static_cast<int32_t*>(backend_.allocate_host(static_cast<size_t>(max_rows_) * 4));
  }
  if (mask_rows_dev_.size() == 0) mask_rows_dev_ = Buffer(backend_, static_cast<size_t>(max_rows_) * 4);
  const int64_t want = std::min<int64_t>(max_rows_, std::max<int64_t>(rows, 8));
  const size_t row_bytes = static_cast<size_t>(mask_words_) * 4;
  if (rows > masks_capacity_) {
    // Steps in flight may still read the old device masks.
    for (Slot& other : slots_) {
      if (other.in_flight) other.end->synchronize();
    }
    masks_capacity_ = std::min<int64_t>(max_rows_, std::max(want, masks_capacity_ * 2));
    masks_dev_ = Buffer();
    masks_dev_ = Buffer(backend_, static_cast<size_t>(masks_capacity_) * row_bytes);
  }
  if (rows <= s.masks_capacity) return;
  backend_.deallocate_host(s.masks_host);
  s.masks_host = nullptr;
  s.masks_capacity = std::min<int64_t>(max_rows_, std::max(want, s.masks_capacity * 2));
  s.masks_host = static_cast<int32_t*>(backend_.allocate_host(static_cast<size_t>(s.masks_capacity) * row_bytes));
}

int32_t ModelRunner::num_masked_rows(int slot) const {
  DI_CHECK(slot >= 0 && slot < kSlots, "ModelRunner: no slot {}", slot);
  const Slot& s = slots_[slot];
  return s.awaiting_masks ? s.tail.num_masks : 0;
}

std::span<int32_t> ModelRunner::token_mask(int slot, int32_t i) {
  DI_CHECK(slot >= 0 && slot < kSlots && slots_[slot].awaiting_masks && i >= 0 && i < slots_[slot].tail.num_masks,
           "ModelRunner: slot {} has no token mask {}", slot, i);
  return {slots_[slot].masks_host + static_cast<size_t>(i) * mask_words_, static_cast<size_t>(mask_words_)};
}

void ModelRunner::finish_launch(int slot) {
  DI_CHECK(slot >= 0 && slot < kSlots && slots_[slot].awaiting_masks,
           "ModelRunner: slot {} is not waiting for token masks", slot);
  enqueue_sampling(slot);
}

int ModelRunner::launch(const StepPlan& plan) {
  DI_CHECK(!plan.empty() && plan.num_tokens() <= limits_.max_num_batched_tokens &&
               static_cast<int32_t>(plan.seqs.size()) <= limits_.max_num_seqs && plan.num_rows() <= max_rows_,
           "step of {} tokens / {} sequences / {} rows exceeds the runner's limits", plan.num_tokens(),
           plan.seqs.size(), plan.num_rows());
  // The other ranks must run this forward with us (its collectives).
  if (rank_.publisher) rank_.publisher->publish(plan);
  const GraphShape shape = graph_shape(plan);
  return launch_staged(plan, shape, shape.seqs > 0 && !limits_.graph_shapes_eager);
}

int ModelRunner::launch_padding() {
  if (rank_.publisher) rank_.publisher->publish_padding();
  StepPlan plan;
  plan.page_size = kv_.page_size();
  plan.groups.resize(static_cast<size_t>(num_groups_));  // empty tables
  return launch_staged(plan, GraphShape{1, 1}, false);
}

int ModelRunner::launch_staged(const StepPlan& plan, GraphShape shape, bool graph) {
  for (const Slot& other : slots_) {
    DI_CHECK(!other.awaiting_masks, "ModelRunner: a launched step still waits for its token masks (finish_launch)");
  }
  const int slot = next_slot_;
  Slot& s = slots_[slot];
  DI_CHECK(!s.in_flight, "ModelRunner: more than {} steps in flight; wait() for the oldest first", kSlots);
  const Staged st = stage(slot, plan, shape);
  const int64_t vocab = model_.config().vocab_size;
  const auto n_rows = static_cast<int64_t>(plan.num_rows());
  int64_t n_copied = 0;
  for (const PlannedRow& r : plan.rows) n_copied += r.sampling.copy_logits ? 1 : 0;
  ensure_logits_capacity(slot, n_copied);

  s.start->record();
  // The fixed-size inputs and the first group's pages in one copy; every
  // further group's pages in one more.
  const GroupLayout& first = st.l.groups.front();
  const int64_t used_ints = first.kv_pages + st.pages.front();
  backend_.copy_async(step_dev_.view(DType::I32, {used_ints}, static_cast<size_t>(sampled_ints_) * 4),
                      Tensor(s.staging, DType::I32, {used_ints}));
  for (int32_t g = 1; g < num_groups_; ++g) {
    const int64_t at = st.l.groups[static_cast<size_t>(g)].kv_pages, n = st.pages[static_cast<size_t>(g)];
    if (n == 0) continue;
    backend_.copy_async(step_dev_.view(DType::I32, {n}, static_cast<size_t>(sampled_ints_ + at) * 4),
                        Tensor(s.staging + at, DType::I32, {n}));
  }
  // Input ids: host-known tokens and in-flight ones from earlier steps' samples.
  const Tensor sources = step_dev_.view(DType::I32, {sampled_ints_ + st.l.gather, 1});
  const Tensor gather_index =
      step_dev_.view(DType::I32, {st.tokens}, static_cast<size_t>(sampled_ints_ + st.l.gather) * 4);
  ops::gather_rows(backend_, sources, gather_index, token_ids_dev_.view(DType::I32, {st.tokens, 1}));
  constexpr auto kEntryBytes = static_cast<int64_t>(sizeof(PenaltyEntry));
  const Tensor penalty_entries =
      st.penalty_entries >= 0 ? penalty_entries_dev_.view(DType::U8, {st.penalty_entries, kEntryBytes}) : Tensor();
  if (st.penalty_entries > 0) {
    backend_.copy_async(penalty_entries, Tensor(s.penalties_host, DType::U8, {st.penalty_entries, kEntryBytes}));
  }
  const Tensor counts_flat = count_cells_ > 0 ? counts_dev_.view(DType::I32, {count_cells_}) : Tensor();
  if (counts_flat.defined()) backend_.copy_async(counts_flat, Tensor(counts_zero_host_, DType::I32, {count_cells_}));

  const int32_t graph_kv_len = graph ? graph_kv_bucket(st.max_kv) : 0;
  const ForwardInputs in = device_inputs(st, graph_kv_len);
  if (st.hidden_input) {
    const Tensor rows = step_dev_.view(DType::I32, {plan.num_tokens()},
                                       static_cast<size_t>(sampled_ints_ + st.l.hidden_rows) * 4);
    ops::gather_rows(backend_, plan.hidden_source, rows, in.hidden_in.slice_rows(0, plan.num_tokens()));
  }
  const Tensor logits = logits_dev_.view(DType::F32, {st.rows, vocab});
  if (graph) {
    // A graph reads the hidden input or not: a runner's graph steps must all agree.
    DI_CHECK(graphs_hidden_input_ < 0 || graphs_hidden_input_ == (st.hidden_input ? 1 : 0),
             "ModelRunner: graph steps with and without a hidden input");
    graphs_hidden_input_ = st.hidden_input ? 1 : 0;
    const auto key = std::make_tuple(shape.seqs, shape.q, graph_kv_len);
    auto it = graphs_.find(key);
    s.captured = it == graphs_.end();
    s.capture_ms = 0.0;
    if (it == graphs_.end()) {
      const auto capture_start = std::chrono::steady_clock::now();
      backend_.begin_capture();
      try {
        model_.forward(in, kv_, logits);
      } catch (...) {
        try {
          backend_.end_capture();
        } catch (...) {
          // The original error is the one worth reporting.
        }
        throw;
      }
      it = graphs_.emplace(key, backend_.end_capture()).first;
      s.capture_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - capture_start).count();
    }
    it->second->replay();
  } else {
    s.captured = false;
    model_.forward(in, kv_, logits);
  }

  if (limits_.hidden_states) {
    // The forward wrote at a fixed address (graphs); this step's copy lives
    // in its slot until the slot is reused.
    const int64_t n = plan.num_tokens();
    backend_.copy(hidden_states(slot).slice_rows(0, n), in.hidden_out.slice_rows(0, n));
  }
  Slot::Tail& tail = s.tail;
  tail.params_at = st.l.params;
  tail.penalty_params_at = st.l.penalty_params;
  tail.penalty_entries = st.penalty_entries;
  tail.tokens = st.tokens;
  tail.copy_rows.clear();
  tail.num_masks = 0;
  for (int32_t j = 0; j < static_cast<int32_t>(n_rows); ++j) {
    const RowSampling& rs = plan.rows[static_cast<size_t>(j)].sampling;
    if (rs.copy_logits) tail.copy_rows.push_back(j);
    if (rs.token_mask) ++tail.num_masks;
  }
  if (tail.num_masks > 0) {
    ensure_mask_capacity(slot, tail.num_masks);
    int32_t k = 0;
    for (int32_t j = 0; j < static_cast<int32_t>(n_rows); ++j) {
      if (plan.rows[static_cast<size_t>(j)].sampling.token_mask) s.mask_rows_host[k++] = j;
    }
  }
  s.in_flight = true;
  s.graph = graph;
  s.padded_seqs = st.padded_seqs;
  s.num_rows = static_cast<int32_t>(n_rows);
  s.num_copied = static_cast<int32_t>(n_copied);
  s.sequence = ++launches_;
  s.prev_slot = last_launched_slot_;
  last_launched_slot_ = slot;
  next_slot_ = (slot + 1) % kSlots;
  // The rows' token masks come from the host: the rest waits for finish_launch().
  s.awaiting_masks = tail.num_masks > 0;
  if (!s.awaiting_masks) enqueue_sampling(slot);
  return slot;
}

void ModelRunner::enqueue_sampling(int slot) {
  Slot& s = slots_[slot];
  const Slot::Tail& tail = s.tail;
  s.awaiting_masks = false;
  const int64_t vocab = model_.config().vocab_size;
  const int64_t n_rows = s.num_rows;
  const Tensor logits = logits_dev_.view(DType::F32, {std::max<int64_t>(n_rows, 1), vocab});
  if (n_rows > 0) {
    const Tensor sampled = step_dev_.view(DType::I32, {n_rows}, static_cast<size_t>(slot) * max_rows_ * 4);
    const Tensor params = step_dev_.view(DType::U8, {n_rows, static_cast<int64_t>(sizeof(SamplingRowParams))},
                                         static_cast<size_t>(sampled_ints_ + tail.params_at) * 4);
    if (tail.penalty_entries >= 0) {
      constexpr auto kEntryBytes = static_cast<int64_t>(sizeof(PenaltyEntry));
      const Tensor penalty_entries = penalty_entries_dev_.view(DType::U8, {tail.penalty_entries, kEntryBytes});
      const Tensor penalty_params =
          step_dev_.view(DType::U8, {n_rows, static_cast<int64_t>(sizeof(PenaltyRowParams))},
                         static_cast<size_t>(sampled_ints_ + tail.penalty_params_at) * 4);
      ops::apply_penalties(backend_, logits.slice_rows(0, n_rows), penalty_params, penalty_entries,
                           token_ids_dev_.view(DType::I32, {tail.tokens}));
    }
    if (tail.num_masks > 0) {
      const int64_t m = tail.num_masks;
      const Tensor rows = mask_rows_dev_.view(DType::I32, {m});
      const Tensor masks = masks_dev_.view(DType::I32, {m, mask_words_});
      backend_.copy_async(rows, Tensor(s.mask_rows_host, DType::I32, {m}));
      backend_.copy_async(masks, Tensor(s.masks_host, DType::I32, {m, mask_words_}));
      ops::apply_token_bitmask(backend_, logits.slice_rows(0, n_rows), masks, rows);
    }
    if (rank_.samples) {
      ops::sample(backend_, logits.slice_rows(0, n_rows), params, sampled);
      backend_.copy_async(Tensor(s.tokens_host, DType::I32, {n_rows}), sampled);
      if (limits_.sampled_probs) {
        const Tensor probs = probs_dev_.view(DType::F32, {n_rows});
        ops::token_probs(backend_, logits.slice_rows(0, n_rows), sampled, probs);
        backend_.copy_async(Tensor(s.probs_host, DType::F32, {n_rows}), probs);
      }
      // The host reads -1 for a row that could not be sampled (a numerical
      // fault); the next step, already queued behind this one, reads a valid id.
      ops::sanitize_ids(backend_, sampled, model_.config().vocab_size);
      for (size_t k = 0; k < tail.copy_rows.size(); ++k) {
        backend_.copy_async(Tensor(s.logits_host + static_cast<int64_t>(k) * vocab, DType::F32, {1, vocab}),
                            logits.slice_rows(tail.copy_rows[k], 1));
      }
    }
    // Rank 0's tokens to every rank (only rank 0 saw the penalties and masks).
    if (rank_.device_group) rank_.device_group->broadcast(sampled, 0);
  }
  if (count_cells_ > 0) {
    backend_.copy_async(Tensor(s.counts_host, DType::I32, {count_cells_}), counts_dev_.view(DType::I32, {count_cells_}));
  }
  s.end->record();
}

Tensor ModelRunner::hidden_states(int slot) const {
  DI_CHECK(limits_.hidden_states && slot >= 0 && slot < kSlots, "ModelRunner: no hidden states for slot {}", slot);
  return hidden_slots_dev_[static_cast<size_t>(slot)].view(
      backend_.activation_dtype(), {limits_.max_num_batched_tokens, model_.config().hidden_size});
}

StepResults ModelRunner::wait(int slot) {
  DI_CHECK(slot >= 0 && slot < kSlots && slots_[slot].in_flight, "ModelRunner: slot {} has no step in flight", slot);
  Slot& s = slots_[slot];
  DI_CHECK(!s.awaiting_masks, "ModelRunner: the step in slot {} still waits for its token masks", slot);
  wait_for_step(*s.end, rank_.watched_groups, rank_.step_timeout);
  s.in_flight = false;
  StepResults r;
  r.tokens = std::span<const int32_t>(s.tokens_host, static_cast<size_t>(s.num_rows));
  const auto vocab = static_cast<size_t>(model_.config().vocab_size);
  r.logits = std::span<const float>(s.logits_host, static_cast<size_t>(s.num_copied) * vocab);
  r.graph = s.graph;
  r.padded_seqs = s.padded_seqs;
  r.captured = s.captured;
  r.capture_ms = s.capture_ms;
  if (count_cells_ > 0) r.expert_counts = std::span<const int32_t>(s.counts_host, static_cast<size_t>(count_cells_));
  if (limits_.sampled_probs) r.probs = std::span<const float>(s.probs_host, static_cast<size_t>(s.num_rows));
  r.device_ms = s.end->elapsed_ms_since(*s.start);
  if (s.prev_slot >= 0) {
    const Slot& prev = slots_[s.prev_slot];
    // Still the step launched just before (not yet reused): it ended before this one started.
    if (prev.sequence + 1 == s.sequence && !prev.in_flight) r.idle_ms_before = s.start->elapsed_ms_since(*prev.end);
  }
  return r;
}

}  // namespace deepinfer
