#include "engine/output_processor.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

OutputProcessor::OutputProcessor(const SamplingParams& params, const Tokenizer& tokenizer)
    : params_(params), eos_ids_(tokenizer.eos_ids()), detokenizer_(tokenizer, params.skip_special_tokens) {
  for (const auto& s : params.stop) max_stop_len_ = std::max(max_stop_len_, s.size());
}

FinishReason OutputProcessor::add_token(Request& r, const SampleResult& result, int32_t max_model_len,
                                        RequestOutput& out) {
  const SamplingParams& p = params_;
  const int32_t token = result.token;
  r.append_output(token);
  TokenOutput t;
  t.token = token;
  if (p.logprobs) {
    t.logprob = result.logprob;
    t.rank = result.rank;
    auto top = result.top_logprobs();
    t.top.assign(top.begin(), top.end());
  }
  out.new_tokens.push_back(std::move(t));

  const bool min_reached = r.num_output_tokens() >= p.min_tokens;
  const bool is_eos = !p.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
  const bool is_stop_token =
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  if (min_reached && (is_eos || is_stop_token)) {
    if (is_stop_token && !is_eos) {
      // Like EOS, a stop token's text is part of the output only when it is not special.
      text_ += detokenizer_.push(token);
      out.stop_reason = std::to_string(token);
    }
    return FinishReason::Stop;
  }
  text_ += detokenizer_.push(token);
  if (!p.stop.empty() && min_reached) {
    const size_t from = emitted_ >= max_stop_len_ ? emitted_ - max_stop_len_ + 1 : 0;
    size_t best = std::string::npos;
    const std::string* matched = nullptr;
    for (const auto& s : p.stop) {
      size_t pos = text_.find(s, from);
      if (pos != std::string::npos && (best == std::string::npos || pos < best)) {
        best = pos;
        matched = &s;
      }
    }
    if (matched) {
      text_.resize(best + (p.include_stop_str_in_output ? matched->size() : 0));
      out.stop_reason = *matched;
      return FinishReason::Stop;
    }
  }
  if (r.num_output_tokens() >= *p.max_tokens || r.num_tokens() >= max_model_len) return FinishReason::Length;
  // Hold back a tail that could still grow into a stop string.
  size_t safe = text_.size();
  if (!p.stop.empty()) safe = text_.size() > max_stop_len_ - 1 ? text_.size() - (max_stop_len_ - 1) : 0;
  if (safe > emitted_) {
    out.new_text += text_.substr(emitted_, safe - emitted_);
    emitted_ = safe;
  }
  return FinishReason::None;
}

void OutputProcessor::finish(FinishReason reason, RequestOutput& out) {
  if (reason != FinishReason::Abort && out.stop_reason.empty()) {
    // Nothing more will arrive: flush bytes held back for UTF-8 completeness.
    text_ += detokenizer_.finish();
  }
  if (emitted_ < text_.size()) out.new_text += text_.substr(emitted_);
  emitted_ = text_.size();
  out.finished = true;
  out.finish_reason = reason;
}

}  // namespace deepinfer
