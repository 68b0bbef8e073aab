// Launchers of the CUDA backend's own kernels. This header is shared by the
// host code (compiled by the C++ compiler) and the .cu files, so it holds only
// plain structs: no CUDA or fmt types. Every launcher enqueues on `stream` and
// never allocates; errors in the data (ids, slots, pages out of range) are
// written to the device-side error word `err` and raised by the host at the
// next synchronisation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace deepinfer::cuda {

enum class ElemType : uint8_t { F32, F16, BF16 };

// Device error codes (bit flags so that several can be reported at once).
enum ErrorBits : uint32_t {
  kErrEmbeddingId = 1u << 0,
  kErrStoreKvSlot = 1u << 1,
  kErrGatherRow = 1u << 2,
  kErrAttentionPage = 1u << 3,
  kErrAttentionLayout = 1u << 4,
};

// A tensor seen as rows of `cols` contiguous elements; the outer dimensions
// (at most 3) may have any byte stride, as in the CPU backend's Rows.
struct RowView {
  char* base = nullptr;
  int64_t cols = 0;
  int64_t rows = 1;
  int nouter = 0;
  int64_t shape[3] = {1, 1, 1};
  int64_t stride[3] = {0, 0, 0};
};

// A rank-3 view [n, heads, dim] with byte strides for the outer two dimensions.
struct HeadView {
  char* base = nullptr;
  int64_t n = 0, heads = 0, dim = 0;
  int64_t stride0 = 0, stride1 = 0;
};

// A paged cache layer [pages, page_size, heads, dim] with byte strides. Its
// elements are the activations' type, or FP8 e4m3 (scale 1) when fp8 is set:
// the store kernels round to e4m3, the attention kernels widen on load.
struct CacheView {
  char* base = nullptr;
  int64_t pages = 0, page_size = 0, heads = 0, dim = 0;
  int64_t stride0 = 0, stride1 = 0, stride2 = 0;
  bool fp8 = false;
};

using Stream = void*;  // cudaStream_t

void launch_embedding(ElemType table_type, const char* table, int64_t table_stride, int64_t first_id, int64_t rows,
                      int64_t vocab,
                      const int32_t* ids, ElemType out_type, RowView out, uint32_t* err, Stream stream);
// batch_invariant: the same split of a row over lanes whatever the number of
// rows (by default few rows spread each row over more warps).
void launch_rms_norm(ElemType type, RowView x, RowView residual_or_null, const float* weight, float eps,
                     float weight_offset, RowView out, bool add_residual, Stream stream, bool batch_invariant = false);
void launch_rope(ElemType type, HeadView q, HeadView k, const int32_t* positions, const float* inv_freq,
                 int rotary_dim, bool neox, float attention_factor, Stream stream);
// v rows hold v.dim <= k.dim elements; v.dim 0 writes K only (an MLA latent cache's V is K's view).
// Optional per-head RMSNorm of q and k inside launch_rope_store_kv (null
// weights: none); needs head_dim % 8 == 0 (at most 2,048), 16-byte aligned
// q/k rows and weights.
struct QkNormArgs {
  const float* q_weight = nullptr;
  const float* k_weight = nullptr;
  float eps = 0.0f, offset = 0.0f;
};
// kv [n, 1, lora + rot]: norm.k_weight normalises the latent part (norm.eps,
// norm.offset); q_pe/q_rot [n, heads, rot]. See Backend::mla_rope_store_kv.
void launch_mla_rope_store_kv(ElemType type, HeadView q_pe, HeadView q_rot, HeadView kv, int lora,
                              const QkNormArgs& norm, const int32_t* positions, const float* inv_freq, int rotary_dim,
                              bool neox, float attention_factor, const int32_t* slots, CacheView ck, uint32_t* err,
                              Stream stream);
void launch_rope_store_kv(ElemType type, HeadView q, HeadView k, HeadView v, const int32_t* positions,
                          const float* inv_freq, int rotary_dim, bool neox, float attention_factor,
                          const int32_t* slots, CacheView ck, CacheView cv, uint32_t* err, const QkNormArgs& norm,
                          Stream stream);
void launch_store_kv(ElemType type, HeadView k, HeadView v, const int32_t* slots, CacheView ck,
                     CacheView cv, uint32_t* err, Stream stream);
void launch_gated(ElemType type, RowView gate, RowView up, bool gelu, RowView out, Stream stream);
void launch_add(ElemType type, RowView a, RowView b, RowView out, Stream stream);
void launch_scale(ElemType type, RowView x, float factor, RowView out, Stream stream);
// ids[i] outside [0, limit) become 0, in place.
void launch_sanitize_ids(int32_t* ids, int64_t n, int64_t limit, Stream stream);
void launch_zero_rows_at_position(int elem_bytes, RowView x, const int32_t* positions, int32_t position,
                                  Stream stream);
void launch_token_probs(const float* logits, int64_t rows, int64_t vocab, int64_t row_stride, const int32_t* tokens,
                        float* out, Stream stream);
// out row i (with `sub` inner rows) = x row rows[i]; elem_bytes 2 or 4.
void launch_gather_rows(int elem_bytes, RowView x, int64_t x_outer, int64_t sub, const int32_t* rows,
                        int64_t n, RowView out, uint32_t* err, Stream stream);
// out[n, m] (+)= bias; out of type `type`, bias f32.
void launch_add_bias(ElemType type, RowView out, const float* bias, Stream stream);
// Linear with f32 activations and f16/bf16 weights (f32 accumulation); a
// simple kernel for the f32 activations the op tests use.
void launch_linear_f32x(RowView x, ElemType w_type, const char* w, int64_t w_stride, int64_t m,
                        const float* bias, RowView out, Stream stream);
// Decode-sized linear (1 <= n <= kGemvMaxRows) with bf16/f16 x and weights of
// the same type; needs k % 8 == 0 and 16-byte aligned rows.
constexpr int kGemvMaxRows = 4;
// Work partition of a gemv: warps sharing one weight row (1, 2, 4 or 8; a
// block holds 8 warps) and 16-byte loads in flight per lane (4 or 8).
struct GemvConfig {
  int warps_per_row = 1;
  int unroll = 4;
};
GemvConfig gemv_config(int64_t m, int64_t k);  // the launcher's choice for an [m, k] weight
// A batch of independent products in one launch (e.g. the per-head
// projections of MLA): product b reads x + b * x_stride and w + b * w_stride
// and writes out + b * out_stride (byte strides).
struct GemvBatch {
  int64_t count = 1;
  int64_t x_stride = 0, w_stride = 0, out_stride = 0;
};
// Copies KV blocks between device addresses (cuda_copy_blocks.cu): block i's
// `rows` rows of `width` bytes from src[i] (src_pitch apart) to dst[i]
// (dst_pitch apart); width, pitches and addresses multiples of 16. The
// addresses travel in the launch's parameters (no device-side list to
// allocate or fill), so at most kCopyBlocksPerLaunch blocks per launch.
inline constexpr size_t kCopyBlocksPerLaunch = 240;
struct CopyBlocksArgs {
  void* dst[kCopyBlocksPerLaunch];
  const void* src[kCopyBlocksPerLaunch];
};
void launch_copy_blocks(const CopyBlocksArgs& args, int n, size_t dst_pitch, size_t src_pitch, size_t width,
                        size_t rows, Stream stream);

// config.warps_per_row <= 0 = gemv_config(m, k).
void launch_gemv(ElemType type, int n, const char* x, int64_t x_stride, const char* w, int64_t w_stride, int64_t m,
                 int64_t k, const float* bias, bool out_f32, char* out, int64_t out_stride, Stream stream,
                 GemvConfig config = GemvConfig{0, 4}, GemvBatch batch = {});
// FP8 row-block weights (DType::F8E4M3_B64 in split rows: codes, then scales;
// cuda_gemv_fp8.cu):
// out[n, m] = x[n, k] W[m, k]^T (+ f32 bias) for 1 <= n <= kGemvF8MaxRows
// bf16/f16 rows of x (16-byte aligned), f32 or x-typed out; k a multiple of
// 64, weight rows 4-byte aligned (16: faster). Tensor cores; the weights are read once for
// up to 32 rows of x, and from L2 for the next 32 (beyond, the activations'
// reads outgrow what this non-tiled kernel does well: dequantise and GEMM).
constexpr int kGemvF8MaxRows = 64;
// How the weights stream: `stages` shared-memory stages of 16 weight rows x
// `stage_codes` codes (512 x {4, 6}; 1024 x 4 for up to 8 rows of x); 0
// stages (or a configuration that does not apply): the register kernel, with
// `stage_codes` codes a warp loads per group of blocks (128 or 256; other
// values: 128); -1: the launcher's choice.
struct GemvF8Config {
  int stages = -1;
  int stage_codes = 512;
};
void launch_gemv_f8(ElemType x_type, int n, const char* x, int64_t x_stride, const char* w, int64_t w_stride,
                    int64_t m, int64_t k, const float* bias, bool out_f32, char* out, int64_t out_stride,
                    Stream stream, GemvF8Config config = {});
// The gated MLP's input side on a stacked FP8 gate-up weight [2f, k]:
// out[n, f] = act(x W[0:f]^T) * (x W[f:2f]^T), out in x's type, the same bits
// as launch_gemv_f8 into [n, 2f] then the gated activation. Up to 8 rows of
// x, k a multiple of 256, 16-byte aligned weight rows; false (nothing
// launched) otherwise or when the register kernel serves one token tile (the
// default: it measured faster at batch 1; DEEPINFER_GEMV_F8 picks another).
bool launch_gemv_f8_glu(ElemType x_type, int n, const char* x, int64_t x_stride, const char* w_gate_up,
                        int64_t w_stride, int64_t f, int64_t k, bool gelu, char* out, int64_t out_stride,
                        Stream stream, GemvF8Config config = {});
// FP8 x FP8 tensor-core GEMM (cuda_gemm_fp8.cu): out[n, m] = x[n, k] W[m, k]^T
// (+ f32 bias) with W in FP8 row blocks (split rows) and x (bf16/f16) rounded
// to e4m3 with one scale per 64 elements of a row (max |x| / 448) into
// `scratch` (gemm_f8_scratch_bytes(n, k)); f32 or x-typed out. Hopper only.
// tiles: 0 = 128 x 128, 1 = 128 x 64 two blocks an SM, 2 = 128 x 64 with both
// k blocks of a tile in flight, 3 = both (bench_fp8_gemm compares them).
bool gemm_f8_fits(int64_t k, int64_t m, const char* x, int64_t x_stride, const char* w, int64_t w_stride,
                  const char* out, int64_t out_stride);
size_t gemm_f8_scratch_bytes(int64_t n, int64_t k);
void launch_gemm_f8(ElemType x_type, int64_t n, const char* x, int64_t x_stride, const char* w, int64_t w_stride,
                    int64_t m, int64_t k, const float* bias, bool out_f32, char* out, int64_t out_stride,
                    char* scratch, Stream stream, int tiles = 0);
// Rows of FP8 row blocks to bf16/f16 rows (prefill: then cuBLAS).
void launch_dequant_f8(const char* w, int64_t w_stride, int64_t rows, int64_t k, ElemType out_type, char* out,
                       int64_t out_stride, Stream stream);
// Gated-MLP decode product: out[n, f] = act(x W[0:f]^T) * (x W[f:2f]^T) for a
// stacked gate-up weight [2f, k] (same conditions as launch_gemv; bf16/f16 out).
void launch_gemv_glu(ElemType type, int n, const char* x, int64_t x_stride, const char* w_gate_up, int64_t w_stride,
                     int64_t f, int64_t k, bool gelu, char* out, int64_t out_stride, Stream stream);
// The batch-invariant dense linear (cuda_linear_mma.cu, DEEPINFER_BATCH_INVARIANT=1):
// out[n, m] = x[n, k] W[m, k]^T (+ f32 bias), bf16/f16 x and W of one type,
// f32 or x-typed out, through the tensor-core GEMM whose rows' results do not
// depend on n (cuda_mma_gemm.cuh). Needs k and m multiples of 8 and 16-byte
// aligned rows (linear_mma_fits).
bool linear_mma_fits(const char* x, int64_t x_stride, const char* w, int64_t w_stride, int64_t m, int64_t k,
                     const char* out, int64_t out_stride);
// wgmma: larger batches through the Hopper GEMM of cuda_wgmma_gemm.cuh, only
// where linear_mma_probe_wgmma found it gives the same bits.
void launch_linear_mma(ElemType type, int64_t n, const char* x, int64_t x_stride, const char* w, int64_t w_stride,
                       int64_t m, int64_t k, const float* bias, bool out_f32, char* out, int64_t out_stride,
                       bool wgmma, Stream stream);
// The same GEMM for a gated MLP's stacked gate-up weight [2f, k]: out[n, f] =
// act(x W[0:f]^T) * (x W[f:2f]^T), gate and up rounded to x's type first (the
// bits of linear + gated_activation in the mode). False when it does not fit.
bool launch_gated_linear_mma(ElemType type, int64_t n, const char* x, int64_t x_stride, const char* w_gate_up,
                             int64_t w_stride, int64_t f, int64_t k, bool gelu, char* out, int64_t out_stride,
                             bool wgmma, Stream stream);
// Whether another GEMM computes the same f32 sums, bit for bit, as the
// mma.sync GEMM on this GPU (both add each output's k16 products in order;
// whether two instructions round a k16 step alike is the hardware's): both
// run on random bf16 operands x [n, k] and w [m, k] into f32 out [n, m]
// (row-major, contiguous), compared. `candidate` launches the other GEMM on
// the stream and returns whether it could. Synchronous and allocating: call
// before any graph capture.
using ProbeGemm = std::function<bool(const char* x, const char* w, char* out, int64_t n, int64_t m, int64_t k)>;
bool linear_mma_probe(Stream stream, int64_t n, int64_t m, int64_t k, const ProbeGemm& candidate);
// The probe for the wgmma GEMM of cuda_wgmma_gemm.cuh.
bool linear_mma_probe_wgmma(Stream stream);
// Element-type conversion of a row view into a contiguous buffer.
void launch_convert(ElemType from, RowView x, ElemType to, char* out, Stream stream);

// Paged attention. plan_attention() picks the kernel and the partition
// (q_tile or row blocks, q_blocks, num_splits) on the host from shapes and
// hints only, so a captured CUDA graph stays valid; the kernels read the CSR
// metadata on the device. V's head size may be smaller than K's (out has
// V's; SIMT only): with an MLA latent cache V is a view of K's first
// channels (same pages and strides) and the kernel reads it from the K tile.
enum class AttentionKernel : uint8_t {
  Simt,        // f32 arithmetic, any dtype and head size (cuda_attention.cu)
  MmaPrefill,  // tensor cores, bf16/f16, head 64/128/256; each warp owns 16 rows
  MmaDecode,   // tensor cores, at most 16 rows per sequence; warps split the keys
  // The batch-invariant mode's decode: at most 16 rows per sequence, the
  // prefill shape's sums with a tile's keys (S) and the dims (P V) split over warps.
  MmaInvariantDecode,
  MmaLatent,   // tensor cores over an MLA latent cache (K 576 wide, V its first 512); 16-row blocks
};
struct AttentionLaunch {
  ElemType type = ElemType::BF16;
  AttentionKernel kernel = AttentionKernel::Simt;
  HeadView q, out;
  CacheView k, v;
  const int32_t* q_indptr = nullptr;
  const int32_t* kv_indptr = nullptr;
  const int32_t* page_ids = nullptr;
  int64_t listed_pages = 0;
  const int32_t* last_len = nullptr;
  const float* sinks = nullptr;
  int num_seqs = 0;
  int group = 1;
  float scale = 1.0f;
  int window = 0;
  float softcap = 0.0f;
  // Simt: query tokens per block and query heads of a group per block (a
  // divisor of group: many heads sharing one KV head, as MLA's 128, are
  // tiled); rows = q_tile * head_tile. Mma: unused; a block takes
  // attention_mma_rows() consecutive (token, head) rows.
  int q_tile = 1;
  int head_tile = 1;
  int q_blocks = 1;     // blocks along the query axis per sequence
  int num_splits = 1;   // KV splits per (sequence, head); >1 needs the workspace
  // Batch-invariant key segments (cuda_attention_segments.cuh): > 0 cuts every
  // row's keys at multiples of this many (a multiple of the prefill kernel's
  // 64-key tile) and folds them in order, in the kernel, or (segment_partials)
  // in the combine from num_segments partials [num_segments, n, heads_q, dim + 2]
  // that splits of whole segments write.
  int segment_keys = 0;
  bool segment_partials = false;
  int num_segments = 0;
  float* partial = nullptr;  // [num_splits, n, heads_q, v dim + 2] when num_splits > 1
  uint32_t* err = nullptr;
};
struct AttentionHints {
  int max_q_len = 0;   // 0: unknown, the number of query rows is used
  int max_kv_len = 0;
  int num_sms = 1;
  size_t workspace_bytes = 0;  // room for split-KV partials
  bool allow_mma = true;       // false keeps the SIMT kernel (benchmarks compare the two)
  // A row's result independent of the batch (DEEPINFER_BATCH_INVARIANT=1):
  // the tensor-core prefill kernel's order of summation for every query
  // count (the decode kernel splits a tile's keys across warps: another
  // order), through MmaInvariantDecode where a sequence has at most 16 rows,
  // and split-KV only along the fixed key segments below.
  bool batch_invariant = false;
  // The mode's key segment (AttentionLaunch::segment_keys; 0: none, so no
  // split-KV either). Fixed for the process: it is part of the arithmetic.
  int segment_keys = 0;
  size_t max_smem_bytes = 232448;  // per block (sm_90 opt-in limit); the SIMT tiles shrink to fit
};
void plan_attention(AttentionLaunch& a, const AttentionHints& hints);
// Shared memory bytes one attention block needs for the planned kernel.
size_t attention_smem_bytes(const AttentionLaunch& a);
void launch_attention(const AttentionLaunch& a, Stream stream);

// Key segments of the batch-invariant mode (opt-in): the suggested length,
// the tile it must be a multiple of, and the widest head the segmented
// kernel takes.
inline constexpr int kAttentionSegmentKeys = 256;
inline constexpr int kAttentionSegmentTile = 64;
inline constexpr int kAttentionMaxSegmentedDim = 128;
// The widest head the mode's split-dims decode kernel (MmaInvariantDecode)
// takes: wider tiles give two warps, which lose to the prefill shape's one.
inline constexpr int kAttentionMaxSplitDimsDim = 128;

// The tensor-core kernels (cuda_attention_mma.cu). launch_attention_mma runs
// the main kernel only; launch_attention adds the split-KV combine.
bool attention_mma_supported(const AttentionLaunch& a);
int attention_mma_rows(AttentionKernel kernel, int dim);
size_t attention_mma_smem_bytes(const AttentionLaunch& a);
void launch_attention_mma(const AttentionLaunch& a, Stream stream);
// The latent-cache kernel (cuda_attention_mla.cu), bf16/f16 caches.
bool attention_mla_supported(const AttentionLaunch& a);
int attention_mla_rows();
size_t attention_mla_smem_bytes();
void launch_attention_mla(const AttentionLaunch& a, Stream stream);

}  // namespace deepinfer::cuda
