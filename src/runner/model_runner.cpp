#include "runner/model_runner.h"

#include "core/error.h"
#include "sched/request.h"

namespace deepinfer {

ModelRunner::ModelRunner(Model& model, Backend& backend, KvStorage& kv, RunnerLimits limits)
    : model_(model), backend_(backend), kv_(kv), limits_(limits) {
  const size_t T = static_cast<size_t>(limits.max_num_batched_tokens);
  const size_t S = static_cast<size_t>(limits.max_num_seqs);
  const size_t P = static_cast<size_t>(kv.num_pages());
  const size_t V = static_cast<size_t>(model.config().vocab_size);
  const size_t R = std::min(T, S);
  token_ids_dev_ = Buffer(backend, T * 4);
  positions_dev_ = Buffer(backend, T * 4);
  slots_dev_ = Buffer(backend, T * 4);
  logit_rows_dev_ = Buffer(backend, R * 4);
  q_indptr_dev_ = Buffer(backend, (S + 1) * 4);
  kv_indptr_dev_ = Buffer(backend, (S + 1) * 4);
  // A page can appear in several sequences' tables (shared prefixes).
  kv_pages_dev_ = Buffer(backend, (P * 2 + S) * 4);
  kv_last_len_dev_ = Buffer(backend, S * 4);
  kv_start_pos_dev_ = Buffer(backend, S * 4);
  logits_dev_ = Buffer(backend, R * V * 4);
  model.reserve(limits.max_num_batched_tokens, static_cast<int32_t>(R));
}

void ModelRunner::build_inputs(const ScheduledBatch& batch) {
  const int32_t ps = kv_.page_size();
  token_ids_.clear();
  positions_.clear();
  slots_.clear();
  logit_rows_.clear();
  q_indptr_.assign(1, 0);
  kv_indptr_.assign(1, 0);
  kv_pages_.clear();
  kv_last_len_.clear();
  kv_start_pos_.clear();
  max_q_len_ = max_kv_len_ = 0;
  for (const ScheduledSeq& s : batch.seqs) {
    const Request& r = *s.request;
    const int32_t kv_len = s.start + s.num_tokens;
    const int32_t n_pages = (kv_len + ps - 1) / ps;
    DI_CHECK(n_pages <= static_cast<int32_t>(r.block_ids.size()),
             "request {} needs {} KV pages but holds {}", r.id(), n_pages, r.block_ids.size());
    // Pages released by a sliding window are left out; the first listed page
    // then starts at position kv_start_pos.
    const int32_t first_page = std::min(r.num_released_blocks, n_pages - 1);
    for (int32_t p = s.start; p < kv_len; ++p) {
      token_ids_.push_back(r.token_at(p));
      positions_.push_back(p);
      slots_.push_back(r.block_ids[p / ps] * ps + p % ps);
    }
    if (s.sample) logit_rows_.push_back(static_cast<int32_t>(token_ids_.size()) - 1);
    q_indptr_.push_back(static_cast<int32_t>(token_ids_.size()));
    kv_pages_.insert(kv_pages_.end(), r.block_ids.begin() + first_page, r.block_ids.begin() + n_pages);
    kv_indptr_.push_back(static_cast<int32_t>(kv_pages_.size()));
    kv_last_len_.push_back(kv_len - (n_pages - 1) * ps);
    kv_start_pos_.push_back(first_page * ps);
    max_q_len_ = std::max(max_q_len_, s.num_tokens);
    max_kv_len_ = std::max(max_kv_len_, kv_len);
  }
}

namespace {

Tensor upload(Backend& backend, const Buffer& dev, std::vector<int32_t>& host) {
  const int64_t n = static_cast<int64_t>(host.size());
  DI_CHECK(static_cast<size_t>(n) * 4 <= dev.size(), "step input of {} entries exceeds its buffer", n);
  Tensor d = dev.view(DType::I32, {n});
  if (n > 0) backend.copy(d, Tensor(host.data(), DType::I32, {n}));
  return d;
}

}  // namespace

Tensor ModelRunner::execute(const ScheduledBatch& batch) {
  DI_CHECK(batch.num_tokens <= limits_.max_num_batched_tokens &&
               static_cast<int32_t>(batch.seqs.size()) <= limits_.max_num_seqs,
           "batch of {} tokens / {} sequences exceeds the runner's limits", batch.num_tokens,
           batch.seqs.size());
  build_inputs(batch);
  ForwardInputs in;
  in.num_tokens = static_cast<int32_t>(token_ids_.size());
  in.token_ids = upload(backend_, token_ids_dev_, token_ids_);
  in.positions = upload(backend_, positions_dev_, positions_);
  in.slot_mapping = upload(backend_, slots_dev_, slots_);
  in.logit_rows = upload(backend_, logit_rows_dev_, logit_rows_);
  in.attention.num_seqs = static_cast<int32_t>(batch.seqs.size());
  in.attention.max_q_len = max_q_len_;
  in.attention.max_kv_len = max_kv_len_;
  in.attention.q_indptr = upload(backend_, q_indptr_dev_, q_indptr_);
  in.attention.kv_indptr = upload(backend_, kv_indptr_dev_, kv_indptr_);
  in.attention.kv_page_indices = upload(backend_, kv_pages_dev_, kv_pages_);
  in.attention.kv_last_page_len = upload(backend_, kv_last_len_dev_, kv_last_len_);
  in.attention.kv_start_pos = upload(backend_, kv_start_pos_dev_, kv_start_pos_);

  const int64_t rows = static_cast<int64_t>(logit_rows_.size());
  const int64_t vocab = model_.config().vocab_size;
  Tensor logits = logits_dev_.view(DType::F32, {std::max<int64_t>(rows, 1), vocab}).slice_rows(0, rows);
  model_.forward(in, kv_, logits);
  if (backend_.device().type == DeviceType::CPU) return logits;
  logits_host_.resize(static_cast<size_t>(rows * vocab));
  Tensor host(logits_host_.data(), DType::F32, {rows, vocab});
  backend_.copy(host, logits);
  backend_.synchronize();
  return host;
}

}  // namespace deepinfer
