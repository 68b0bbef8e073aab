#include "engine/gloo_vote_channel.h"

#include "core/tensor.h"
#include "dist/gloo_communicator.h"

namespace deepinfer {

std::vector<int64_t> GlooVoteChannel::all_gather(int64_t mine) {
  std::vector<int64_t> all(static_cast<size_t>(comm_.size()));
  comm_.all_gather(Tensor(&mine, DType::I64, {1}), Tensor(all.data(), DType::I64, {comm_.size()}));
  return all;
}

}  // namespace deepinfer
