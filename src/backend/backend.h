// Backend: one compute device (CPU, CUDA GPU) behind a table of operations.
//
// Conventions every implementation follows:
//  - Output tensors are allocated by the caller; ops never allocate (a backend may
//    keep scratch sized once at start-up or on first use of a larger shape).
//  - Tensors are views: the innermost dimension is contiguous, outer dimensions
//    may have any byte stride (so a slice of a fused QKV output can be passed).
//  - Activations are f32 on the CPU backend; weights may be any dtype the
//    backend supports (plain floats or GGUF block-quantised).
//  - Shapes are validated by the backend-neutral entry points in src/ops/, not here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

enum class RopeStyle : uint8_t {
  Interleaved,  // rotate pairs (2i, 2i+1): GGUF llama-family weights (permuted q/k)
  Neox,         // rotate pairs (i, i + rotary_dim/2): Hugging Face "rotate_half"
};

enum class Activation : uint8_t {
  Silu,      // SwiGLU
  GeluTanh,  // GeGLU with the tanh approximation (Gemma)
  // gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit),
  // out = (u + 1) * g * sigmoid(alpha * g), with the constants below.
  ClampedSwiglu,
};
constexpr float kClampedSwigluAlpha = 1.702f;
constexpr float kClampedSwigluLimit = 7.0f;

struct RopeParams {
  Tensor inv_freq;  // f32[rotary_dim / 2], with any frequency scaling already applied
  int rotary_dim = 0;
  RopeStyle style = RopeStyle::Neox;
  float attention_factor = 1.0f;  // multiplies cos and sin (YaRN-style mscale)
};

// Per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3): weights f32[head_dim].
struct QkNorm {
  Tensor q_weight, k_weight;
  float eps = 1e-6f;
  float weight_offset = 0.0f;
};

// One layer's paged KV cache: pages of page_size token slots. V's head size
// may be smaller than K's: an MLA latent cache (DeepSeek) stores one row of
// [latent, roped key part] per token and V is a view of K's first
// v_head_dim channels (same memory, K's strides).
struct KvCacheLayer {
  Tensor k;  // [num_pages, page_size, n_heads_kv, head_dim]
  Tensor v;  // [num_pages, page_size, n_heads_kv, v_head_dim], v_head_dim <= head_dim
  int page_size() const { return static_cast<int>(k.size(1)); }
};

// One step's attention layout, CSR style. Sequence s owns query rows
// [q_indptr[s], q_indptr[s+1]) and the pages kv_page_indices[kv_indptr[s] ..
// kv_indptr[s+1]). Its cached length (including this step's new tokens, which
// store_kv has already written) is (n_pages - 1) * page_size + kv_last_page_len[s].
// The queries are the last q_len positions of the sequence, so query row i of
// sequence s sits at position kv_start_pos[s] + kv_len - q_len + i.
struct AttentionMetadata {
  int num_seqs = 0;
  int max_q_len = 0;   // host-side hints for work partitioning
  int max_kv_len = 0;
  Tensor q_indptr;          // i32[num_seqs + 1]
  Tensor kv_indptr;         // i32[num_seqs + 1]
  Tensor kv_page_indices;   // i32[kv_indptr[num_seqs]]
  Tensor kv_last_page_len;  // i32[num_seqs]
  // Optional i32[num_seqs]: position of the first key of the first listed page;
  // non-zero when a sliding-window layer has released pages that fell out of its window.
  Tensor kv_start_pos;
};

struct AttentionParams {
  float scale = 1.0f;
  // 0 = full causal attention; otherwise a query at position p sees keys at
  // positions j with p - window < j <= p (Hugging Face's sliding_window).
  int sliding_window = 0;
  float logit_softcap = 0.0f;  // 0 = off; else logits = cap * tanh(logits / cap)
  Tensor sinks;                // optional f32[n_heads_q]: per-head sink logit (gpt-oss)
};

// Mixture-of-experts routing. Scores are softmax over all experts (Mixtral,
// Qwen-MoE) or a per-expert sigmoid (DeepSeek-V3). Experts are chosen by
// score + correction_bias (when defined), optionally restricted to the
// top_k_groups best of n_groups equal groups (a group's rank: the sum of its two
// best biased scores, as DeepSeek-V3 does, or its best score, DeepSeek-V2's
// group_limited_greedy). The weights are the chosen experts' unbiased scores,
// divided by their sum when renormalize is set (norm_topk_prob), times scaling
// (routed_scaling_factor).
enum class MoeScoring : uint8_t { Softmax, Sigmoid };
enum class MoeGroupScore : uint8_t { TopTwoSum, Max };

struct MoeRouteParams {
  int top_k = 1;
  MoeScoring scoring = MoeScoring::Softmax;
  bool renormalize = false;
  float scaling = 1.0f;
  Tensor correction_bias;  // optional f32[n_experts]
  int n_groups = 1;
  int top_k_groups = 1;
  MoeGroupScore group_score = MoeGroupScore::TopTwoSum;
};

// Every expert's matrices stacked on a leading expert dimension, each expert's
// slice in linear's [out, in] layout. Any weight dtype linear accepts; the
// outer strides are free, so the gate and up halves of a fused gate_up stack
// [E, 2F, H] can be passed as two views, and so can interleaved gate/up rows
// (gpt-oss: row 2f gate, row 2f+1 up): the stack viewed as [E, F, 2H] and
// narrowed to columns [0, H) for gate and [H, 2H) for up (row stride 2H).
// Biases are optional (all three or none), added after each product; f32 or
// the activation dtype, contiguous.
struct MoeExpertWeights {
  Tensor gate;  // [n_experts, ffn, hidden]
  Tensor up;    // [n_experts, ffn, hidden]
  Tensor down;  // [n_experts, hidden, ffn]
  Tensor gate_bias;  // [n_experts, ffn]
  Tensor up_bias;    // [n_experts, ffn]
  Tensor down_bias;  // [n_experts, hidden]
  bool has_bias() const { return gate_bias.defined(); }
};

// One row's sampling parameters for Backend::sample, laid out identically on
// the host and the device (a params tensor is an array of these).
// temperature < SamplingParams::kGreedyTemperature (1e-5) = greedy argmax;
// top_k <= 0 = off; top_p >= 1 = off; min_p <= 0 = off. The random number of
// the draw is rng::uniform01(seed, position). The values are validated by the
// caller (SamplingParams::validate); a device never reads out of bounds on bad
// values but their token is unspecified.
struct SamplingRowParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t top_k = 0;
  uint64_t seed = 0;
  int64_t position = 0;
};
static_assert(sizeof(SamplingRowParams) == 32 && alignof(SamplingRowParams) == 8,
              "SamplingRowParams is copied byte for byte to devices");
// The greedy threshold, equal to SamplingParams::kGreedyTemperature (the
// backends do not see the public API header).
constexpr float kSamplingGreedyTemperature = 1e-5f;

// Backend::apply_penalties' inputs. A row's entries are a sorted run of the
// entry list: one per token the row's logit_bias, min_tokens mask or
// penalties touch, strictly increasing token ids. Both structs are laid out
// identically on the host and the device (tensors are arrays of them).
struct PenaltyRowParams {
  float repetition = 1.0f;  // 1 = off
  float frequency = 0.0f;   // 0 = off
  float presence = 0.0f;    // 0 = off
  int32_t entries_begin = 0, entries_end = 0;  // the row's entries [begin, end)
  // Index into pending_tokens of the row's in-flight token (sampled by a step
  // whose results the host has not read): one more output occurrence. -1 = none.
  int32_t pending = -1;
  int32_t mask_min_tokens = 0;  // non-zero: entries with kPenaltyMinTokensMask become -inf
  int32_t reserved = 0;
};
static_assert(sizeof(PenaltyRowParams) == 32, "PenaltyRowParams is copied byte for byte to devices");

constexpr uint32_t kPenaltyInPrompt = 1u << 0;       // the token occurs in the prompt
constexpr uint32_t kPenaltyHasBias = 1u << 1;        // logit_bias has the token (bias may be 0)
constexpr uint32_t kPenaltyMinTokensMask = 1u << 2;  // EOS or stop token: masked while min_tokens is not reached
struct PenaltyEntry {
  int32_t token = 0;
  int32_t output_count = 0;  // occurrences in the output the host knows (pending excluded)
  uint32_t flags = 0;
  float bias = 0.0f;
};
static_assert(sizeof(PenaltyEntry) == 16, "PenaltyEntry is copied byte for byte to devices");

// A marker in a backend's op stream: complete once every op enqueued before
// record() has finished.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  virtual void record() = 0;
  virtual void synchronize() = 0;  // waits on the host until complete
  virtual bool ready() = 0;
  // Milliseconds from `earlier` to this event, both recorded and complete.
  virtual double elapsed_ms_since(const DeviceEvent& earlier) const = 0;
};

// A second queue of copies that runs alongside the backend's ops (KV blocks
// offloaded to host memory while the next steps compute). Nothing orders it
// against the ops but wait_for_ops(); the caller keeps the copied memory
// untouched until an event recorded after the copies completes.
class CopyStream {
 public:
  virtual ~CopyStream() = default;
  // Copies enqueued from now on start after every op enqueued so far.
  virtual void wait_for_ops() = 0;
  // As Backend::copy_rows_async, on this queue.
  virtual void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                         size_t rows) = 0;
  // An event complete once every copy enqueued so far has landed.
  virtual std::unique_ptr<DeviceEvent> record() = 0;
  virtual void synchronize() = 0;
};

// A captured sequence of ops, replayed with the arguments of the capture.
class OpGraph {
 public:
  virtual ~OpGraph() = default;
  virtual void replay() = 0;
};

struct DeviceMemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // Element type of activations on this backend (f32 on the CPU, bf16 on
  // GPUs). Logits are always f32.
  virtual DType activation_dtype() const { return DType::F32; }
  // The KV cache's element type with --kv-cache-dtype auto, and the types a
  // cache may hold here (converted on store and load when they differ from
  // the activations'). Every backend takes FP8 e4m3.
  virtual DType default_kv_dtype() const { return activation_dtype(); }
  virtual bool supports_kv_dtype(DType t) const { return t == activation_dtype() || t == DType::F8E4M3; }

  // --- What shapes how a model stores its weights (asked instead of the
  // device type).
  // The kernels read weights where they lie in host memory and in their
  // stored form (GGUF blocks included): a mapped file is used as it is, with
  // no upload and no dequantisation.
  virtual bool reads_host_weights() const { return false; }
  // Projections that read the same input (q/k/v, gate/up) run as one stacked
  // matrix: one launch and one pass over the input per step instead of
  // several, which matters where decode steps are short and launch-bound.
  virtual bool stacks_projections() const { return false; }
  // Linear layers' FP8 row-block weights (DType::F8E4M3_B64) stay FP8 in
  // device memory and linear multiplies with them; elsewhere they are
  // dequantised at upload like the GGUF formats (WeightStore::linear_weight).
  virtual bool stores_fp8_weights() const { return false; }

  // Memory.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  // dst and src have equal shapes and dtypes; either may live on the host.
  virtual void copy(Tensor dst, const Tensor& src) = 0;
  virtual void synchronize() = 0;

  // --- Asynchronous steps (ModelRunner). The defaults suit backends whose ops
  // complete before they return (the CPU): events are always complete, host
  // memory is ordinary memory and there is no graph capture.
  // Host memory the device copies to and from without staging (pinned on CUDA).
  virtual void* allocate_host(size_t bytes);
  virtual void deallocate_host(void* ptr);
  // Device memory another process on the same node can map (CUDA IPC): the
  // exporting process keeps it and frees it with free_shared_device(); the
  // handle is the bytes the other process passes to open_shared_device().
  // Backends without device memory of their own (the CPU) share host memory
  // instead and return nullopt.
  struct SharedDeviceMemory {
    void* ptr = nullptr;
    std::vector<std::byte> handle;
  };
  virtual std::optional<SharedDeviceMemory> allocate_shared_device(size_t bytes);
  virtual void free_shared_device(void* ptr);
  // Maps another process's shared device memory (nullptr: not possible here,
  // logged); close_shared_device() unmaps it.
  virtual void* open_shared_device(std::span<const std::byte> handle);
  virtual void close_shared_device(void* ptr);
  // copy() that does not wait for a device-to-host copy to land: the host
  // data is valid once an event recorded after it has completed. dst or src
  // on the host must come from allocate_host.
  virtual void copy_async(Tensor dst, const Tensor& src) { copy(dst, src); }
  // `rows` runs of `width` bytes, src_pitch apart in src and dst_pitch apart
  // in dst (device memory, or host memory from allocate_host), in order with
  // the ops and without waiting, like copy_async (KV blocks to and from the
  // host tier).
  virtual void copy_rows_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                               size_t rows);
  // copy_rows_async for several blocks at once (the same row layout each):
  // KV blocks loaded from another engine's device memory, in one launch
  // where the backend can (one copy call per block costs more in launches
  // than in bytes). The default copies block by block.
  struct BlockCopy {
    void* dst;
    const void* src;
  };
  virtual void copy_blocks_async(std::span<const BlockCopy> blocks, size_t dst_pitch, size_t src_pitch, size_t width,
                                 size_t rows);
  // A point in the backend's op stream.
  virtual std::unique_ptr<DeviceEvent> create_event();
  // A queue of copies alongside the ops (the default copies at once, in order).
  virtual std::unique_ptr<CopyStream> create_copy_stream();
  // Records the ops enqueued between begin_capture() and end_capture() into a
  // graph that replays them with the same arguments (CUDA graphs). Nothing
  // runs while capturing. Only for backends where supports_graphs().
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture();
  virtual std::unique_ptr<OpGraph> end_capture();
  // Device memory now free and in total; nullopt for host backends.
  virtual std::optional<DeviceMemoryInfo> memory_info() const { return std::nullopt; }

  // Rows of table[vocab, hidden] (any weight dtype) picked by ids i32[n] -> out[n, hidden].
  // Rows of a vocabulary slice: the table holds ids [first_id, first_id +
  // table rows) of a vocabulary of `vocab` ids; an id of the vocabulary
  // outside the slice gives a zero row (tensor parallelism adds the ranks'
  // rows up), an id outside the vocabulary is an error.
  virtual void embedding(const Tensor& table, const Tensor& ids, int64_t first_id, int64_t vocab, Tensor out) = 0;
  // out = x / rms(x) * (weight + weight_offset), per row; out may alias x.
  // weight_offset is 1 for Gemma's (1 + w) convention, else 0.
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset,
                        Tensor out) = 0;
  // residual += x; out = rms_norm(residual). Saves one pass over the activations.
  virtual void add_rms_norm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                            float weight_offset, Tensor out) = 0;
  // out[n, m] = x[n, k] * weight[m, k]^T (+ bias[m] when bias is defined).
  virtual void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out) = 0;
  // A batch of linears without bias, one weight each: out[:, b] = x[:, b] W[b]^T
  // for x [n, B, k], weight [B, m, k], out [n, B, m] (any outer strides; the
  // per-head projections of MLA). The default runs B linears.
  virtual void linear_batched(const Tensor& x, const Tensor& weight, Tensor out);
  // Rotary embedding in place on q[n, n_heads_q, head_dim] and k[n, n_heads_kv, head_dim]
  // at positions i32[n]; k may be undefined.
  virtual void rope(Tensor q, Tensor k, const Tensor& positions, const RopeParams& params) = 0;
  // Writes k [n, n_heads_kv, head_dim] and v [n, n_heads_kv, v_head_dim] into cache
  // slots i32[n] (slot = page * page_size + offset). With a latent cache (V a
  // view of K) v is the matching view of k and only k is written.
  virtual void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
                        KvCacheLayer cache) = 0;
  // [per-head q/k RMSNorm,] rope(q, k), then store_kv(k, v) in one pass, for
  // backends where these would be separate kernels each paying a launch
  // (decode). norm may be null. Returns false when the backend has no fused
  // path for these arguments; the caller then runs the separate ops.
  virtual bool rope_store_kv(Tensor q, Tensor k, const Tensor& v, const Tensor& positions, const RopeParams& params,
                             const Tensor& slot_mapping, KvCacheLayer cache, const QkNorm* norm) {
    (void)q, (void)k, (void)v, (void)positions, (void)params, (void)slot_mapping, (void)cache, (void)norm;
    return false;
  }
  // Multi-head latent attention's steps between the projections and the
  // attention, fused where a backend can (in decode each would be a launch):
  // rms_norm of the latent part kv[:, 0, :lora] in place (kv_norm, eps,
  // weight offset 0); rope at positions on kv's rope part kv[:, 0, lora:] in
  // place and on q_pe [n, heads, rot], written to q_rot [n, heads, rot] (q_pe
  // is left as it was); then store_kv(kv, kv's latent view) into the latent
  // cache. kv is [n, 1, lora + rot]. Returns false when the backend has no
  // fused path for these arguments; the caller then runs the separate ops.
  virtual bool mla_rope_store_kv(const Tensor& q_pe, Tensor q_rot, Tensor kv, int64_t lora, const Tensor& kv_norm,
                                 float eps, const Tensor& positions, const RopeParams& params,
                                 const Tensor& slot_mapping, KvCacheLayer cache) {
    (void)q_pe, (void)q_rot, (void)kv, (void)lora, (void)kv_norm, (void)eps, (void)positions, (void)params,
        (void)slot_mapping, (void)cache;
    return false;
  }
  // q[n, n_heads_q, head_dim] -> out[n, n_heads_q, v_head_dim]; causal within each sequence,
  // grouped-query (n_heads_q a multiple of n_heads_kv; MLA: one latent KV head).
  virtual void attention(const Tensor& q, const KvCacheLayer& cache, const AttentionMetadata& meta,
                         const AttentionParams& params, Tensor out) = 0;
  // out[n, f] = act(gate[n, f]) * up[n, f] (ClampedSwiglu: as defined on Activation).
  virtual void gated_activation(const Tensor& gate, const Tensor& up, Activation act,
                                Tensor out) = 0;
  // The gated MLP's input side in one product: out[n, f] = act(x W[0:f]^T) *
  // (x W[f:2f]^T) for a stacked gate-up weight w_gate_up [2f, k], with the
  // same rounding as linear followed by gated_activation. A backend without
  // a fused kernel for this shape returns false and the caller runs those two.
  virtual bool gated_linear(const Tensor& x, const Tensor& w_gate_up, Activation act, Tensor out) {
    (void)x, (void)w_gate_up, (void)act, (void)out;
    return false;
  }
  virtual void add(const Tensor& a, const Tensor& b, Tensor out) = 0;
  virtual void scale(const Tensor& x, float factor, Tensor out) = 0;
  // out[i] = x[rows[i]] for rows i32[n].
  virtual void gather_rows(const Tensor& x, const Tensor& rows, Tensor out) = 0;
  // ids i32[n] in place: every id outside [0, limit) becomes 0.
  virtual void sanitize_ids(Tensor ids, int64_t limit) = 0;
  // Rows r of x (activations [n, cols]) with positions[r] == position become
  // zeros (DeepSeek's MTP layer drops the token embedding at position 0).
  virtual void zero_rows_at_position(Tensor x, const Tensor& positions, int32_t position) = 0;
  // out f32[R] = softmax(logits[r])[tokens[r]] for f32 logits [R, vocab] and
  // tokens i32[R]; a token outside the vocabulary, or a row with no finite
  // logit, gives 0 (a draft's confidence, computed where the logits are).
  virtual void token_probs(const Tensor& logits, const Tensor& tokens, Tensor out) = 0;

  // Router logits [n, n_experts] (f32 or activation dtype) -> the top_k chosen
  // expert ids i32[n, top_k] and their weights f32[n, top_k].
  virtual void moe_route(const Tensor& logits, const MoeRouteParams& params, Tensor expert_ids,
                         Tensor expert_weights) = 0;
  // Bytes of workspace moe_experts needs for n tokens routed to top_k experts each.
  virtual size_t moe_workspace_bytes(int64_t n_tokens, int top_k, const MoeExpertWeights& w) const = 0;
  // out[t] (+)= sum_j expert_weights[t, j] * down_e(act(gate_e x[t], up_e x[t])) with
  // e = expert_ids[t, j]; accumulates into out when `accumulate` (shared experts),
  // else overwrites it. workspace: u8[moe_workspace_bytes(...)], caller-owned.
  virtual void moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& expert_weights,
                           const MoeExpertWeights& w, Activation act, bool accumulate, Tensor workspace,
                           Tensor out) = 0;
  // Expert-load statistics: counts[e] += the number of (token t, choice j)
  // with expert_ids[t, j] == e, over rows t whose token_slots[t] >= 0. A
  // negative KV slot marks a padding row of a graph batch, which must not
  // count; token_slots i32[n] may be undefined (every row counts). counts:
  // i32[n_experts], contiguous. An id outside [0, n_experts) is an error
  // (raised at once on the CPU, by synchronize() on a device; it is not
  // counted). Integer adds commute, so the result is deterministic.
  virtual void count_experts(const Tensor& expert_ids, const Tensor& token_slots, Tensor counts) = 0;

  // One token per row of logits f32[rows, vocab] (outer stride free): greedy
  // argmax (lowest id on ties, NaN never wins) or temperature, top-k, top-p,
  // min-p and an inverse-CDF draw, exactly as cpu::sample_row
  // (backend/cpu/cpu_sampling.h) defines them. params: u8[rows, 32], each row
  // one SamplingRowParams. tokens: i32[rows]; -1 where every logit is -inf or
  // NaN. A +inf logit in a non-greedy row is an error (raised at once on the
  // CPU, by synchronize() on a device).
  virtual void sample(const Tensor& logits, const Tensor& params, Tensor tokens) = 0;

  // vLLM's logits processing before sampling, in its order, on
  // rows of logits f32[rows, vocab] (outer stride free), in place: per entry,
  // -inf if masked (kPenaltyMinTokensMask with the row's mask_min_tokens),
  // + bias (kPenaltyHasBias), then with count = output_count (+1 for the
  // row's pending token): repetition (l > 0 ? l / r : l * r) when the token is
  // in the prompt or count > 0, then l - (frequency * count + presence) when
  // count > 0; a pending token without an entry counts once. Each step is a
  // separately rounded f32 operation (no fused multiply-add), so every
  // backend's logits are bit-identical to cpu::penalise_logit's
  // (backend/cpu/cpu_penalties.h). params: u8[rows, 32] (PenaltyRowParams);
  // entries: u8[n, 16] (PenaltyEntry); pending_tokens: i32[m], may be
  // undefined (m = 0). A row range outside [0, n], unsorted entries, a token
  // id outside [0, vocab) or a pending index outside [0, m) is an error
  // (raised at once on the CPU, by synchronize() on a device); a negative
  // pending token (no token could be sampled) counts as none.
  virtual void apply_penalties(Tensor logits, const Tensor& params, const Tensor& entries,
                               const Tensor& pending_tokens) = 0;

  // Grammar-constrained decoding: rows of logits f32[rows, vocab] (outer
  // stride free) in place, logits[rows[i], t] = -inf for every token t that
  // mask row i does not allow; everything else is left as it was (logits rows
  // that rows does not name, allowed tokens, the gap of a strided row).
  // bitmask: contiguous i32[m, words], m >= 1; token t is allowed when bit
  // (t & 31) of word (t >> 5) is set (XGrammar's FillNextTokenBitmask layout);
  // tokens t >= words * 32 (a mask narrower than the logits, e.g. a model
  // vocabulary padded past the tokenizer's) are not allowed, and bits past
  // vocab are ignored. rows: i32[m]; a row named twice gets both masks. A
  // row outside [0, rows) is an error: raised at once on the CPU before any
  // logit changes; a device skips that mask row (no out-of-bounds write),
  // applies the others and raises the error by synchronize().
  virtual void apply_token_bitmask(Tensor logits, const Tensor& bitmask, const Tensor& rows) = 0;
};

struct BackendOptions {
  int num_threads = 0;  // CPU: 0 = all hardware threads
  // Every output row is computed by the same arithmetic whatever the batch
  // size, so a request's results do not depend on what else is batched with it
  // (DEEPINFER_BATCH_INVARIANT=1). Costs prefill speed on the CPU.
  bool batch_invariant = false;
  int device_index = 0;  // which GPU (a rank's local rank)
  // --quantization fp8: keep FP8 linear weights where the backend can
  // (Backend::stores_fp8_weights).
  bool fp8_weights = false;
};

std::unique_ptr<Backend> create_backend(DeviceType type, const BackendOptions& options = {});

// Owning device memory obtained from a backend; moves, never copies.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& backend, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  Tensor view(DType dtype, std::initializer_list<int64_t> shape, size_t offset_bytes = 0) const;

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace deepinfer
