#include "model/deepseek_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/logging.h"
#include "ops/ops.h"

namespace deepinfer {

namespace {

// transformers' yarn_get_mscale.
double yarn_mscale(double factor, double mscale) { return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

// DeepSeek scales the softmax by mscale(factor, mscale_all_dim)^2 on top of
// 1/sqrt(qk head size) when the rope is scaled (YaRN), as transformers does.
float softmax_scale(const ModelConfig& c) {
  double scale = 1.0 / std::sqrt(static_cast<double>(c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim));
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type != RopeScalingType::None && rs.mscale_all_dim != 0) {
    const double m = yarn_mscale(rs.factor, rs.mscale_all_dim);
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

}  // namespace

DeepseekModel::DeepseekModel(ModelConfig config, const WeightSource& full_source, Backend& backend, int32_t mtp_layer,
                             TensorParallel tp)
    : config_(std::move(config)), backend_(backend), store_(backend), mtp_layer_(mtp_layer) {
  config_.validate();
  const WeightSource* shard_source = &full_source;
  if (tp.active()) {
    DI_CHECK(mtp_layer < 0, "tensor parallelism: the decoder only, not the MTP layer");
    RankShard shard = shard_for_rank(config_, full_source, tp);
    tp_ = shard.forward;
    sharded_ = std::move(shard.source);
    shard_source = sharded_.get();
  }
  ep_ = ExpertParallelMoe::for_ranks(backend_, tp);
  const WeightSource& source = *shard_source;
  const ModelConfig& c = config_;
  DI_CHECK(c.mla.enabled(), "{}: DeepseekModel needs a Multi-head Latent Attention config", c.arch);
  mla_shape_ = {c.n_heads_q,         c.mla.q_lora_rank, c.mla.kv_lora_rank, c.mla.qk_nope_head_dim,
                c.mla.qk_rope_head_dim, c.mla.v_head_dim, c.rms_eps};
  attention_scale_ = softmax_scale(c);
  const int64_t H = c.hidden_size, F = c.intermediate_size;

  WeightLoader load(source, store_);
  ffn_scratch_ = std::max<int64_t>(F, c.moe.shared_ffn_size);
  if (mtp_layer_ >= 0) {
    load_mtp(load);
  } else {
    const int64_t vocab_rows = tp_.active() ? tp_.plan().vocab.size() : c.vocab_size;
    token_embd_ = load.matrix("token_embd.weight", vocab_rows, H);
    output_norm_ = load.vector("output_norm.weight", H);
    if (load.has("output.weight") && !c.tied_embeddings) {
      output_ = load.matrix("output.weight", vocab_rows, H);
    } else {
      output_ = token_embd_;
      load.count(token_embd_.nbytes());  // read again by the output projection
    }
    layers_.resize(c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) load_layer(layers_[i], load, fmt::format("blk.{}.", i), c.is_moe(i));
  }
  inv_freq_ = store_.f32_vector(rope_inv_freq(c, false));
  weight_bytes_ = load.bytes();
  log_info("model: MLA q_lora {} kv_lora {} nope {} rope {} v {}; KV cache row {} per token and layer; softmax "
           "scale {:.6g}",
           c.mla.q_lora_rank, c.mla.kv_lora_rank, c.mla.qk_nope_head_dim, c.mla.qk_rope_head_dim, c.mla.v_head_dim,
           mla_shape_.cache_row(), attention_scale_);
}

void DeepseekModel::load_layer(Layer& l, WeightLoader& load, const std::string& p, bool moe) {
  const int64_t H = config_.hidden_size;
  l.attn_norm = load.vector(p + "attn_norm.weight", H);
  load_mla(l, load, p);
  l.ffn_norm = load.vector(p + "ffn_norm.weight", H);
  if (moe) {
    has_moe_ = true;
    load_moe(l, load, p);
  } else {
    l.mlp = layers::load_mlp(load, store_, p, "", config_.intermediate_size, H);
  }
}

void DeepseekModel::load_mtp(WeightLoader& load) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  DI_CHECK(mtp_layer_ >= c.n_layers && mtp_layer_ < c.n_layers + c.mtp_layers,
           "{}: layer {} is not a multi-token-prediction layer (the checkpoint has {} after its {} layers)", c.arch,
           mtp_layer_, c.mtp_layers, c.n_layers);
  const std::string p = fmt::format("blk.{}.", mtp_layer_);
  DI_CHECK(load.has(p + "nextn.eh_proj.weight"),
           "the checkpoint declares {} multi-token-prediction layer(s) (num_nextn_predict_layers) but holds no "
           "weights for layer {} (model.layers.{}.eh_proj.weight)",
           c.mtp_layers, mtp_layer_, mtp_layer_);
  // DeepSeek-V3 checkpoints give the layer copies of the embedding and the
  // output projection; without them it shares the decoder's.
  const std::string own_embd = p + "nextn.embed_tokens.weight";
  const std::string embd = load.has(own_embd) ? own_embd : "token_embd.weight";
  token_embd_ = load.matrix(embd, c.vocab_size, H);
  output_norm_ = load.vector(p + "nextn.shared_head_norm.weight", H);
  if (load.has(p + "nextn.shared_head_head.weight")) {
    output_ = load.matrix(p + "nextn.shared_head_head.weight", c.vocab_size, H);
  } else if (load.has("output.weight") && !c.tied_embeddings) {
    output_ = load.matrix("output.weight", c.vocab_size, H);
  } else {
    output_ = token_embd_;
    load.count(token_embd_.nbytes());
  }
  mtp_enorm_ = load.vector(p + "nextn.enorm.weight", H);
  mtp_hnorm_ = load.vector(p + "nextn.hnorm.weight", H);
  // eh_proj [H, 2H] acts on concat(embedding, hidden): its two column halves
  // act on each, so no concatenated activation is needed.
  const Tensor eh = load.host_matrix(p + "nextn.eh_proj.weight", H, 2 * H);
  DI_CHECK(eh.dtype() == DType::F32 || eh.dtype() == DType::F16 || eh.dtype() == DType::BF16,
           "{}: eh_proj is {}; only f32/f16/bf16 are supported", p, dtype_name(eh.dtype()));
  const size_t half = row_bytes(eh.dtype(), H);
  for (int part = 0; part < 2; ++part) {
    std::vector<uint8_t>& bytes = absorbed_.emplace_back(half * static_cast<size_t>(H));
    for (int64_t r = 0; r < H; ++r) {
      std::memcpy(bytes.data() + static_cast<size_t>(r) * half,
                  static_cast<const uint8_t*>(eh.data()) + r * eh.stride_bytes(0) + static_cast<int64_t>(part * half),
                  half);
    }
    (part == 0 ? mtp_eh_embed_ : mtp_eh_hidden_) = store_.matrix(Tensor(bytes.data(), eh.dtype(), {H, H}));
  }
  layers_.resize(1);
  // Its feed-forward block is MoE when the checkpoint gives it a router (V3's is).
  load_layer(layers_[0], load, p, load.has(p + "ffn_gate_inp.weight"));
}

void DeepseekModel::mtp_input(const ForwardInputs& in, Tensor x, Tensor h, Tensor delta) {
  const float eps = config_.rms_eps;
  DI_CHECK(in.hidden_in.defined() && in.hidden_in.size(0) == in.num_tokens,
           "the MTP layer needs each token's hidden state (ForwardInputs::hidden_in)");
  ops::embedding(backend_, token_embd_, in.token_ids, x);
  // As vLLM runs DeepSeek's MTP layer: no token embedding at position 0.
  ops::zero_rows_at_position(backend_, x, in.positions, 0);
  ops::rms_norm(backend_, x, mtp_enorm_, eps, 0.0f, h);
  ops::rms_norm(backend_, in.hidden_in, mtp_hnorm_, eps, 0.0f, delta);
  ops::linear(backend_, h, mtp_eh_embed_, Tensor(), x);
  ops::linear(backend_, delta, mtp_eh_hidden_, Tensor(), h);
  ops::add(backend_, x, h, x);
}

void DeepseekModel::load_mla(Layer& l, WeightLoader& load, const std::string& p) {
  const ModelConfig& c = config_;
  const layers::MlaShape& s = mla_shape_;
  const int64_t H = c.hidden_size, q_dim = s.q_dim(), lora = s.kv_lora_rank;
  layers::MlaWeights& w = l.mla;
  // The two projections of the layer input: q (or q_a) and kv_a, stacked
  // into w_in where the backend stacks projections.
  const bool q_lora = s.q_lora_rank > 0;
  const int64_t q_in = q_lora ? s.q_lora_rank : q_dim;
  const Tensor h_q = load.host_matrix(p + (q_lora ? "attn_q_a.weight" : "attn_q.weight"), q_in, H);
  const Tensor h_kv_a = load.host_matrix(p + "attn_kv_a_mqa.weight", s.cache_row(), H);
  w.w_in = store_.fused_matrix({h_q, h_kv_a});
  if (!w.w_in.defined()) {
    (q_lora ? w.wq_a : w.wq) = store_.linear_weight(h_q);
    w.wkv_a = store_.linear_weight(h_kv_a);
  }
  if (c.mla.attention_bias) {
    const Tensor h_bkv_a = load.host_vector(p + "attn_kv_a_mqa.bias", s.cache_row());
    // Without q LoRA the q projection has no bias (zeros in the stacked one).
    std::vector<float> zeros(q_lora ? 0 : static_cast<size_t>(q_in), 0.0f);
    const Tensor h_bq = q_lora ? load.host_vector(p + "attn_q_a.bias", q_in) : Tensor(zeros.data(), DType::F32, {q_in});
    if (w.w_in.defined()) {
      w.b_in = store_.f32_concat({h_bq, h_bkv_a});
    } else {
      if (q_lora) w.bq_a = store_.f32_vector(h_bq);
      w.bkv_a = store_.f32_vector(h_bkv_a);
    }
  }
  if (q_lora) {
    w.q_a_norm = load.vector(p + "attn_q_a_norm.weight", s.q_lora_rank);
    w.wq_b = load.linear(p + "attn_q_b.weight", q_dim, s.q_lora_rank);
  }
  w.kv_a_norm = load.vector(p + "attn_kv_a_norm.weight", lora);
  const std::string kv_b_name = p + "attn_kv_b.weight";
  const Tensor kv_b = load.host_matrix(kv_b_name, int64_t{s.n_heads} * (s.nope_dim + s.v_dim), lora);
  w.wkv_b = store_.matrix(kv_b);
  std::vector<uint8_t>& uk = absorbed_.emplace_back(layers::absorbed_key_weights(kv_b, s));
  w.w_uk_t = store_.matrix(Tensor(uk.data(), kv_b.dtype(), {s.n_heads, lora, s.nope_dim}));
  w.wo = load.linear(p + "attn_output.weight", H, int64_t{s.n_heads} * s.v_dim);
  if (c.mla.attention_bias) w.bo = load.vector(p + "attn_output.bias", H);
}

void DeepseekModel::load_moe(Layer& l, WeightLoader& load, const std::string& p) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, E = c.moe.n_experts, F = c.moe.expert_ffn_size, S = c.moe.shared_ffn_size;
  const int64_t used = c.moe.n_experts_used;
  l.moe.router = load.matrix(p + "ffn_gate_inp.weight", E, H);
  if (ep_) {
    // This rank's slots only, copied out of the checkpoint's stacks.
    const int32_t ranks = ep_->num_ranks();
    MoeExpertWeights full;
    full.gate = load.host_experts(p + "ffn_gate_exps.weight", E, F, H, used, ranks);
    full.up = load.host_experts(p + "ffn_up_exps.weight", E, F, H, used, ranks);
    full.down = load.host_experts(p + "ffn_down_exps.weight", E, H, F, used, ranks);
    l.ep_layer = static_cast<int32_t>(ep_->num_layers());
    ep_->add_layer(full, moe::contiguous_placement(static_cast<int32_t>(E), ranks));
  } else {
    l.moe.experts.gate = load.expert_stack(p + "ffn_gate_exps.weight", E, F, H, used);
    l.moe.experts.up = load.expert_stack(p + "ffn_up_exps.weight", E, F, H, used);
    l.moe.experts.down = load.expert_stack(p + "ffn_down_exps.weight", E, H, F, used);
  }
  if (S > 0) {
    l.mlp = layers::load_mlp(load, store_, p, "_shexp", S, H);
  }
  MoeRouteParams& r = l.route;
  r.top_k = c.moe.n_experts_used;
  r.scoring = c.moe.scoring;
  r.renormalize = c.moe.norm_topk_prob;
  r.scaling = c.moe.routed_scaling;
  r.n_groups = c.moe.n_groups;
  r.top_k_groups = c.moe.top_k_groups;
  r.group_score = c.moe.group_score;
  if (c.moe.correction_bias) r.correction_bias = load.vector(p + "exp_probs_b.bias", E);
}

Tensor DeepseekModel::work_view(DType dtype, int64_t rows, int64_t cols, size_t& offset) const {
  Tensor t = workspace_.view(dtype, {rows, cols}, offset);
  offset += (t.nbytes() + 63) & ~size_t{63};
  return t;
}

KvCacheSpec DeepseekModel::kv_spec(int32_t page_size, DType dtype) const {
  KvCacheSpec spec{config_.n_layers, 1, static_cast<int32_t>(mla_shape_.cache_row()), page_size, dtype};
  spec.latent_v_dim = mla_shape_.kv_lora_rank;
  return spec;
}

void DeepseekModel::reserve(int32_t max_tokens, int32_t max_logit_rows) {
  DI_CHECK(max_tokens > 0 && max_logit_rows > 0 && max_logit_rows <= max_tokens,
           "invalid activation reservation ({} tokens, {} logit rows)", max_tokens, max_logit_rows);
  if (max_tokens <= max_tokens_ && max_logit_rows <= max_logit_rows_) return;
  const ModelConfig& c = config_;
  const layers::MlaShape& s = mla_shape_;
  const size_t T = static_cast<size_t>(max_tokens), R = static_cast<size_t>(max_logit_rows);
  // Sized for 4-byte elements, enough for any activation dtype.
  auto padded = [](size_t elems) { return (elems * 4 + 63) & ~size_t{63}; };
  const size_t heads = static_cast<size_t>(s.n_heads);
  size_t bytes = 3 * padded(T * c.hidden_size) + 2 * padded(R * c.hidden_size) + 3 * padded(T * ffn_scratch_);
  bytes += padded(T * std::max(s.q_lora_rank, 1)) + padded(T * s.q_dim()) + padded(T * s.cache_row()) +
           padded(T * heads * s.cache_row()) + padded(T * heads * s.kv_lora_rank) + padded(T * heads * s.v_dim);
  moe_workspace_bytes_ = 0;
  if (has_moe_) {
    bytes += padded(T * c.moe.n_experts) + 2 * padded(T * c.moe.n_experts_used);
    if (ep_) bytes += padded(T * c.hidden_size);  // the routed experts' output, added to the shared experts'
    for (const Layer& l : layers_) {
      if (l.moe.router.defined() && l.ep_layer < 0) {
        moe_workspace_bytes_ = std::max(moe_workspace_bytes_,
                                        ops::moe_workspace_bytes(backend_, max_tokens, l.route.top_k, l.moe.experts));
      }
    }
    bytes += (moe_workspace_bytes_ + 63) & ~size_t{63};
  }
  bytes += padded(tp_.logits_scratch_floats(max_logit_rows));  // this rank's logits and everyone's
  workspace_ = Buffer(backend_, bytes);
  max_tokens_ = max_tokens;
  max_logit_rows_ = max_logit_rows;
}

void DeepseekModel::forward(const ForwardInputs& in, const KvStorage& kv, Tensor logits) {
  const ModelConfig& c = config_;
  const layers::MlaShape& s = mla_shape_;
  const int64_t n = in.num_tokens, R = in.logit_rows.numel(), heads = s.n_heads;
  DI_CHECK(n > 0 && n <= max_tokens_ && R <= max_logit_rows_,
           "step of {} tokens / {} logit rows exceeds the reserved {} / {}", n, R, max_tokens_, max_logit_rows_);
  DI_CHECK(kv.spec().latent_v_dim == s.kv_lora_rank && kv.spec().head_dim == s.cache_row() &&
               kv.spec().n_heads_kv == 1,
           "{}: the KV cache must be the model's latent cache (kv_spec), got head {} x {} (latent {})", c.arch,
           kv.spec().n_heads_kv, kv.spec().head_dim, kv.spec().latent_v_dim);
  const DType act = backend_.activation_dtype();
  size_t off = 0;
  Tensor x = work_view(act, n, c.hidden_size, off);
  Tensor h = work_view(act, n, c.hidden_size, off);
  Tensor delta = work_view(act, n, c.hidden_size, off);
  layers::MlaScratch mla;
  // The input projections' outputs, q (or q_a) then kv_a, side by side: one
  // buffer that a stacked matrix (MlaWeights::w_in) writes at
  // once; separate matrices write their column ranges.
  const bool q_lora = s.q_lora_rank > 0;
  const int64_t q_in = q_lora ? s.q_lora_rank : s.q_dim();
  mla.in = work_view(act, n, q_in + s.cache_row(), off);
  (q_lora ? mla.q_a : mla.q) = mla.in.narrow(1, 0, q_in);
  mla.kv_a = mla.in.narrow(1, q_in, s.cache_row());
  if (q_lora) mla.q = work_view(act, n, s.q_dim(), off);
  mla.q_att = work_view(act, n, heads * s.cache_row(), off);
  mla.o_lat = work_view(act, n, heads * s.kv_lora_rank, off);
  mla.o = work_view(act, n, heads * s.v_dim, off);
  Tensor x_rows = work_view(act, R, c.hidden_size, off);
  Tensor h_rows = work_view(act, R, c.hidden_size, off);
  // Dense MLPs differ in width (intermediate_size, the shared experts'); each
  // gets views of its own width over the same buffers.
  const size_t ffn_offset = off;  // gate and up buffers, also viewed as one [n, 2 f] for fused weights
  Tensor ffn_gate = work_view(act, n, ffn_scratch_, off);
  Tensor ffn_up = work_view(act, n, ffn_scratch_, off);
  Tensor ffn_act = work_view(act, n, ffn_scratch_, off);
  Tensor router_logits, expert_ids, expert_weights, moe_ws;
  if (has_moe_) {
    router_logits = work_view(DType::F32, n, c.moe.n_experts, off);
    expert_ids = work_view(DType::I32, n, c.moe.n_experts_used, off);
    expert_weights = work_view(DType::F32, n, c.moe.n_experts_used, off);
    moe_ws = workspace_.view(DType::U8, {static_cast<int64_t>(moe_workspace_bytes_)}, off);
    off += (moe_workspace_bytes_ + 63) & ~size_t{63};
  }
  const Tensor ep_out = ep_ ? work_view(act, n, c.hidden_size, off) : Tensor();
  auto mlp_scratch = [&](const layers::MlpWeights& w) {
    const int64_t f = layers::mlp_ffn(w);
    if (w.w_gate_up.defined()) {
      size_t at = ffn_offset;  // 2 n f elements fit the two n x ffn_scratch_ buffers
      return layers::MlpScratch{Tensor(), Tensor(), ffn_act.narrow(1, 0, f), work_view(act, n, 2 * f, at)};
    }
    return layers::MlpScratch{ffn_gate.narrow(1, 0, f), ffn_up.narrow(1, 0, f), ffn_act.narrow(1, 0, f), Tensor()};
  };

  const RopeParams rope{inv_freq_, s.rope_dim, c.rope_style, rope_attention_factor(c, false)};
  AttentionParams params;
  params.scale = attention_scale_;
  const float eps = c.rms_eps;

  if (mtp_layer_ >= 0) {
    mtp_input(in, x, h, delta);
  } else {
    tp_.embed(backend_, token_embd_, in.token_ids, c.vocab_size, x);
  }
  int64_t moe_index = 0;  // row of in.expert_counts
  for (int i = 0; i < static_cast<int>(layers_.size()); ++i) {
    const Layer& l = layers_[i];
    // The MTP layer's KV is its layer of the target's cache.
    const int32_t kv_layer = mtp_layer_ >= 0 ? mtp_layer_ : i;
    if (i == 0) {
      ops::rms_norm(backend_, x, l.attn_norm, eps, 0.0f, h);
    } else {
      ops::add_rms_norm(backend_, x, delta, l.attn_norm, eps, 0.0f, h);
    }
    layers::mla_layer(backend_, l.mla, s, rope, params, h, in, in.kv_groups[kv.group_of_layer(kv_layer)],
                      kv.layer(kv_layer), mla, delta);
    tp_.reduce(delta);
    ops::add_rms_norm(backend_, x, delta, l.ffn_norm, eps, 0.0f, h);
    if (!l.moe.router.defined()) {
      layers::mlp_layer(backend_, l.mlp, c.activation, h, mlp_scratch(l.mlp), delta);
      tp_.reduce(delta);
      continue;
    }
    // Shared experts: every token, no gate; the routed experts add onto them.
    const bool shared = l.mlp.w_down.defined();
    if (l.ep_layer >= 0) {
      // Every rank ends with every row of the routed experts' output; the
      // shared experts are whole on every rank (expert parallelism).
      const Tensor counts = in.expert_counts.defined() ? in.expert_counts.row(moe_index++) : Tensor();
      ep_->forward(static_cast<size_t>(l.ep_layer), l.moe, l.route, c.activation, h, shared ? ep_out : delta,
                   counts, in.padding_mask());
      if (shared) {
        layers::mlp_layer(backend_, l.mlp, c.activation, h, mlp_scratch(l.mlp), delta);
        ops::add(backend_, delta, ep_out, delta);
      }
      continue;
    }
    if (shared) layers::mlp_layer(backend_, l.mlp, c.activation, h, mlp_scratch(l.mlp), delta);
    ops::linear(backend_, h, l.moe.router, Tensor(), router_logits);
    ops::moe_route(backend_, router_logits, l.route, expert_ids, expert_weights);
    if (in.expert_counts.defined()) {
      ops::count_experts(backend_, expert_ids, in.padding_mask(), in.expert_counts.row(moe_index++));
    }
    ops::moe_experts(backend_, h, expert_ids, expert_weights, l.moe.experts, c.activation, shared, moe_ws, delta);
    tp_.reduce(delta);
  }
  ops::add(backend_, x, delta, x);
  if (in.hidden_out.defined() && mtp_layer_ < 0) {
    // The target's hidden states as an MTP layer takes them: after the norm.
    ops::rms_norm(backend_, x, output_norm_, eps, 0.0f, in.hidden_out);
    ops::gather_rows(backend_, in.hidden_out, in.logit_rows, h_rows);
  } else {
    if (in.hidden_out.defined()) backend_.copy(in.hidden_out, x);
    ops::gather_rows(backend_, x, in.logit_rows, x_rows);
    ops::rms_norm(backend_, x_rows, output_norm_, eps, 0.0f, h_rows);
  }
  tp_.logits(backend_, h_rows, output_, logits, workspace_, off);
}

const moe::ExpertPlacement* DeepseekModel::expert_placement(size_t moe_layer) const {
  return ep_ ? ep_->find_placement(moe_layer) : nullptr;
}

void DeepseekModel::set_expert_placement(size_t moe_layer, const moe::ExpertPlacement& placement) {
  if (!ep_) Model::set_expert_placement(moe_layer, placement);  // refuses
  ep_->set_placement(moe_layer, placement);
}

}  // namespace deepinfer
