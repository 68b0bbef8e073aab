// ModelRunner: turns a scheduled batch into the model's inputs (flat token
// ids, positions, KV slots, CSR page tables), runs the forward pass and returns
// the logits of the rows that sample. Input buffers are sized once; a step
// only writes host staging arrays and copies them to the backend.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "kv/kv_storage.h"
#include "model/model.h"
#include "sched/scheduled_batch.h"

namespace deepinfer {

struct RunnerLimits {
  int32_t max_num_batched_tokens = 2048;
  int32_t max_num_seqs = 256;
};

class ModelRunner {
 public:
  ModelRunner(Model& model, Backend& backend, KvStorage& kv, RunnerLimits limits);

  // Logits f32[rows, vocab] on the host, one row per sequence with `sample`
  // set, in batch order. The view stays valid until the next execute().
  Tensor execute(const ScheduledBatch& batch);

  Model& model() { return model_; }
  const RunnerLimits& limits() const { return limits_; }

 private:
  void build_inputs(const ScheduledBatch& batch);

  Model& model_;
  Backend& backend_;
  KvStorage& kv_;
  RunnerLimits limits_;

  // Host staging, rebuilt each step.
  std::vector<int32_t> token_ids_, positions_, slots_, logit_rows_;
  std::vector<int32_t> q_indptr_, kv_indptr_, kv_pages_, kv_last_len_, kv_start_pos_;
  int32_t max_q_len_ = 0, max_kv_len_ = 0;

  // Backend copies of the staging arrays, and the logits.
  Buffer token_ids_dev_, positions_dev_, slots_dev_, logit_rows_dev_;
  Buffer q_indptr_dev_, kv_indptr_dev_, kv_pages_dev_, kv_last_len_dev_, kv_start_pos_dev_;
  Buffer logits_dev_;
  std::vector<float> logits_host_;
};

}  // namespace deepinfer
