// Backend-neutral op entry points. Models call these, never Backend ops
// directly: each validates ranks, shapes, dtypes and devices of its arguments
// and throws deepinfer::Error with a message naming the op and the offending
// tensors, then dispatches to the backend. Semantics are documented on the
// corresponding Backend methods in backend/backend.h.
//
// Activation tensors are in the backend's activation_dtype() (or f32, e.g. for
// logits out of linear); the activation arguments of one call share a dtype
// except linear's out.
// Outputs may alias inputs only where backend.h says so (rms_norm's out may be x;
// element-wise ops may write over an input of the same view).
#pragma once

#include "backend/backend.h"

namespace deepinfer::ops {

// dst and src: equal shapes and dtypes, each on the backend's device or the host.
void copy(Backend& backend, Tensor dst, const Tensor& src);

void embedding(Backend& backend, const Tensor& table, const Tensor& ids, Tensor out);
// The same over a vocabulary slice (Backend::embedding): ids outside
// [first_id, first_id + table rows) of the `vocab` ids give zero rows.
void embedding_slice(Backend& backend, const Tensor& table, const Tensor& ids, int64_t first_id, int64_t vocab,
                     Tensor out);
void rms_norm(Backend& backend, const Tensor& x, const Tensor& weight, float eps, float weight_offset,
              Tensor out);
void add_rms_norm(Backend& backend, Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                  float weight_offset, Tensor out);
// bias may be undefined.
void linear(Backend& backend, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out);
// k may be undefined.
void rope(Backend& backend, Tensor q, Tensor k, const Tensor& positions, const RopeParams& params);
// A negative slot marks a padding token that is not stored.
void store_kv(Backend& backend, const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
              const KvCacheLayer& cache);
// [rms_norm of each q and k head (norm, may be null),] rope(q, k), then
// store_kv(k, v): fused where the backend can.
void rope_store_kv(Backend& backend, Tensor q, Tensor k, const Tensor& v, const Tensor& positions,
                   const RopeParams& params, const Tensor& slot_mapping, const KvCacheLayer& cache,
                   const QkNorm* norm = nullptr);
// MLA: rms_norm(kv[:, :, :lora]) in place, copy(q_rot, q_pe), rope(q_rot,
// kv[:, :, lora:]), store_kv(kv, kv[:, :, :lora]): fused where the backend can.
void mla_rope_store_kv(Backend& backend, const Tensor& q_pe, Tensor q_rot, Tensor kv, int64_t lora,
                       const Tensor& kv_norm, float eps, const Tensor& positions, const RopeParams& params,
                       const Tensor& slot_mapping, const KvCacheLayer& cache);
void attention(Backend& backend, const Tensor& q, const KvCacheLayer& cache,
               const AttentionMetadata& meta, const AttentionParams& params, Tensor out);
void gated_activation(Backend& backend, const Tensor& gate, const Tensor& up, Activation act,
                      Tensor out);
// Returns false when the backend has no fused kernel (run linear + gated_activation).
// out[:, b] = x[:, b] W[b]^T for x [n, B, k], weight [B, m, k], out [n, B, m].
void linear_batched(Backend& backend, const Tensor& x, const Tensor& weight, Tensor out);
bool gated_linear(Backend& backend, const Tensor& x, const Tensor& w_gate_up, Activation act, Tensor out);
void add(Backend& backend, const Tensor& a, const Tensor& b, Tensor out);
void scale(Backend& backend, const Tensor& x, float factor, Tensor out);
void gather_rows(Backend& backend, const Tensor& x, const Tensor& rows, Tensor out);
// In place, every id outside [0, limit) becomes 0. The sampler marks a row it
// cannot sample with -1; the step launched after it reads the sampled ids on
// the device, and must see a valid one (its result for that row is discarded).
void sanitize_ids(Backend& backend, Tensor ids, int64_t limit);
// Rows of x [n, cols] whose positions i32[n] entry equals `position` become zeros.
void zero_rows_at_position(Backend& backend, Tensor x, const Tensor& positions, int32_t position);

// Mixture of experts (see backend.h). The expert ids a route produces are
// checked against the expert count by moe_experts on the device.
void moe_route(Backend& backend, const Tensor& logits, const MoeRouteParams& params, Tensor expert_ids,
               Tensor expert_weights);
size_t moe_workspace_bytes(Backend& backend, int64_t n_tokens, int top_k, const MoeExpertWeights& w);
void moe_experts(Backend& backend, const Tensor& x, const Tensor& expert_ids, const Tensor& expert_weights,
                 const MoeExpertWeights& w, Activation act, bool accumulate, Tensor workspace, Tensor out);
// Adds each routed (token, expert) choice to counts i32[n_experts] (see
// Backend::count_experts); token_slots i32[n] may be undefined.
void count_experts(Backend& backend, const Tensor& expert_ids, const Tensor& token_slots, Tensor counts);

// Sampling (see Backend::sample). logits: f32[rows, vocab] with a free row
// stride; params: u8[rows, sizeof(SamplingRowParams)] (rows of raw
// SamplingRowParams bytes, contiguous); tokens: i32[rows]. The parameter
// values are not read here (they may live on a device): validate them first
// (SamplingParams::validate).
// out f32[R] = softmax(logits[r])[tokens[r]] for f32 logits [R, vocab]:
// the probability of each row's chosen token (0 for an id outside the
// vocabulary or a row without a finite logit).
void token_probs(Backend& backend, const Tensor& logits, const Tensor& tokens, Tensor out);
void sample(Backend& backend, const Tensor& logits, const Tensor& params, Tensor tokens);

// logit_bias, min_tokens mask and penalties in place (see
// Backend::apply_penalties). logits: f32[rows, vocab] with a free row stride;
// params: contiguous u8[rows, sizeof(PenaltyRowParams)]; entries: contiguous
// u8[n, sizeof(PenaltyEntry)] (n may be 0); pending_tokens: i32[m] or
// undefined. The values inside params and entries may live on a device: the
// backend checks them.
void apply_penalties(Backend& backend, Tensor logits, const Tensor& params, const Tensor& entries,
                     const Tensor& pending_tokens);

// Structured output: every token a grammar forbids becomes -inf, in place (see
// Backend::apply_token_bitmask). logits: f32[n, vocab] with a free row stride;
// bitmask: contiguous i32[m, words] (bit t & 31 of word t >> 5 set = token t
// allowed); rows: i32[m], the logits row each mask row applies to. m may be 0
// (nothing to do). The row indices may live on a device: the backend checks them.
void apply_token_bitmask(Backend& backend, Tensor logits, const Tensor& bitmask, const Tensor& rows);

}  // namespace deepinfer::ops
