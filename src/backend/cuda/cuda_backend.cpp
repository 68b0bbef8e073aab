#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "backend/cuda/cuda_backend_helpers.h"
#include "backend/cuda/cuda_unsplit_gemm.h"
#include "backend/cuda/cuda_expert_counts.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_penalties.h"
#include "backend/cuda/cuda_sampling.h"
#include "backend/cuda/cuda_token_mask.h"
#include "core/error.h"
#include "core/logging.h"

#include <fmt/ranges.h>

namespace deepinfer::cuda {

using namespace backend_helpers;

namespace {

HeadView heads_of(const Tensor& t) {
  HeadView v;
  if (!t.defined()) return v;
  v.base = static_cast<char*>(t.data());
  v.n = t.size(0);
  v.heads = t.size(1);
  v.dim = t.size(2);
  v.stride0 = t.stride_bytes(0);
  v.stride1 = t.stride_bytes(1);
  return v;
}

CacheView cache_of(const Tensor& t) {
  CacheView v;
  v.base = static_cast<char*>(t.data());
  v.pages = t.size(0);
  v.page_size = t.size(1);
  v.heads = t.size(2);
  v.dim = t.size(3);
  v.stride0 = t.stride_bytes(0);
  v.stride1 = t.stride_bytes(1);
  v.stride2 = t.stride_bytes(2);
  v.fp8 = t.dtype() == DType::F8E4M3;
  return v;
}

// The batch-invariant mode's attention key segment: DEEPINFER_BI_ATTENTION_SEGMENT
// keys (docs/batch_invariance.md), 0 (none: no split-KV) when unset. A bad
// value is an error, not a silent default: it decides the outputs' bits.
int bi_attention_segment_from_env() {
  const char* segment = std::getenv("DEEPINFER_BI_ATTENTION_SEGMENT");
  if (segment == nullptr) return 0;
  const std::string_view text(segment);
  int keys = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), keys);
  DI_CHECK(ec == std::errc() && end == text.data() + text.size() && keys >= 0 && keys <= (1 << 20) &&
               keys % kAttentionSegmentTile == 0,
           "DEEPINFER_BI_ATTENTION_SEGMENT={}: want 0 or a multiple of {} keys up to 1048576 (e.g. {})", text,
           kAttentionSegmentTile, kAttentionSegmentKeys);
  return keys;
}

}  // namespace

CudaBackend::CudaBackend(const BackendOptions& options, int device_index)
    : device_(device_index),
      batch_invariant_(options.batch_invariant),
      bi_segment_keys_(options.batch_invariant ? bi_attention_segment_from_env() : 0) {
  if (options.fp8_weights) {
    const char* opt_in = std::getenv("DEEPINFER_CUDA_FP8");
    DI_CHECK(opt_in != nullptr && std::string_view(opt_in) == "1",
             "--quantization fp8 on CUDA: the FP8 weight kernels do not yet meet their speed goals "
             "(docs/quantization.md); set DEEPINFER_CUDA_FP8=1 to use them (FP8 checkpoints load without the flag, "
             "dequantised to bf16)");
    fp8_weights_ = true;
  }
  const char* fp8_gemm = std::getenv("DEEPINFER_FP8_GEMM");
  fp8_gemm_ = fp8_gemm != nullptr && std::string_view(fp8_gemm) == "1";
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    fail("CUDA backend: no usable CUDA device ({})",
         e != cudaSuccess ? cudaGetErrorString(e) : "none found");
  }
  DI_CHECK(device_index >= 0 && device_index < count, "CUDA device {} out of range ({} devices)", device_index,
           count);
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
  num_sms_ = prop.multiProcessorCount;
  max_smem_per_block_ = prop.sharedMemPerBlockOptin;
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  cublas_ = h;
  check_cublas(cublasSetStream(h, s), "cublasSetStream");
  check_cuda(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes), "cudaMalloc(cuBLAS workspace)");
  check_cublas(cublasSetWorkspace(h, cublas_workspace_, kCublasWorkspaceBytes), "cublasSetWorkspace");
  // Plain f32 products stay f32: no TF32 shortcuts, so f32 op tests match the CPU.
  check_cublas(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  void* ws = nullptr;
  // Attention in key segments keeps every segment's partial of a decode step
  // (batch 256 at 8k context: 136 MB in 256-key segments); a step whose
  // partials do not fit folds in the kernel instead (the same bits, slower).
  attention_workspace_bytes_ = bi_segment_keys_ > 0 ? kAttentionWorkspaceBytesInvariant : kAttentionWorkspaceBytes;
  check_cuda(cudaMalloc(&ws, attention_workspace_bytes_), "cudaMalloc(attention workspace)");
  attention_workspace_ = static_cast<float*>(ws);
  void* err = nullptr;
  check_cuda(cudaMalloc(&err, sizeof(uint32_t)), "cudaMalloc(error word)");
  error_word_ = static_cast<uint32_t*>(err);
  check_cuda(cudaMemsetAsync(error_word_, 0, sizeof(uint32_t), s), "cudaMemset");
  // The dequantising FP8 path's chunk buffer at its largest (linear_fp8),
  // now: a step captured into a graph cannot allocate.
  if (fp8_weights_) grow_buffer(fp8_dequant_, fp8_dequant_bytes_, kFp8DequantChunkBytes, "FP8 dequantisation buffer");
  if (fp8_weights_ && fp8_gemm_) {
    grow_buffer(fp8_gemm_scratch_, fp8_gemm_scratch_bytes_, gemm_f8_scratch_bytes(kFp8GemmMaxRows, 32768),
                "FP8 GEMM activation codes");
  }
  const char* wgmma = std::getenv("DEEPINFER_BI_WGMMA");
  if (batch_invariant_ && (wgmma == nullptr || std::string_view(wgmma) != "0")) {
    // Larger batches through wgmma, only where it has mma.sync's bits on this
    // GPU (docs/batch_invariance.md); DEEPINFER_BI_WGMMA=0 keeps mma.sync.
    bi_wgmma_ = linear_mma_probe_wgmma(stream_);
    log_info("CUDA backend: batch-invariant linear of larger batches through {}",
             bi_wgmma_ ? "wgmma" : "mma.sync (wgmma's sums differ on this GPU)");
  }
  const char* unsplit = std::getenv("DEEPINFER_BI_CUBLAS");
  if (batch_invariant_ && (unsplit == nullptr || std::string_view(unsplit) != "0")) {
    // Larger batches through cuBLASLt's kernels that do not split k, where
    // they give the mma.sync GEMM's bits on this GPU.
    unsplit_gemm_ = std::make_unique<UnsplitGemm>();
    unsplit_gemm_->init(cublas_workspace_, kCublasWorkspaceBytes);
    bi_cublas_ = probe_unsplit_gemm();
    log_info("CUDA backend: batch-invariant linear of larger batches {}",
             bi_cublas_ ? "through cuBLASLt without a split of k"
                        : "not through cuBLASLt (its sums differ from the invariant GEMM's on this GPU)");
  }
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  log_debug("cuda: {} ({} SMs, {:.1f} GiB), compute capability {}.{}", prop.name, num_sms_,
           prop.totalGlobalMem / 1073741824.0, prop.major, prop.minor);
  (void)options;
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(cu(stream_));
  if (cublas_) cublasDestroy(cublas_);
  cudaFree(cublas_workspace_);
  cudaFree(attention_workspace_);
  cudaFree(fp8_dequant_);
  cudaFree(fp8_gemm_scratch_);
  cudaFree(error_word_);
  cudaFree(scratch_);
  if (stream_) cudaStreamDestroy(cu(stream_));
}

void* CudaBackend::allocate(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(bytes, 1)) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void CudaBackend::deallocate(void* ptr) {
  // Pending work may still read the memory; cudaFree waits for the device.
  cudaFree(ptr);
}

std::optional<Backend::SharedDeviceMemory> CudaBackend::allocate_shared_device(size_t bytes) {
  // A plain cudaMalloc allocation: the legacy IPC handle maps exactly it.
  // (These four may run on threads other than the engine's: the device is set.)
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc(shared KV pool)");
  cudaIpcMemHandle_t handle{};
  if (const cudaError_t e = cudaIpcGetMemHandle(&handle, p); e != cudaSuccess) {
    cudaFree(p);
    fail("CUDA backend: cudaIpcGetMemHandle failed: {}", cudaGetErrorString(e));
  }
  SharedDeviceMemory m;
  m.ptr = p;
  const auto* bytes_of = reinterpret_cast<const std::byte*>(&handle);
  m.handle.assign(bytes_of, bytes_of + sizeof handle);
  return m;
}

void CudaBackend::free_shared_device(void* ptr) {
  if (ptr == nullptr) return;
  cudaSetDevice(device_);
  cudaDeviceSynchronize();  // copies into it on other streams of this process
  cudaFree(ptr);
}

void* CudaBackend::open_shared_device(std::span<const std::byte> handle) {
  cudaIpcMemHandle_t h{};
  if (handle.size() != sizeof h) {
    log_error("CUDA backend: a shared-memory handle of {} bytes (want {})", handle.size(), sizeof h);
    return nullptr;
  }
  std::memcpy(&h, handle.data(), sizeof h);
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  void* p = nullptr;
  if (const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
    cudaGetLastError();
    log_error("CUDA backend: cudaIpcOpenMemHandle failed: {}", cudaGetErrorString(e));
    return nullptr;
  }
  return p;
}

void CudaBackend::close_shared_device(void* ptr) {
  if (ptr == nullptr) return;
  cudaSetDevice(device_);
  cudaDeviceSynchronize();  // copies out of it may still be running
  cudaIpcCloseMemHandle(ptr);
}

void* CudaBackend::grow_buffer(void*& buf, size_t& have, size_t bytes, const char* what) {
  if (bytes > have) {
    DI_CHECK(!capturing_, "CUDA backend: an op needs {} bytes of {} while a graph is being captured; run one step "
             "of this shape eagerly first", bytes, what);
    check_cuda(cudaStreamSynchronize(cu(stream_)), "cudaStreamSynchronize");
    cudaFree(buf);
    buf = nullptr;
    const size_t want = std::max(bytes, have + have / 2);
    check_cuda(cudaMalloc(&buf, want), what);
    have = want;
  }
  return buf;
}

void* CudaBackend::scratch(size_t bytes) { return grow_buffer(scratch_, scratch_bytes_, bytes, "scratch"); }

void CudaBackend::check_launch(const char* op) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail("CUDA backend: {} kernel launch failed: {}", op, cudaGetErrorString(e));
}

void CudaBackend::copy(Tensor dst, const Tensor& src) {
  cudaStream_t s = cu(stream_);
  if (src.numel() == 0) return;
  if (src.dtype() == DType::F8E4M3_B64 && on_host(src) != on_host(dst)) {
    copy_fp8_rows(dst, src);
    return;
  }
  if (dst.is_contiguous() && src.is_contiguous()) {
    check_cuda(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, s), "cudaMemcpyAsync");
    if (on_host(dst)) check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return;
  }
  const size_t row = row_bytes(src.dtype(), src.size(-1));
  RowView d = rows_of(dst), v = rows_of(src);
  // Rows a single pitch apart (outer dimensions that nest, e.g. the heads of
  // a [tokens, heads, dim] view of one row per token) copy as one 2-D block.
  auto uniform_pitch = [](const RowView& rv) {
    int64_t pitch = -1, span = 0;  // span: bytes from one step of the dimensions seen so far to the next
    for (int k = rv.nouter - 1; k >= 0; --k) {
      if (rv.shape[k] == 1) continue;  // its stride is never used
      if (pitch < 0) pitch = rv.stride[k];
      else if (rv.stride[k] != span) return int64_t{-1};
      span = rv.stride[k] * rv.shape[k];
    }
    return pitch;
  };
  const int64_t d_pitch = uniform_pitch(d), s_pitch = uniform_pitch(v);
  const auto row_len = static_cast<int64_t>(row);
  if (d_pitch >= row_len && s_pitch >= row_len && v.rows > 1) {
    check_cuda(cudaMemcpy2DAsync(dst.data(), static_cast<size_t>(d_pitch), src.data(), static_cast<size_t>(s_pitch),
                                 row, static_cast<size_t>(v.rows), cudaMemcpyDefault, s),
               "cudaMemcpy2DAsync");
  } else {
    // Rare (outer dimensions that do not nest): one copy per row.
    for (int64_t r = 0; r < v.rows; ++r) {
      auto addr = [](const RowView& rv, int64_t i) {
        int64_t offset = 0;
        for (int k = rv.nouter - 1; k >= 0; --k) {
          offset += (i % rv.shape[k]) * rv.stride[k];
          i /= rv.shape[k];
        }
        return rv.base + offset;
      };
      check_cuda(cudaMemcpyAsync(addr(d, r), addr(v, r), row, cudaMemcpyDefault, s), "cudaMemcpyAsync");
    }
  }
  if (on_host(dst)) check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

void CudaBackend::synchronize() {
  uint32_t err = 0;
  cudaStream_t s = cu(stream_);
  check_cuda(cudaMemcpyAsync(&err, error_word_, sizeof(err), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  if (err == 0) return;
  check_cuda(cudaMemsetAsync(error_word_, 0, sizeof(uint32_t), s), "cudaMemsetAsync");
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  std::vector<const char*> what;
  if (err & kErrEmbeddingId) what.push_back("embedding: token id out of range");
  if (err & kErrStoreKvSlot) what.push_back("store_kv: slot out of range for the cache");
  if (err & kErrGatherRow) what.push_back("gather_rows: row out of range");
  if (err & kErrAttentionPage) what.push_back("attention: page id out of range");
  if (err & kErrAttentionLayout) what.push_back("attention: inconsistent q_indptr/kv_indptr/kv_last_page_len");
  if (err & kErrSampleLogits) what.push_back("sample: +inf logit in a non-greedy row");
  if (err & kErrMoeExpertId) what.push_back("moe_experts: expert id out of range");
  if (err & kErrExpertCountId) what.push_back("count_experts: expert id out of range");
  if (err & kErrPenaltyData) what.push_back("apply_penalties: entry range, token id or pending token out of range");
  if (err & kErrTokenMaskRow) what.push_back("apply_token_bitmask: logits row out of range");
  fail("CUDA backend: bad input data detected on the device: {}", fmt::join(what, "; "));
}

void CudaBackend::embedding(const Tensor& table, const Tensor& ids, int64_t first_id, int64_t vocab, Tensor out) {
  ElemType tt = elem_type(table.dtype(), "embedding");
  launch_embedding(tt, static_cast<const char*>(table.data()), table.stride_bytes(0), first_id, table.size(0), vocab,
                   ids.data_as<const int32_t>(), elem_type(out.dtype(), "embedding"), rows_of(out), error_word_,
                   stream_);
  check_launch("embedding");
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset, Tensor out) {
  launch_rms_norm(elem_type(x.dtype(), "rms_norm"), rows_of(x), RowView{}, weight.data_as<const float>(), eps,
                  weight_offset, rows_of(out), false, stream_, batch_invariant_);
  check_launch("rms_norm");
}

void CudaBackend::add_rms_norm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                               float weight_offset, Tensor out) {
  launch_rms_norm(elem_type(x.dtype(), "add_rms_norm"), rows_of(x), rows_of(residual), weight.data_as<const float>(),
                  eps, weight_offset, rows_of(out), true, stream_, batch_invariant_);
  check_launch("add_rms_norm");
}

void CudaBackend::rope(Tensor q, Tensor k, const Tensor& positions, const RopeParams& params) {
  HeadView qv = heads_of(q), kv = heads_of(k);
  if (k.defined()) {
    DI_CHECK(k.size(2) == q.size(2), "rope: k {} and q {} differ in head size", k.describe(), q.describe());
  }
  launch_rope(elem_type(q.dtype(), "rope"), qv, kv, positions.data_as<const int32_t>(),
              params.inv_freq.data_as<const float>(), params.rotary_dim, params.style == RopeStyle::Neox,
              params.attention_factor, stream_);
  check_launch("rope");
}

void CudaBackend::store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, KvCacheLayer cache) {
  HeadView vv = heads_of(v);
  // A latent cache's V is a view of K (ops::store_kv checks that v is k's
  // view): writing K's row stores both, so V's part is not written again.
  if (cache.v.data() == cache.k.data()) vv.dim = 0;
  launch_store_kv(elem_type(k.dtype(), "store_kv"), heads_of(k), vv, slot_mapping.data_as<const int32_t>(),
                  cache_of(cache.k), cache_of(cache.v), error_word_, stream_);
  check_launch("store_kv");
}

bool CudaBackend::rope_store_kv(Tensor q, Tensor k, const Tensor& v, const Tensor& positions,
                                const RopeParams& params, const Tensor& slot_mapping, KvCacheLayer cache,
                                const QkNorm* norm) {
  if (cache.v.data() == cache.k.data()) return false;  // latent caches store through their own layer
  QkNormArgs norm_args;
  if (norm) {
    const HeadView qv = heads_of(q), kv = heads_of(k);
    const bool fits = q.dtype() != DType::F32 && q.size(2) % 8 == 0 && q.size(2) <= 2048 &&
                      aligned16(qv.base, qv.stride0) && aligned16(qv.base, qv.stride1) &&
                      aligned16(kv.base, kv.stride0) && aligned16(kv.base, kv.stride1) &&
                      aligned16(norm->q_weight.data(), 0) && aligned16(norm->k_weight.data(), 0);
    if (!fits) return false;
    norm_args = {norm->q_weight.data_as<const float>(), norm->k_weight.data_as<const float>(), norm->eps,
                 norm->weight_offset};
  }
  launch_rope_store_kv(elem_type(q.dtype(), "rope_store_kv"), heads_of(q), heads_of(k), heads_of(v),
                       positions.data_as<const int32_t>(), params.inv_freq.data_as<const float>(), params.rotary_dim,
                       params.style == RopeStyle::Neox, params.attention_factor,
                       slot_mapping.data_as<const int32_t>(), cache_of(cache.k), cache_of(cache.v), error_word_,
                       norm_args, stream_);
  check_launch("rope_store_kv");
  return true;
}

bool CudaBackend::mla_rope_store_kv(const Tensor& q_pe, Tensor q_rot, Tensor kv, int64_t lora, const Tensor& kv_norm,
                                    float eps, const Tensor& positions, const RopeParams& params,
                                    const Tensor& slot_mapping, KvCacheLayer cache) {
  const HeadView kv_rows = heads_of(kv);
  // The latent row is normalised by one warp in 16-byte chunks (norm_head_row).
  const bool fits = kv.dtype() != DType::F32 && lora % 8 == 0 && lora <= 2048 &&
                    aligned16(kv_rows.base, kv_rows.stride0) && aligned16(kv_norm.data(), 0) &&
                    params.rotary_dim <= 2048;
  if (!fits) return false;
  const QkNormArgs norm{nullptr, kv_norm.data_as<const float>(), eps, 0.0f};
  launch_mla_rope_store_kv(elem_type(kv.dtype(), "mla_rope_store_kv"), heads_of(q_pe), heads_of(q_rot), kv_rows,
                           static_cast<int>(lora), norm, positions.data_as<const int32_t>(),
                           params.inv_freq.data_as<const float>(), params.rotary_dim,
                           params.style == RopeStyle::Neox, params.attention_factor,
                           slot_mapping.data_as<const int32_t>(), cache_of(cache.k), error_word_, stream_);
  check_launch("mla_rope_store_kv");
  return true;
}

void CudaBackend::attention(const Tensor& q, const KvCacheLayer& cache, const AttentionMetadata& meta,
                            const AttentionParams& params, Tensor out) {
  AttentionLaunch a;
  a.type = elem_type(q.dtype(), "attention");
  a.q = heads_of(q);
  a.out = heads_of(out);
  a.k = cache_of(cache.k);
  a.v = cache_of(cache.v);
  a.q_indptr = meta.q_indptr.data_as<const int32_t>();
  a.kv_indptr = meta.kv_indptr.data_as<const int32_t>();
  a.page_ids = meta.kv_page_indices.data_as<const int32_t>();
  a.listed_pages = meta.kv_page_indices.size(0);
  a.last_len = meta.kv_last_page_len.data_as<const int32_t>();
  a.sinks = params.sinks.defined() ? params.sinks.data_as<const float>() : nullptr;
  a.num_seqs = meta.num_seqs;
  a.group = static_cast<int>(q.size(1) / cache.k.size(2));
  a.scale = params.scale;
  a.window = params.sliding_window;
  a.softcap = params.logit_softcap;
  a.err = error_word_;
  if (a.num_seqs == 0 || q.size(0) == 0) return;

  AttentionHints hints;
  hints.max_q_len = meta.max_q_len;
  hints.max_kv_len = meta.max_kv_len;
  hints.num_sms = num_sms_;
  hints.workspace_bytes = attention_workspace_bytes_;
  hints.max_smem_bytes = max_smem_per_block_;
  hints.batch_invariant = batch_invariant_;
  hints.segment_keys = bi_segment_keys_;
  plan_attention(a, hints);
  DI_CHECK(int64_t{a.num_seqs} * a.num_splits <= 65535, "attention: {} sequences exceed the CUDA grid limit",
           a.num_seqs);
  a.partial = attention_workspace_;
  size_t smem = attention_smem_bytes(a);
  DI_CHECK(smem <= max_smem_per_block_,
           "attention: head size {} with {} query heads per KV head needs {} bytes of shared memory (limit {})",
           q.size(2), a.group, smem, max_smem_per_block_);
  launch_attention(a, stream_);
  check_launch("attention");
}

void CudaBackend::gated_activation(const Tensor& gate, const Tensor& up, Activation act, Tensor out) {
  DI_CHECK(act != Activation::ClampedSwiglu,
           "gated_activation: the clamped SwiGLU (gpt-oss) is not implemented on CUDA yet; use the CPU backend");
  launch_gated(elem_type(gate.dtype(), "gated_activation"), rows_of(gate), rows_of(up),
               act == Activation::GeluTanh, rows_of(out), stream_);
  check_launch("gated_activation");
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor out) {
  launch_add(elem_type(a.dtype(), "add"), rows_of(a), rows_of(b), rows_of(out), stream_);
  check_launch("add");
}

void CudaBackend::scale(const Tensor& x, float factor, Tensor out) {
  launch_scale(elem_type(x.dtype(), "scale"), rows_of(x), factor, rows_of(out), stream_);
  check_launch("scale");
}

void CudaBackend::sanitize_ids(Tensor ids, int64_t limit) {
  launch_sanitize_ids(ids.data_as<int32_t>(), ids.size(0), limit, stream_);
  check_launch("sanitize_ids");
}

void CudaBackend::zero_rows_at_position(Tensor x, const Tensor& positions, int32_t position) {
  launch_zero_rows_at_position(static_cast<int>(row_bytes(x.dtype(), 1)), rows_of(x),
                               positions.data_as<const int32_t>(), position, stream_);
  check_launch("zero_rows_at_position");
}

void CudaBackend::token_probs(const Tensor& logits, const Tensor& tokens, Tensor out) {
  launch_token_probs(logits.data_as<const float>(), logits.size(0), logits.size(1), logits.stride_bytes(0) / 4,
                     tokens.data_as<const int32_t>(), out.data_as<float>(), stream_);
  check_launch("token_probs");
}

void CudaBackend::gather_rows(const Tensor& x, const Tensor& rows, Tensor out) {
  const int64_t es = static_cast<int64_t>(row_bytes(x.dtype(), 1));
  DI_CHECK(es == 2 || es == 4, "gather_rows: dtype {} is not supported on CUDA", dtype_name(x.dtype()));
  int64_t sub = 1;
  for (int d = 1; d + 1 < x.ndim(); ++d) sub *= x.size(d);
  launch_gather_rows(static_cast<int>(es), rows_of(x), x.size(0), sub, rows.data_as<const int32_t>(), rows.size(0),
                     rows_of(out), error_word_, stream_);
  check_launch("gather_rows");
}

void CudaBackend::moe_route(const Tensor& logits, const MoeRouteParams& params, Tensor expert_ids,
                            Tensor expert_weights) {
  const int n_experts = static_cast<int>(logits.size(1));
  DI_CHECK(moe_route_smem_per_warp(n_experts, params.n_groups) <= (size_t{48} << 10),
           "moe_route: {} experts exceed what the CUDA routing kernel holds in shared memory", n_experts);
  MoeRouteLaunch r;
  r.logits_type = elem_type(logits.dtype(), "moe_route");
  r.logits = rows_of(logits);
  r.ids = rows_of(expert_ids);
  r.weights = rows_of(expert_weights);
  r.bias = params.correction_bias.defined() ? params.correction_bias.data_as<const float>() : nullptr;
  r.n_experts = n_experts;
  r.top_k = params.top_k;
  r.sigmoid = params.scoring == MoeScoring::Sigmoid;
  r.renormalize = params.renormalize;
  r.scaling = params.scaling;
  r.n_groups = params.n_groups;
  r.top_k_groups = params.top_k_groups;
  r.group_max = params.group_score == MoeGroupScore::Max;
  launch_moe_route(r, stream_);
  check_launch("moe_route");
}

size_t CudaBackend::moe_workspace_bytes(int64_t n_tokens, int top_k, const MoeExpertWeights& w) const {
  return moe_experts_workspace_bytes(n_tokens, top_k, static_cast<int>(w.gate.size(0)), w.gate.size(2),
                                     w.gate.size(1));
}

void CudaBackend::moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& expert_weights,
                              const MoeExpertWeights& w, Activation act, bool accumulate, Tensor workspace,
                              Tensor out) {
  MoeExpertsLaunch m;
  m.x_type = elem_type(x.dtype(), "moe_experts");
  m.w_type = elem_type(w.gate.dtype(), "moe_experts");
  DI_CHECK(w.down.dtype() == w.gate.dtype(), "moe_experts: the CUDA kernels need one dtype for w.gate {} and w.down {}",
           w.gate.describe(), w.down.describe());
  DI_CHECK(x.dtype() == DType::F32 || w.gate.dtype() != DType::F32,
           "moe_experts: f32 expert weights with {} activations are not supported on CUDA; use a bf16 checkpoint",
           dtype_name(x.dtype()));
  m.x = rows_of(x);
  m.out = rows_of(out);
  m.ids = rows_of(expert_ids);
  m.weights = rows_of(expert_weights);
  auto stack = [](const Tensor& t) {
    return MoeWeightView{static_cast<const char*>(t.data()), t.stride_bytes(0), t.stride_bytes(1)};
  };
  m.gate = stack(w.gate);
  m.up = stack(w.up);
  m.down = stack(w.down);
  m.n = x.size(0);
  m.hidden = x.size(1);
  m.ffn = w.gate.size(1);
  m.n_experts = static_cast<int>(w.gate.size(0));
  m.top_k = static_cast<int>(expert_ids.size(1));
  m.glu = act == Activation::GeluTanh        ? MoeGlu::GeluTanh
          : act == Activation::ClampedSwiglu ? MoeGlu::ClampedSwiglu
                                             : MoeGlu::Silu;
  if (w.has_bias()) {
    m.bias_type = elem_type(w.gate_bias.dtype(), "moe_experts");
    m.gate_bias = static_cast<const char*>(w.gate_bias.data());
    m.up_bias = static_cast<const char*>(w.up_bias.data());
    m.down_bias = static_cast<const char*>(w.down_bias.data());
  }
  m.accumulate = accumulate;
  m.workspace = static_cast<char*>(workspace.data());
  m.err = error_word_;
  m.batch_invariant = batch_invariant_;
  launch_moe_experts(m, stream_);
  check_launch("moe_experts");
}

void CudaBackend::count_experts(const Tensor& expert_ids, const Tensor& token_slots, Tensor counts) {
  launch_count_experts(rows_of(expert_ids), token_slots.defined() ? token_slots.data_as<const int32_t>() : nullptr,
                       counts.data_as<int32_t>(), static_cast<int>(counts.size(0)), error_word_, stream_);
  check_launch("count_experts");
}

void CudaBackend::sample(const Tensor& logits, const Tensor& params, Tensor tokens) {
  launch_sample(rows_of(logits), params.data(), tokens.data_as<int32_t>(), error_word_, stream_);
  check_launch("sample");
}

void CudaBackend::apply_penalties(Tensor logits, const Tensor& params, const Tensor& entries,
                                  const Tensor& pending_tokens) {
  const bool pending = pending_tokens.defined() && pending_tokens.size(0) > 0;
  launch_apply_penalties(rows_of(logits), params.data(), entries.data(), entries.size(0),
                         pending ? pending_tokens.data_as<const int32_t>() : nullptr,
                         pending ? pending_tokens.size(0) : 0, error_word_, stream_);
  check_launch("apply_penalties");
}

void CudaBackend::apply_token_bitmask(Tensor logits, const Tensor& bitmask, const Tensor& rows) {
  launch_apply_token_bitmask(rows_of(logits), bitmask.data_as<const uint32_t>(), bitmask.size(1),
                             rows.data_as<const int32_t>(), bitmask.size(0), error_word_, stream_);
  check_launch("apply_token_bitmask");
}

}  // namespace deepinfer::cuda
