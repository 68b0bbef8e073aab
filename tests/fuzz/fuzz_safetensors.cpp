// libFuzzer target: safetensors parsing and tensor views on whatever parses.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "core/error.h"
#include "loader/safetensors.h"

namespace {

void parse_and_view(std::span<const uint8_t> file) {
  using namespace deepinfer;
  try {
    SafetensorsFile f = SafetensorsFile::parse(file);
    volatile uint8_t sink = 0;
    for (const SafetensorsTensorInfo& t : f.tensors()) {
      std::span<const uint8_t> bytes = f.tensor_data(t);
      if (!bytes.empty()) sink = sink + bytes.front() + bytes.back();
      try {
        Tensor view = f.tensor(t);
        if (view.nbytes() != t.nbytes) __builtin_trap();
      } catch (const Error&) {  // rank above Tensor::kMaxDims
      }
    }
  } catch (const Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  parse_and_view({data, size});
  // Mutations of the JSON header rarely keep the 8-byte length prefix right, so
  // also parse a copy whose prefix ends the header at the first NUL byte (JSON
  // has none; the seeds' data sections start with one).
  const uint8_t* nul = size > 8 ? static_cast<const uint8_t*>(std::memchr(data + 8, 0, size - 8)) : nullptr;
  if (nul) {
    std::vector<uint8_t> fixed(data, data + size);
    uint64_t header_len = static_cast<uint64_t>(nul - data) - 8;
    std::memcpy(fixed.data(), &header_len, 8);
    parse_and_view(fixed);
  }
  return 0;
}
