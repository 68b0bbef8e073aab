// OutputProcessor: one request's side of the outputs. Turns each sampled
// token into what the caller sees — the token with its logprobs, text
// detokenized incrementally, stop tokens and stop strings, the length limit —
// and holds back text that could still become a stop string.
#pragma once

#include <string>
#include <vector>

#include "engine/request_output.h"
#include "runner/sampler.h"
#include "sched/request.h"
#include "tokenizer/streaming_detokenizer.h"

namespace deepinfer {

class Tokenizer;

class OutputProcessor {
 public:
  OutputProcessor(const SamplingParams& params, const Tokenizer& tokenizer);

  // Appends `result` to the request's outputs and to `out`. Returns the
  // reason the request ends with this token (Stop or Length), None otherwise;
  // on an end, call finish() with it.
  FinishReason add_token(Request& request, const SampleResult& result, int32_t max_model_len, RequestOutput& out);
  // Releases the text held back (all of it unless a stop string cut it) and
  // marks `out` finished.
  void finish(FinishReason reason, RequestOutput& out);

 private:
  const SamplingParams& params_;
  const std::vector<int32_t>& eos_ids_;
  StreamingDetokenizer detokenizer_;
  std::string text_;    // detokenized output so far (truncated at a matched stop string)
  size_t emitted_ = 0;  // bytes of text_ already returned to the caller
  size_t max_stop_len_ = 0;
};

}  // namespace deepinfer
