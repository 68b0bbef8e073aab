#include "model/decoder_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "dist/communicator.h"
#include "model/expert_parallel.h"
#include "ops/ops.h"

namespace deepinfer {

void Model::set_expert_placement(size_t, const moe::ExpertPlacement&) {
  fail("this model's experts are not spread over ranks (--enable-expert-parallel)");
}

KvCacheSpec Model::kv_spec(int32_t page_size, DType dtype) const {
  const ModelConfig& c = config();
  return KvCacheSpec{c.n_layers, c.n_heads_kv, c.head_dim, page_size, dtype};
}

DecoderModel::DecoderModel(ModelConfig config, const WeightSource& full_source, Backend& backend, TensorParallel tp)
    : config_(std::move(config)), backend_(backend), store_(backend) {
  config_.validate();
  const WeightSource* shard_source = &full_source;
  if (tp.active()) {
    RankShard shard = shard_for_rank(config_, full_source, tp);
    tp_ = shard.forward;
    sharded_ = std::move(shard.source);
    shard_source = sharded_.get();
  }
  ep_ = ExpertParallelMoe::for_ranks(backend_, tp);
  const WeightSource& source = *shard_source;
  const ModelConfig& c = config_;
  for (int i = 0; i < c.n_layers; ++i) has_moe_ = has_moe_ || c.is_moe(i);
  route_.top_k = c.moe.n_experts_used;
  route_.renormalize = c.moe.norm_topk_prob;
  const int64_t H = c.hidden_size, F = c.intermediate_size, D = c.head_dim;
  const int64_t q_dim = int64_t{c.n_heads_q} * D, kv_dim = int64_t{c.n_heads_kv} * D;

  WeightLoader load(source, store_);
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
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = fmt::format("blk.{}.", i);
    Layer& l = layers_[i];
    l.local = c.is_sliding(i);
    l.attn_norm = load.vector(p + "attn_norm.weight", H);
    const Tensor hq = load.host_matrix(p + "attn_q.weight", q_dim, H);
    const Tensor hk = load.host_matrix(p + "attn_k.weight", kv_dim, H);
    const Tensor hv = load.host_matrix(p + "attn_v.weight", kv_dim, H);
    l.attn.wqkv = store_.fused_matrix({hq, hk, hv});
    if (!l.attn.wqkv.defined()) {
      l.attn.wq = store_.linear_weight(hq);
      l.attn.wk = store_.linear_weight(hk);
      l.attn.wv = store_.linear_weight(hv);
    }
    l.attn.wo = load.linear(p + "attn_output.weight", H, q_dim);
    if (c.output_bias) l.attn.bo = load.vector(p + "attn_output.bias", H);
    if (c.attn_sinks) l.sinks = load.vector(p + "attn_sinks.weight", c.n_heads_q);
    if (c.qkv_bias) {
      if (l.attn.wqkv.defined()) {
        l.attn.bqkv = store_.f32_concat({load.host_vector(p + "attn_q.bias", q_dim),
                                         load.host_vector(p + "attn_k.bias", kv_dim),
                                         load.host_vector(p + "attn_v.bias", kv_dim)});
      } else {
        l.attn.bq = load.vector(p + "attn_q.bias", q_dim);
        l.attn.bk = load.vector(p + "attn_k.bias", kv_dim);
        l.attn.bv = load.vector(p + "attn_v.bias", kv_dim);
      }
    }
    if (c.qk_norm) {
      l.attn.q_norm = load.vector(p + "attn_q_norm.weight", D);
      l.attn.k_norm = load.vector(p + "attn_k_norm.weight", D);
    }
    l.ffn_norm = load.vector(p + "ffn_norm.weight", H);
    if (c.post_norms) {
      l.post_attn_norm = load.vector(p + "post_attention_norm.weight", H);
      l.post_ffw_norm = load.vector(p + "post_ffw_norm.weight", H);
    } else {
      l.post_attn_norm = load.optional_vector(p + "post_attention_norm.weight", H);
    }
    if (c.is_moe(i)) {
      load_moe(l, load, p);
    } else {
      l.mlp = layers::load_mlp(load, store_, p, "", F, H);
    }
  }
  inv_freq_global_ = store_.f32_vector(rope_inv_freq(c, false));
  inv_freq_local_ = store_.f32_vector(rope_inv_freq(c, true));
  weight_bytes_ = load.bytes();
}

void DecoderModel::load_moe(Layer& l, WeightLoader& load, const std::string& p) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, E = c.moe.n_experts, F = c.moe.expert_ffn_size, S = c.moe.shared_ffn_size;
  const int64_t used = c.moe.n_experts_used;
  layers::MoeWeights& m = l.moe;
  m.router = load.matrix(p + "ffn_gate_inp.weight", E, H);
  if (c.moe.router_bias) m.router_bias = load.vector(p + "ffn_gate_inp.bias", E);
  if (ep_) {
    // This rank's slots only, copied out of the checkpoint's stacks.
    MoeExpertWeights full;
    const int32_t ranks = ep_->num_ranks();
    full.gate = load.host_experts(p + "ffn_gate_exps.weight", E, F, H, used, ranks);
    full.up = load.host_experts(p + "ffn_up_exps.weight", E, F, H, used, ranks);
    full.down = load.host_experts(p + "ffn_down_exps.weight", E, H, F, used, ranks);
    if (c.moe.expert_bias) {
      full.gate_bias = load.f32_table(p + "ffn_gate_exps.bias", E, F);
      full.up_bias = load.f32_table(p + "ffn_up_exps.bias", E, F);
      full.down_bias = load.f32_table(p + "ffn_down_exps.bias", E, H);
    }
    l.ep_layer = static_cast<int32_t>(ep_->num_layers());
    ep_->add_layer(full, moe::contiguous_placement(static_cast<int32_t>(E), ranks));
  } else {
    m.experts.gate = load.expert_stack(p + "ffn_gate_exps.weight", E, F, H, used);
    m.experts.up = load.expert_stack(p + "ffn_up_exps.weight", E, F, H, used);
    m.experts.down = load.expert_stack(p + "ffn_down_exps.weight", E, H, F, used);
    if (c.moe.expert_bias) {
      m.experts.gate_bias = load.f32_table(p + "ffn_gate_exps.bias", E, F);
      m.experts.up_bias = load.f32_table(p + "ffn_up_exps.bias", E, F);
      m.experts.down_bias = load.f32_table(p + "ffn_down_exps.bias", E, H);
    }
  }
  if (S > 0) {
    DI_CHECK(c.moe.shared_expert_gate, "{}: shared experts without a gate are not supported yet", c.arch);
    m.shared.gate = load.matrix(p + "ffn_gate_shexp.weight", S, H).reshape({1, S, H});
    m.shared.up = load.matrix(p + "ffn_up_shexp.weight", S, H).reshape({1, S, H});
    m.shared.down = load.matrix(p + "ffn_down_shexp.weight", H, S).reshape({1, H, S});
    m.shared_gate = load.matrix(p + "ffn_gate_inp_shexp.weight", 1, H);
  }
}

Tensor DecoderModel::act_view(int64_t rows, int64_t cols, size_t& offset) const {
  return work_view(backend_.activation_dtype(), rows, cols, offset);
}

Tensor DecoderModel::work_view(DType dtype, int64_t rows, int64_t cols, size_t& offset) const {
  Tensor t = workspace_.view(dtype, {rows, cols}, offset);
  offset += (t.nbytes() + 63) & ~size_t{63};
  return t;
}

layers::MoeScratch DecoderModel::moe_scratch(int64_t n, size_t& offset) const {
  const ModelConfig& c = config_;
  const int64_t k = c.moe.n_experts_used;
  layers::MoeScratch s;
  s.router_logits = work_view(DType::F32, n, c.moe.n_experts, offset);
  s.expert_ids = work_view(DType::I32, n, k, offset);
  s.expert_weights = work_view(DType::F32, n, k, offset);
  s.shared_logits = work_view(DType::F32, n, 1, offset);
  s.shared_ids = work_view(DType::I32, n, 1, offset);
  s.shared_weights = work_view(DType::F32, n, 1, offset);
  s.workspace = workspace_.view(DType::U8, {static_cast<int64_t>(moe_workspace_bytes_)}, offset);
  offset += (moe_workspace_bytes_ + 63) & ~size_t{63};
  return s;
}

void DecoderModel::reserve(int32_t max_tokens, int32_t max_logit_rows) {
  DI_CHECK(max_tokens > 0 && max_logit_rows > 0 && max_logit_rows <= max_tokens,
           "invalid activation reservation ({} tokens, {} logit rows)", max_tokens, max_logit_rows);
  if (max_tokens <= max_tokens_ && max_logit_rows <= max_logit_rows_) return;
  const ModelConfig& c = config_;
  const size_t T = static_cast<size_t>(max_tokens), R = static_cast<size_t>(max_logit_rows);
  const size_t q_dim = size_t(c.n_heads_q) * c.head_dim, kv_dim = size_t(c.n_heads_kv) * c.head_dim;
  // Sized for 4-byte elements, enough for any activation dtype.
  auto padded = [](size_t elems) { return (elems * 4 + 63) & ~size_t{63}; };
  size_t bytes = 3 * padded(T * c.hidden_size) + 2 * padded(T * q_dim) + 2 * padded(T * kv_dim) +
                 3 * padded(T * c.intermediate_size) + 2 * padded(R * c.hidden_size);
  if (has_moe_) {
    const size_t k = static_cast<size_t>(c.moe.n_experts_used);
    // Router logits, ids and weights of the routed and the shared experts.
    bytes += padded(T * c.moe.n_experts) + 2 * padded(T * k) + 3 * padded(T);
    moe_workspace_bytes_ = 0;
    for (const Layer& l : layers_) {
      if (!l.moe.router.defined()) continue;
      if (l.ep_layer < 0) {  // expert-parallel layers keep their own (expert_parallel.h)
        moe_workspace_bytes_ = std::max(moe_workspace_bytes_,
                                        ops::moe_workspace_bytes(backend_, max_tokens, route_.top_k, l.moe.experts));
      }
      if (l.moe.shared.gate.defined()) {
        moe_workspace_bytes_ =
            std::max(moe_workspace_bytes_, ops::moe_workspace_bytes(backend_, max_tokens, 1, l.moe.shared));
      }
    }
    bytes += (moe_workspace_bytes_ + 63) & ~size_t{63};
  }
  bytes += padded(tp_.logits_scratch_floats(max_logit_rows));  // this rank's logits and everyone's
  workspace_ = Buffer(backend_, bytes);
  max_tokens_ = max_tokens;
  max_logit_rows_ = max_logit_rows;
}

void DecoderModel::forward(const ForwardInputs& in, const KvStorage& kv, Tensor logits) {
  const ModelConfig& c = config_;
  const int64_t n = in.num_tokens;
  const int64_t R = in.logit_rows.numel();
  DI_CHECK(n > 0 && n <= max_tokens_ && R <= max_logit_rows_,
           "step of {} tokens / {} logit rows exceeds the reserved {} / {}", n, R, max_tokens_,
           max_logit_rows_);
  size_t off = 0;
  Tensor x = act_view(n, c.hidden_size, off);
  Tensor h = act_view(n, c.hidden_size, off);
  Tensor delta = act_view(n, c.hidden_size, off);
  const int64_t q_dim = int64_t{c.n_heads_q} * c.head_dim, kv_dim = int64_t{c.n_heads_kv} * c.head_dim;
  layers::AttentionScratch attn;
  layers::MlpScratch mlp;
  if (backend_.stacks_projections()) {
    // The projections are stacked (WeightStore::fused_matrix); a layer that
    // could not be stacked writes into column ranges of the same buffers.
    // Same bytes as the separate buffers.
    const int64_t F = c.intermediate_size;
    attn.qkv = act_view(n, q_dim + 2 * kv_dim, off);
    attn.q = attn.qkv.narrow(1, 0, q_dim);
    attn.k = attn.qkv.narrow(1, q_dim, kv_dim);
    attn.v = attn.qkv.narrow(1, q_dim + kv_dim, kv_dim);
    attn.out = act_view(n, q_dim, off);
    mlp.gate_up = act_view(n, 2 * F, off);
    mlp.gate = mlp.gate_up.narrow(1, 0, F);
    mlp.up = mlp.gate_up.narrow(1, F, F);
    mlp.act = act_view(n, F, off);
  } else {
    attn.q = act_view(n, q_dim, off);
    attn.k = act_view(n, kv_dim, off);
    attn.v = act_view(n, kv_dim, off);
    attn.out = act_view(n, q_dim, off);
    mlp.gate = act_view(n, c.intermediate_size, off);
    mlp.up = act_view(n, c.intermediate_size, off);
    mlp.act = act_view(n, c.intermediate_size, off);
  }
  Tensor x_rows = act_view(R, c.hidden_size, off);
  Tensor h_rows = act_view(R, c.hidden_size, off);
  const layers::MoeScratch moe = has_moe_ ? moe_scratch(n, off) : layers::MoeScratch{};

  const layers::AttentionShape shape{c.n_heads_q, c.n_heads_kv, c.head_dim, c.rms_eps,
                                     c.norm_weight_offset};
  const float scale = c.attention_scale > 0 ? c.attention_scale : 1.0f / std::sqrt(float(c.head_dim));
  const int rot = c.rotary_dim ? c.rotary_dim : c.head_dim;
  const float eps = c.rms_eps, off1 = c.norm_weight_offset;

  tp_.embed(backend_, token_embd_, in.token_ids, c.vocab_size, x);
  if (c.embedding_scale != 1.0f) ops::scale(backend_, x, c.embedding_scale, x);

  int64_t moe_index = 0;  // row of in.expert_counts
  for (int i = 0; i < c.n_layers; ++i) {
    const Layer& l = layers_[i];
    // The previous sub-layer's output (delta) joins the residual stream here,
    // fused with the next norm.
    if (i == 0) {
      ops::rms_norm(backend_, x, l.attn_norm, eps, off1, h);
    } else {
      ops::add_rms_norm(backend_, x, delta, l.attn_norm, eps, off1, h);
    }
    RopeParams rope{l.local ? inv_freq_local_ : inv_freq_global_, rot, c.rope_style,
                    rope_attention_factor(c, l.local)};
    AttentionParams params;
    params.scale = scale;
    params.sliding_window = c.layer_window[i];
    params.sinks = l.sinks;
    layers::attention_layer(backend_, l.attn, shape, rope, params, h, in, in.kv_groups[kv.group_of_layer(i)],
                            kv.layer(i), attn, delta);
    tp_.reduce(delta);
    if (l.post_attn_norm.defined()) ops::rms_norm(backend_, delta, l.post_attn_norm, eps, off1, delta);
    ops::add_rms_norm(backend_, x, delta, l.ffn_norm, eps, off1, h);
    if (l.ep_layer >= 0) {
      // Every rank ends with every row of its own: no partial sums to add.
      const Tensor counts = in.expert_counts.defined() ? in.expert_counts.row(moe_index++) : Tensor();
      ep_->forward(static_cast<size_t>(l.ep_layer), l.moe, route_, c.activation, h, delta, counts, in.padding_mask());
    } else if (l.moe.router.defined()) {
      const Tensor counts = in.expert_counts.defined() ? in.expert_counts.row(moe_index++) : Tensor();
      layers::moe_layer(backend_, l.moe, route_, c.activation, h, moe, delta, in.padding_mask(), counts);
      tp_.reduce(delta);
    } else {
      layers::mlp_layer(backend_, l.mlp, c.activation, h, mlp, delta);
      tp_.reduce(delta);
    }
    if (l.post_ffw_norm.defined()) ops::rms_norm(backend_, delta, l.post_ffw_norm, eps, off1, delta);
  }
  // Only the rows that produce logits need the last residual add.
  ops::gather_rows(backend_, x, in.logit_rows, x_rows);
  ops::gather_rows(backend_, delta, in.logit_rows, h_rows);
  ops::add(backend_, x_rows, h_rows, x_rows);
  ops::rms_norm(backend_, x_rows, output_norm_, eps, off1, h_rows);
  tp_.logits(backend_, h_rows, output_, logits, workspace_, off);
}

const moe::ExpertPlacement* DecoderModel::expert_placement(size_t moe_layer) const {
  return ep_ ? ep_->find_placement(moe_layer) : nullptr;
}

void DecoderModel::set_expert_placement(size_t moe_layer, const moe::ExpertPlacement& placement) {
  if (!ep_) Model::set_expert_placement(moe_layer, placement);  // refuses
  ep_->set_placement(moe_layer, placement);
}

}  // namespace deepinfer
