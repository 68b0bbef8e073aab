// CudaBackend: the Backend interface on one NVIDIA GPU (built for sm_90a).
//
// Activations and the KV cache are bf16 (activation_dtype); the kernels also
// accept f32 and f16 activations so the op tests can compare them with the CPU
// reference at f32 precision. Weights are bf16/f16 (f32 with f32 activations);
// GGUF block-quantised weights are rejected with a clear error.
//
// Everything runs on one stream. Matrix products go to cuBLAS (f32
// accumulation); the other ops are our own kernels (cuda_elementwise.cu,
// cuda_attention.cu). Ops never allocate in steady state: cuBLAS gets a fixed
// workspace, attention a fixed split-KV workspace, and the rare dtype
// conversions a grow-only scratch buffer. Errors found in the data on the
// device (token ids, KV slots, page ids out of range) set a device error word
// that synchronize() turns into a deepinfer::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"

struct CUstream_st;
struct cublasContext;

namespace deepinfer::cuda {

class UnsplitGemm;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options = {}, int device_index = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::cuda(device_); }
  std::string name() const override { return "cuda"; }
  DType activation_dtype() const override { return DType::BF16; }

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) override;
  void copy(Tensor dst, const Tensor& src) override;
  void synchronize() override;

  // Asynchronous steps (cuda_stream.cpp).
  void* allocate_host(size_t bytes) override;
  void deallocate_host(void* ptr) override;
  std::optional<SharedDeviceMemory> allocate_shared_device(size_t bytes) override;
  void free_shared_device(void* ptr) override;
  void* open_shared_device(std::span<const std::byte> handle) override;
  void close_shared_device(void* ptr) override;
  void copy_async(Tensor dst, const Tensor& src) override;
  void copy_blocks_async(std::span<const BlockCopy> blocks, size_t dst_pitch, size_t src_pitch, size_t width,
                         size_t rows) override;
  void copy_rows_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                       size_t rows) override;
  std::unique_ptr<CopyStream> create_copy_stream() override;
  std::unique_ptr<DeviceEvent> create_event() override;
  bool supports_graphs() const override { return true; }
  bool stacks_projections() const override { return true; }
  void begin_capture() override;
  std::unique_ptr<OpGraph> end_capture() override;
  std::optional<DeviceMemoryInfo> memory_info() const override;
  bool capturing() const { return capturing_; }

  void embedding(const Tensor& table, const Tensor& ids, int64_t first_id, int64_t vocab, Tensor out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset, Tensor out) override;
  void add_rms_norm(Tensor residual, const Tensor& x, const Tensor& weight, float eps, float weight_offset,
                    Tensor out) override;
  void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out) override;
  bool stores_fp8_weights() const override { return fp8_weights_; }
  void rope(Tensor q, Tensor k, const Tensor& positions, const RopeParams& params) override;
  void linear_batched(const Tensor& x, const Tensor& weight, Tensor out) override;
  void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, KvCacheLayer cache) override;
  bool rope_store_kv(Tensor q, Tensor k, const Tensor& v, const Tensor& positions, const RopeParams& params,
                     const Tensor& slot_mapping, KvCacheLayer cache, const QkNorm* norm) override;
  bool mla_rope_store_kv(const Tensor& q_pe, Tensor q_rot, Tensor kv, int64_t lora, const Tensor& kv_norm, float eps,
                         const Tensor& positions, const RopeParams& params, const Tensor& slot_mapping,
                         KvCacheLayer cache) override;
  void attention(const Tensor& q, const KvCacheLayer& cache, const AttentionMetadata& meta,
                 const AttentionParams& params, Tensor out) override;
  void gated_activation(const Tensor& gate, const Tensor& up, Activation act, Tensor out) override;
  bool gated_linear(const Tensor& x, const Tensor& w_gate_up, Activation act, Tensor out) override;
  void add(const Tensor& a, const Tensor& b, Tensor out) override;
  void scale(const Tensor& x, float factor, Tensor out) override;
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor out) override;
  void sanitize_ids(Tensor ids, int64_t limit) override;
  void zero_rows_at_position(Tensor x, const Tensor& positions, int32_t position) override;
  void token_probs(const Tensor& logits, const Tensor& tokens, Tensor out) override;
  // Mixture of experts (cuda_moe.cu): routing and grouped expert GEMMs, no host syncs.
  void moe_route(const Tensor& logits, const MoeRouteParams& params, Tensor expert_ids, Tensor expert_weights) override;
  size_t moe_workspace_bytes(int64_t n_tokens, int top_k, const MoeExpertWeights& w) const override;
  void moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& expert_weights, const MoeExpertWeights& w,
                   Activation act, bool accumulate, Tensor workspace, Tensor out) override;
  // Expert-load counts (cuda_expert_counts.cu).
  void count_experts(const Tensor& expert_ids, const Tensor& token_slots, Tensor counts) override;
  void sample(const Tensor& logits, const Tensor& params, Tensor tokens) override;
  // logit_bias, min_tokens mask and penalties (cuda_penalties.cu).
  void apply_penalties(Tensor logits, const Tensor& params, const Tensor& entries,
                       const Tensor& pending_tokens) override;
  // Grammar token masks (cuda_token_mask.cu); a bad row index is skipped on
  // the device and raised by synchronize().
  void apply_token_bitmask(Tensor logits, const Tensor& bitmask, const Tensor& rows) override;

  int num_sms() const { return num_sms_; }
  CUstream_st* stream() const { return stream_; }

  // Split-KV partials of one attention call must fit here; the plan caps the
  // number of splits accordingly.
  static constexpr size_t kAttentionWorkspaceBytes = size_t{64} << 20;
  static constexpr size_t kAttentionWorkspaceBytesInvariant = size_t{256} << 20;
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

 private:
  void check_launch(const char* op);
  void linear_fp8(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out);
  void copy_fp8_rows(Tensor dst, const Tensor& src);
  void* scratch(size_t bytes);
  // A grow-only device buffer of at least `bytes` (grown by half at least;
  // refused while a graph is captured).
  void* grow_buffer(void*& buf, size_t& have, size_t bytes, const char* what);

  int device_ = 0;
  int num_sms_ = 0;
  // DEEPINFER_BATCH_INVARIANT=1: every linear through the tensor-core GEMM
  // (no gemv, no cuBLAS), one attention kernel for every query count and no
  // split-KV, the grouped MoE GEMMs at every batch size.
  bool batch_invariant_ = false;
  bool bi_wgmma_ = false;  // the mode's larger products through wgmma (the probe passed; DEEPINFER_BI_WGMMA=0: never)
  // The mode's larger products through cuBLASLt without a split of k (the
  // probe passed; DEEPINFER_BI_CUBLAS=0: never), cuda_unsplit_gemm.h.
  bool bi_cublas_ = false;
  // The mode's attention key segment (DEEPINFER_BI_ATTENTION_SEGMENT; 0, the
  // default: none, so no split-KV).
  int bi_segment_keys_ = 0;
  std::unique_ptr<UnsplitGemm> unsplit_gemm_;
  static constexpr int64_t kBiCublasMinRows = 33;
  bool probe_unsplit_gemm();
  bool warned_variant_linear_ = false;
  // --quantization fp8 with DEEPINFER_CUDA_FP8=1: the FP8 gemv and the
  // dequantising prefill path (cuda_gemv_fp8.cu); opt-in until they match
  // their goals (docs/quantization.md).
  bool fp8_weights_ = false;
  static constexpr int64_t kFp8DequantChunkBytes = int64_t{64} << 20;
  void* fp8_dequant_ = nullptr;  // grow-only: FP8 weight rows as bf16/f16 for cuBLAS
  size_t fp8_dequant_bytes_ = 0;
  // DEEPINFER_FP8_GEMM=1: batches past the FP8 gemv, up to kFp8GemmMaxRows,
  // through the FP8 x FP8 tensor-core GEMM (cuda_gemm_fp8.cu): at 128 and 256
  // rows it ran at 0.96-2.3x the speed of dequantising for cuBLAS
  // (bench_fp8_gemm, H100); beyond, it lost (its 350 TFLOP/s against cuBLAS's
  // bf16 rate). Opt-in until a decode run of the engine measures it.
  bool fp8_gemm_ = false;
  static constexpr int64_t kFp8GemmMaxRows = 256;
  void* fp8_gemm_scratch_ = nullptr;  // grow-only: the activations' e4m3 codes and scales
  size_t fp8_gemm_scratch_bytes_ = 0;
  size_t max_smem_per_block_ = 0;
  CUstream_st* stream_ = nullptr;
  cublasContext* cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  float* attention_workspace_ = nullptr;
  size_t attention_workspace_bytes_ = 0;
  uint32_t* error_word_ = nullptr;  // device
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  bool capturing_ = false;
};

}  // namespace deepinfer::cuda
