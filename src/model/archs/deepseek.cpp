// DeepSeek-V2 / V3: Multi-head Latent Attention (model/layers/mla_layer.h) and
// DeepSeek MoE (routed experts plus always-on shared experts without a gate;
// the first first_k_dense_replace layers dense). Routing follows transformers:
//  - V2: softmax scores; topk_method "greedy" (plain top-k) or
//    "group_limited_greedy" (top-k within the topk_group groups whose best
//    expert scores highest); weights = scores x routed_scaling_factor.
//  - V3 ("noaux_tc"): sigmoid scores; experts ranked by score +
//    e_score_correction_bias within the topk_group groups whose two best
//    ranked scores sum highest; weights = unbiased scores, renormalised when
//    norm_topk_prob, x routed_scaling_factor.
// Rope covers the qk_rope_head_dim part only; DeepSeek lays its pairs out
// interleaved (V3's rope_interleave=false: half-split).
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/arch_registry.h"

namespace deepinfer {

namespace {

using arch_util::hf_bool;
using arch_util::hf_int;
using arch_util::hf_required_int;

using arch_util::hf_float;
using arch_util::hf_string;

void read_mla(const nlohmann::json& cfg, ModelConfig& c) {
  MlaConfig& m = c.mla;
  // null = no q compression (DeepSeek-V2-Lite); a missing key would silently
  // mean transformers' default rank, so it must be spelled out.
  DI_CHECK(cfg.contains("q_lora_rank"), "config.json: missing field 'q_lora_rank' (null for a plain q_proj)");
  m.q_lora_rank = hf_int(cfg, "q_lora_rank", 0);
  m.kv_lora_rank = hf_required_int(cfg, "kv_lora_rank");
  m.qk_nope_head_dim = hf_required_int(cfg, "qk_nope_head_dim");
  m.qk_rope_head_dim = hf_required_int(cfg, "qk_rope_head_dim");
  m.v_head_dim = hf_required_int(cfg, "v_head_dim");
  m.attention_bias = hf_bool(cfg, "attention_bias", false);
  DI_CHECK(m.q_lora_rank >= 0 && m.q_lora_rank <= 65536, "config.json: q_lora_rank {} out of range", m.q_lora_rank);
  DI_CHECK(m.kv_lora_rank > 0 && m.kv_lora_rank <= 4096, "config.json: kv_lora_rank {} must be in [1, 4096]",
           m.kv_lora_rank);
  DI_CHECK(m.qk_rope_head_dim > 0 && m.qk_rope_head_dim % 2 == 0 && m.qk_rope_head_dim <= 1024,
           "config.json: qk_rope_head_dim {} must be even and in [2, 1024]", m.qk_rope_head_dim);
  DI_CHECK(m.qk_nope_head_dim > 0 && m.qk_nope_head_dim <= 1024, "config.json: qk_nope_head_dim {} out of range",
           m.qk_nope_head_dim);
  DI_CHECK(m.v_head_dim > 0 && m.v_head_dim <= 1024, "config.json: v_head_dim {} out of range", m.v_head_dim);
  // The generic fields describe the query/key heads; the cache has one latent
  // head (Model::kv_spec of DeepseekModel) and rope covers the rope part only.
  c.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  c.n_heads_kv = c.n_heads_q;
  c.rotary_dim = m.qk_rope_head_dim;
}

void read_moe(const nlohmann::json& cfg, bool v3, ModelConfig& c) {
  MoeConfig& moe = c.moe;
  moe.n_experts = hf_required_int(cfg, "n_routed_experts");
  moe.n_experts_used = hf_required_int(cfg, "num_experts_per_tok");
  moe.expert_ffn_size = hf_required_int(cfg, "moe_intermediate_size");
  const int32_t n_shared = hf_required_int(cfg, "n_shared_experts");
  DI_CHECK(n_shared >= 0 && n_shared <= 64, "config.json: n_shared_experts {} out of range", n_shared);
  moe.shared_ffn_size = n_shared * moe.expert_ffn_size;
  moe.shared_expert_gate = false;
  moe.routed_scaling = hf_float(cfg, "routed_scaling_factor", 1.0f);
  DI_CHECK(std::isfinite(moe.routed_scaling) && moe.routed_scaling > 0,
           "config.json: routed_scaling_factor must be positive, got {}", moe.routed_scaling);
  DI_CHECK(moe.n_experts > 0 && moe.n_experts <= 4096, "config.json: n_routed_experts {} out of range",
           moe.n_experts);
  DI_CHECK(moe.n_experts_used > 0 && moe.n_experts_used <= moe.n_experts,
           "config.json: num_experts_per_tok {} must be between 1 and the number of experts ({})",
           moe.n_experts_used, moe.n_experts);

  const std::string method = hf_string(cfg, "topk_method", v3 ? "noaux_tc" : "greedy");
  const std::string scoring = hf_string(cfg, "scoring_func", v3 ? "sigmoid" : "softmax");
  bool grouped = false;
  if (v3) {
    // transformers' DeepseekV3 router always does noaux_tc.
    DI_CHECK(method == "noaux_tc", "config.json: topk_method '{}' is not supported for DeepSeek-V3 (only noaux_tc)",
             method);
    DI_CHECK(scoring == "sigmoid", "config.json: scoring_func '{}' is not supported for DeepSeek-V3 (only sigmoid)",
             scoring);
    moe.scoring = MoeScoring::Sigmoid;
    moe.group_score = MoeGroupScore::TopTwoSum;
    moe.correction_bias = true;
    moe.norm_topk_prob = hf_bool(cfg, "norm_topk_prob", true);
    grouped = true;
  } else {
    DI_CHECK(method == "greedy" || method == "group_limited_greedy",
             "config.json: topk_method '{}' is not supported for DeepSeek-V2 (greedy or group_limited_greedy)",
             method);
    DI_CHECK(scoring == "softmax", "config.json: scoring_func '{}' is not supported for DeepSeek-V2 (only softmax)",
             scoring);
    // transformers' DeepseekV2 router never renormalises; DeepSeek's own code
    // would (and then skip the scaling): refuse rather than pick one.
    DI_CHECK(!hf_bool(cfg, "norm_topk_prob", false),
             "config.json: norm_topk_prob=true is not supported for DeepSeek-V2 (transformers ignores it)");
    moe.scoring = MoeScoring::Softmax;
    moe.group_score = MoeGroupScore::Max;
    grouped = method == "group_limited_greedy";
  }
  if (grouped) {
    moe.n_groups = hf_required_int(cfg, "n_group");
    moe.top_k_groups = hf_required_int(cfg, "topk_group");
    DI_CHECK(moe.n_groups > 0 && moe.n_experts % moe.n_groups == 0,
             "config.json: n_group {} must divide the {} routed experts", moe.n_groups, moe.n_experts);
    const int32_t group_size = moe.n_experts / moe.n_groups;
    DI_CHECK(moe.top_k_groups >= 1 && moe.top_k_groups <= moe.n_groups &&
                 moe.n_experts_used <= moe.top_k_groups * group_size,
             "config.json: topk_group {} must be in [1, n_group {}] and its groups must hold num_experts_per_tok {}",
             moe.top_k_groups, moe.n_groups, moe.n_experts_used);
    DI_CHECK(!v3 || moe.n_groups == 1 || group_size >= 2,
             "config.json: DeepSeek-V3 ranks groups by their two best experts, so groups need at least 2 ({} "
             "experts in {} groups)",
             moe.n_experts, moe.n_groups);
  }

  const int32_t first_dense = hf_int(cfg, "first_k_dense_replace", 0);
  DI_CHECK(first_dense >= 0 && first_dense <= c.n_layers,
           "config.json: first_k_dense_replace {} must be in [0, num_hidden_layers {}]", first_dense, c.n_layers);
  // transformers makes every layer from first_k_dense_replace on MoE and
  // ignores moe_layer_freq; every published checkpoint has 1.
  const int32_t freq = hf_int(cfg, "moe_layer_freq", 1);
  DI_CHECK(freq == 1, "config.json: moe_layer_freq {} is not supported (only 1)", freq);
  c.layer_moe.assign(c.n_layers, 0);
  for (int i = first_dense; i < c.n_layers; ++i) c.layer_moe[i] = 1;
}

ModelConfig deepseek_from_hf(const nlohmann::json& cfg, std::string_view hf_arch) {
  ModelConfig c = arch_util::hf_dense_base(cfg, hf_arch);
  const bool v3 = hf_arch == "DeepseekV3ForCausalLM";
  c.arch = v3 ? "deepseek3" : "deepseek2";
  read_mla(cfg, c);
  read_moe(cfg, v3, c);
  c.rope_style = !v3 || hf_bool(cfg, "rope_interleave", true) ? RopeStyle::Interleaved : RopeStyle::Neox;
  c.mtp_layers = hf_int(cfg, "num_nextn_predict_layers", 0);
  DI_CHECK(c.mtp_layers >= 0 && c.mtp_layers <= 16, "config.json: num_nextn_predict_layers {} must be in [0, 16]",
           c.mtp_layers);
  DI_CHECK(c.rope_scaling.type == RopeScalingType::None || c.rope_scaling.type == RopeScalingType::Yarn,
           "config.json: {} supports default or yarn rope scaling only", hf_arch);
  const auto act = cfg.find("hidden_act");
  DI_CHECK(act == cfg.end() || (act->is_string() && act->get<std::string>() == "silu"),
           "config.json: hidden_act {} is not supported for {} (only \"silu\")", act->dump(), hf_arch);
  DI_CHECK(!hf_bool(cfg, "mlp_bias", false), "config.json: mlp_bias is not supported for {}", hf_arch);
  return c;
}

}  // namespace

extern const ArchSpec kDeepseekArch{
    "deepseek",
    {},
    {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"},
    nullptr,
    deepseek_from_hf,
    true,
};

}  // namespace deepinfer
