// CpuBackend: the reference implementation of the Backend interface on the
// host. Activations and the KV cache are f32; weights may be f32, f16, bf16 or
// any GGUF block-quantised type with kernels in quants.h.
//
// Scratch memory (quantised activations, dequantised weight tiles, rope tables)
// lives in per-thread buffers that grow the first time a larger shape is seen
// and are reused afterwards, so the ops do not allocate in steady state.
// A CpuBackend runs one op at a time: callers must not invoke ops on the same
// instance from several threads concurrently.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"

namespace deepinfer::cpu {

struct VecKernels;

// A 64-byte aligned byte buffer that only grows.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ScratchBuffer(ScratchBuffer&& other) noexcept;
  ScratchBuffer& operator=(ScratchBuffer&&) = delete;

  template <typename T = void>
  T* get(size_t bytes) {
    if (bytes > capacity_) grow(bytes);
    return static_cast<T*>(data_);
  }

 private:
  void grow(size_t bytes);
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options = {});
  ~CpuBackend() override;

  Device device() const override { return Device::cpu(); }
  std::string name() const override { return "cpu"; }
  bool reads_host_weights() const override { return true; }
  // f16 by default: half the bytes decode attention reads, as llama.cpp keeps it.
  DType default_kv_dtype() const override { return DType::F16; }
  bool supports_kv_dtype(DType t) const override {
    return t == DType::F32 || t == DType::F16 || t == DType::F8E4M3;
  }
  int num_threads() const { return pool_.num_threads(); }

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) override;
  void copy(Tensor dst, const Tensor& src) override;
  void synchronize() override {}

  void embedding(const Tensor& table, const Tensor& ids, int64_t first_id, int64_t vocab, Tensor out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset,
                Tensor out) override;
  void add_rms_norm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                    float weight_offset, Tensor out) override;
  void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out) override;
  void rope(Tensor q, Tensor k, const Tensor& positions, const RopeParams& params) override;
  void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
                KvCacheLayer cache) override;
  void attention(const Tensor& q, const KvCacheLayer& cache, const AttentionMetadata& meta,
                 const AttentionParams& params, Tensor out) override;
  void gated_activation(const Tensor& gate, const Tensor& up, Activation act, Tensor out) override;
  void add(const Tensor& a, const Tensor& b, Tensor out) override;
  void scale(const Tensor& x, float factor, Tensor out) override;
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor out) override;
  void sanitize_ids(Tensor ids, int64_t limit) override;
  void zero_rows_at_position(Tensor x, const Tensor& positions, int32_t position) override;
  void token_probs(const Tensor& logits, const Tensor& tokens, Tensor out) override;
  void moe_route(const Tensor& logits, const MoeRouteParams& params, Tensor expert_ids,
                 Tensor expert_weights) override;
  size_t moe_workspace_bytes(int64_t n_tokens, int top_k, const MoeExpertWeights& w) const override;
  void moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& expert_weights,
                   const MoeExpertWeights& w, Activation act, bool accumulate, Tensor workspace,
                   Tensor out) override;
  void count_experts(const Tensor& expert_ids, const Tensor& token_slots, Tensor counts) override;
  void sample(const Tensor& logits, const Tensor& params, Tensor tokens) override;
  // cpu_penalties.cpp
  void apply_penalties(Tensor logits, const Tensor& params, const Tensor& entries,
                       const Tensor& pending_tokens) override;
  // cpu_token_mask.cpp
  void apply_token_bitmask(Tensor logits, const Tensor& bitmask, const Tensor& rows) override;

  // Up to this many rows of x, linear runs as matrix-vector products on the
  // quantised activations; above it, as dequantised tiles times OpenBLAS sgemm.
  // Chosen by bench/bench_ops: with 2 threads gemv stays ahead of the tiled
  // sgemm up to n = 16 for q4_1, q8_0 and f32 weights.
  static constexpr int64_t kLinearGemvMaxRows = 16;
  // The same limit where the AMX tile GEMM takes the larger products. Its cost
  // is nearly flat up to one 16-row activation tile (each weight tile is
  // expanded and scaled per 32-element group whatever the row count), while
  // the gemv's grows by a whole decode step per row: SmolLM2 Q4_1 on 2 cores,
  // `deepinfer bench -b 1 -p 128 --verify-curve 7`, a step of 1/2/3/6 tokens
  // took 9/15/23/46 ms through the gemv and 9/23/18-24/20-28 ms with the
  // tiles from 2 rows up. So from 3 rows on (a batch of 3, or one sequence
  // verifying 2 drafts) the tiles win.
  static constexpr int64_t kLinearGemvMaxRowsAmx = 2;
  // The limit that applies to products with `weight`.
  int64_t linear_gemv_max_rows(DType weight) const;
  // Always take the per-row (gemv) path so results do not depend on batch size.
  bool batch_invariant_ = false;

 private:
  void linear_gemv(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out);
  void linear_gemm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out);

  bool use_amx_ = false;  // active_isa() is AMX: prefill GEMMs on quantised weights use its tiles
  const VecKernels* vec_ = nullptr;  // attention and element-wise loops of active_isa()
  ThreadPool pool_;
  std::vector<ScratchBuffer> thread_scratch_;  // one per pool thread
  ScratchBuffer act_scratch_;                  // activations converted for `dot`, shared
};

}  // namespace deepinfer::cpu
