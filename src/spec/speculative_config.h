// SpeculativeConfig: how (and whether) the engine drafts tokens for the
// target model to verify. Parsed from the vLLM-shaped JSON of
// --speculative-config, e.g. {"method": "ngram", "num_speculative_tokens": 5}.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::spec {

enum class SpecMethod : uint8_t { None, Ngram, Suffix, DraftModel, Mtp };

std::string_view to_string(SpecMethod m);

struct SpeculativeConfig {
  SpecMethod method = SpecMethod::None;
  // Drafts per request and step at most (K).
  int32_t num_speculative_tokens = 5;
  // DSpark's dynamic verify length: verify, per request, only the prefix of
  // its drafts that maximises the batch's expected accepted tokens per second
  // on the measured step-time curve. false: verify every draft (fixed K).
  bool dynamic = true;
  // With dynamic: steps per window of the throughput switch, which keeps
  // speculation off while windows without it produce more tokens per second
  // (speculation_switch.h); 0 turns the switch off.
  int32_t switch_window_steps = 24;
  // ... consulted only while speculating steps leave the device idle over
  // this share of the time (engine/speculator.h); 0: always.
  double switch_idle_share = 0.05;
  // n-gram (prompt lookup): the suffix lengths tried.
  int32_t prompt_lookup_min = 2;
  int32_t prompt_lookup_max = 4;
  // Suffix decoding: depth of the suffix trees, the least cumulative
  // probability a draft continues with, and the tokens of finished outputs the
  // global tree keeps (0: no global tree).
  int32_t suffix_max_depth = 24;
  float suffix_min_token_prob = 0.1f;
  int64_t suffix_global_max_tokens = 1 << 20;
  // Threads that draft for a large batch (n-gram and suffix: each request's
  // proposer state is its own; the device waits for the drafts): 0 = half
  // the cores, at most 4; 1 = the engine thread only.
  int32_t drafting_threads = 0;
  // Draft model: a GGUF file or Hugging Face folder of a model with the
  // target's vocabulary, run by its own engine (its own KV cache).
  std::string draft_model;

  bool enabled() const { return method != SpecMethod::None; }

  // Throws deepinfer::Error naming the field on malformed or unsupported
  // input (unknown keys, values out of range, methods not built yet).
  static SpeculativeConfig parse(std::string_view json);
  std::string to_json() const;
};

}  // namespace deepinfer::spec
