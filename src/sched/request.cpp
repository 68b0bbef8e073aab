#include "sched/request.h"

namespace deepinfer {

std::string_view to_string(RequestState s) {
  switch (s) {
    case RequestState::Waiting: return "waiting";
    case RequestState::Running: return "running";
    case RequestState::Preempted: return "preempted";
    case RequestState::Finished: return "finished";
    case RequestState::Aborted: return "aborted";
  }
  return "?";
}

std::string_view to_string(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
  }
  return "?";
}

Request::Request(uint64_t id, std::vector<int32_t> prompt_ids, SamplingParams params, uint64_t seed,
                 std::string cache_salt)
    : id_(id),
      prompt_ids_(std::move(prompt_ids)),
      params_(std::move(params)),
      seed_(seed),
      cache_salt_(std::move(cache_salt)) {
  timings.arrival = Clock::now();
}

std::vector<int32_t> Request::all_tokens() const {
  std::vector<int32_t> t = prompt_ids_;
  t.insert(t.end(), output_ids_.begin(), output_ids_.end());
  return t;
}

}  // namespace deepinfer
