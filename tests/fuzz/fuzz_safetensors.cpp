// libFuzzer target: safetensors parsing and tensor views on whatever parses.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  try {
    SafetensorsFile f = SafetensorsFile::parse(std::span<const uint8_t>(data, size));
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
  return 0;
}
