// Launchers of the mixture-of-experts kernels (cuda_moe.cu); plain types only,
// like cuda_kernels.h, so the host code compiled by the C++ compiler can
// include it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

// Device error bit: an expert id outside [0, n_experts) reached moe_experts
// (it is clamped, so nothing is read out of bounds). A high bit, clear of
// ErrorBits and of kErrSampleLogits.
constexpr uint32_t kErrMoeExpertId = 1u << 17;

// Backend::moe_route: one warp per token.
struct MoeRouteLaunch {
  ElemType logits_type = ElemType::F32;
  RowView logits;        // [n, n_experts]
  RowView ids, weights;  // i32 / f32 [n, top_k]
  const float* bias = nullptr;
  int n_experts = 0, top_k = 1;
  bool sigmoid = false, renormalize = false;
  float scaling = 1.0f;
  int n_groups = 1, top_k_groups = 1;
  bool group_max = false;  // rank groups by their best expert (else the sum of the two best)
};
// Shared memory one routing warp needs; the backend refuses expert counts whose
// warp would not fit in 48 KiB.
size_t moe_route_smem_per_warp(int n_experts, int n_groups);
void launch_moe_route(const MoeRouteLaunch& r, Stream stream);

// One stack of expert matrices [n_experts, rows, cols] with byte strides.
struct MoeWeightView {
  const char* base = nullptr;
  int64_t expert_stride = 0, row_stride = 0;
};

enum class MoeGlu : uint8_t { Silu, GeluTanh, ClampedSwiglu };

// Backend::moe_experts. x and out share a dtype; weights are f32, f16 or bf16.
struct MoeExpertsLaunch {
  ElemType x_type = ElemType::BF16, w_type = ElemType::BF16;
  RowView x, out;        // [n, hidden]
  RowView ids, weights;  // i32 / f32 [n, top_k]
  MoeWeightView gate, up, down;
  // Optional contiguous biases [E, ffn], [E, ffn], [E, hidden] (all or none),
  // added after each product.
  ElemType bias_type = ElemType::F32;
  const char* gate_bias = nullptr;
  const char* up_bias = nullptr;
  const char* down_bias = nullptr;
  int64_t n = 0, hidden = 0, ffn = 0;
  int n_experts = 0, top_k = 1;
  MoeGlu glu = MoeGlu::Silu;
  bool accumulate = false;
  char* workspace = nullptr;  // moe_experts_workspace_bytes(...) bytes, 256-byte aligned
  uint32_t* err = nullptr;
  // DEEPINFER_BATCH_INVARIANT=1: the grouped GEMMs at every batch size (a
  // row's result there does not depend on the batch; the decode path's
  // arithmetic differs from theirs).
  bool batch_invariant = false;
};
// Depends on shapes only, so a workspace sized once serves every call (and
// every captured graph) of at most n tokens.
size_t moe_experts_workspace_bytes(int64_t n, int top_k, int n_experts, int64_t hidden, int64_t ffn);
void launch_moe_experts(const MoeExpertsLaunch& m, Stream stream);

// The decode path (cuda_moe_decode.cu), which launch_moe_experts takes when
// moe_decode_applies: bf16/f16 with weights of the same dtype, 16-byte aligned
// rows, and at most kMoeDecodeMaxSlots (token, choice) slots. It reads each
// slot's expert rows once (slots sharing an expert: again, mostly from L2),
// where the grouped GEMMs read each chosen expert once but pad its rows to a
// 16-row tile and pay an index pass; up to 64 slots (8 tokens at top 8) the
// row tile is mostly padding and the slots mostly hit distinct experts, so
// the gemv kernels win; beyond, tokens share experts and the tiles fill.
constexpr int64_t kMoeDecodeMaxSlots = 64;
bool moe_decode_applies(const MoeExpertsLaunch& m);
size_t moe_decode_workspace_bytes(int64_t n, int top_k, int64_t ffn);
void launch_moe_experts_decode(const MoeExpertsLaunch& m, Stream stream);

}  // namespace deepinfer::cuda
