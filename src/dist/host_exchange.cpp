#include "dist/host_exchange.h"

#include <algorithm>

#include "core/error.h"
#include "dist/communicator.h"

namespace deepinfer {

namespace {

Tensor bytes_tensor(void* data, int64_t n) { return Tensor(data, DType::U8, {n}); }

}  // namespace

void broadcast_string(Communicator& comm, std::string& text, int root) {
  DI_CHECK(root >= 0 && root < comm.size(), "broadcast from rank {} of a group of {}", root, comm.size());
  int64_t n = comm.rank() == root ? static_cast<int64_t>(text.size()) : 0;
  comm.broadcast(Tensor(&n, DType::I64, {1}), root);
  DI_CHECK(n >= 0, "broadcast of {} bytes", n);
  text.resize(static_cast<size_t>(n));
  if (n > 0) comm.broadcast(bytes_tensor(text.data(), n), root);
}

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine) {
  const int size = comm.size();
  int64_t n = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(static_cast<size_t>(size), 0);
  comm.all_gather(Tensor(&n, DType::I64, {1}), Tensor(sizes.data(), DType::I64, {size}));
  const int64_t widest = *std::max_element(sizes.begin(), sizes.end());
  DI_CHECK(widest >= 0, "gather of {} bytes", widest);
  std::vector<std::string> all(static_cast<size_t>(size));
  if (widest == 0) return all;
  std::string padded = mine;
  padded.resize(static_cast<size_t>(widest));
  std::string joined(static_cast<size_t>(widest) * static_cast<size_t>(size), '\0');
  comm.all_gather(bytes_tensor(padded.data(), widest), bytes_tensor(joined.data(), widest * size));
  for (int r = 0; r < size; ++r) {
    const int64_t got = sizes[static_cast<size_t>(r)];
    DI_CHECK(got >= 0 && got <= widest, "rank {} sent {} bytes of at most {}", r, got, widest);
    all[static_cast<size_t>(r)] = joined.substr(static_cast<size_t>(r * widest), static_cast<size_t>(got));
  }
  return all;
}

}  // namespace deepinfer
