// Tensor parallelism of a decoder (Megatron-style): every rank holds a slice
// of the attention heads, of the feed-forward width (dense, each routed
// expert's and the shared expert's) and of the vocabulary, and the partial
// results meet in one all-reduce after each attention and feed-forward
// block and one all-gather of the logits.
//
// TpShardPlan says which slice a rank holds; ShardedWeightSource hands the
// model exactly those slices of the checkpoint's tensors, so a model built on
// it sees a smaller model (TpShardPlan::local_config) and only the rank's
// bytes are read from the file and uploaded.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "model/model_config.h"
#include "model/weight_source.h"

namespace deepinfer {

class Communicator;

struct TensorParallel {
  int rank = 0;
  int size = 1;
  Communicator* comm = nullptr;  // the device group's communicator; set when size > 1
  // Expert parallelism (--enable-expert-parallel): the group the routed
  // experts are spread over, whole (expert_parallel.h), instead of every rank
  // holding a slice of every expert's width. Null: no expert parallelism.
  //  - tensor-parallel only: the tensor-parallel group itself (comm);
  //  - data-parallel attention (--data-parallel-size, size stays 1, every
  //    weight but the experts whole): the data-parallel ranks, each bringing
  //    its own requests' tokens;
  //  - both: every rank of every data-parallel rank's tensor-parallel group.
  Communicator* experts = nullptr;
  bool active() const { return size > 1; }
  bool expert_parallel() const { return experts != nullptr; }
};

struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const IndexRange&) const = default;
};

// Part `part` of [0, n) cut into `parts` contiguous ranges of whole `unit`s
// (n a multiple of unit), as even as possible: the first ranges take the
// units left over.
IndexRange split_range(int64_t n, int parts, int part, int64_t unit);

struct TpShardPlan {
  int rank = 0;
  int size = 1;
  IndexRange q_heads;
  // The checkpoint's KV head behind each of the rank's KV heads. A KV head is
  // replicated on every rank whose query heads read it; when a rank's query
  // heads do not split into whole groups of one KV head each, every query
  // head gets its own copy of its KV head (a group of one), so the attention
  // kernels keep their uniform query-to-KV mapping.
  std::vector<int32_t> kv_heads;
  IndexRange ffn;         // dense feed-forward width
  IndexRange expert_ffn;  // each routed expert's width
  IndexRange shared_ffn;  // the shared expert's width
  IndexRange vocab;       // rows of the embedding and output projection
  int64_t vocab_max = 0;  // the largest rank's vocabulary slice
  int64_t vocab_size = 0;

  // `ffn_unit`: the column granularity of the down projections (the block
  // size of quantised weights), which the width slices must respect.
  bool expert_parallel = false;  // routed and shared experts stay whole

  static TpShardPlan make(const ModelConfig& full, int rank, int size, int64_t ffn_unit,
                          bool expert_parallel = false);
  // The model this rank runs: its heads and widths; the vocabulary stays whole
  // (the logits are gathered).
  ModelConfig local_config(const ModelConfig& full) const;
  IndexRange vocab_of(int r) const;
};

// Rows (or columns) per attention head of the cut projections: q (and the
// output projection's columns) and KV for a plain decoder; for multi-head
// latent attention the q rows (nope + rope), kv_b rows (nope + v) and the
// output projection's columns (v).
struct HeadSizes {
  int64_t q = 0;
  int64_t kv = 0;
  int64_t out = 0;
  static HeadSizes of(const ModelConfig& config);
};

// The rank's slices of the wrapped source's tensors, by canonical name. A
// slice of whole outer rows is a view of the file; any other is copied once
// into memory owned here. Tensors every rank holds whole (norms, routers)
// pass through; biases added after the all-reduce are rank 0's alone (zeros
// elsewhere).
class ShardedWeightSource final : public WeightSource {
 public:
  ShardedWeightSource(const WeightSource& inner, TpShardPlan plan, HeadSizes heads);
  std::optional<Tensor> find(std::string_view canonical_name) const override;

 private:
  // t restricted to the union of `ranges` along dimension `dim`.
  Tensor slice(std::string_view name, const Tensor& t, int dim, const std::vector<IndexRange>& ranges) const;
  Tensor zeros_like(const Tensor& t) const;
  std::vector<IndexRange> head_rows(const std::vector<int32_t>& heads, int64_t per_head) const;

  const WeightSource& inner_;
  TpShardPlan plan_;
  HeadSizes heads_;
  mutable std::deque<std::vector<uint8_t>> owned_;
};

// The column granularity of the checkpoint's down projections (1 for plain
// dtypes, the block size of block-quantised ones).
int64_t tp_ffn_unit(const WeightSource& source, const ModelConfig& config);

// The pieces of a tensor-parallel forward both decoder classes use.
class TpForward {
 public:
  TpForward() = default;
  TpForward(TensorParallel tp, TpShardPlan plan) : tp_(tp), plan_(std::move(plan)) {}
  bool active() const { return tp_.active(); }
  const TensorParallel& tp() const { return tp_; }
  const TpShardPlan& plan() const { return plan_; }
  // Rows of the embedding for the rank's vocabulary slice, the ranks' rows
  // added up (on one rank: the plain lookup).
  void embed(Backend& backend, const Tensor& table, const Tensor& ids, int64_t vocab, Tensor out) const;
  // Sums the ranks' partial [n, hidden] outputs in place (no-op on one rank).
  void reduce(Tensor t) const;
  // Bytes of f32 scratch logits() needs for `rows` logit rows.
  size_t logits_scratch_floats(int64_t rows) const;
  // The rank's vocabulary slice of the output projection, everyone's gathered
  // into logits f32[rows, vocab] (contiguous); the scratch is
  // logits_scratch_floats(rows) floats of `workspace` from `offset`.
  void logits(Backend& backend, const Tensor& h_rows, const Tensor& output, Tensor logits, const Buffer& workspace,
              size_t offset) const;

 private:
  TensorParallel tp_;
  TpShardPlan plan_;
};

// One model's rank under tensor parallelism (tp.active()): its plan and the
// source of its slices; `config`, the full model's, becomes the rank's.
struct RankShard {
  TpForward forward;
  std::unique_ptr<ShardedWeightSource> source;
};
RankShard shard_for_rank(ModelConfig& config, const WeightSource& full, TensorParallel tp);

}  // namespace deepinfer
