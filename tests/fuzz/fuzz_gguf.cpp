// libFuzzer target: GGUF parsing and every accessor on whatever parses.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "loader/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  try {
    GgufFile f = GgufFile::parse(std::span<const uint8_t>(data, size));
    for (const GgufKeyValue& kv : f.metadata()) {
      format_gguf_value(kv.value, 4);
      // Each getter either converts or throws; both are fine.
      try { f.get_u64(kv.key); } catch (const Error&) {}
      try { f.get_f32(kv.key); } catch (const Error&) {}
      try { f.get_string(kv.key); } catch (const Error&) {}
      try { f.get_string_array(kv.key); } catch (const Error&) {}
      try { f.get_i32_array(kv.key); } catch (const Error&) {}
      try { f.get_f32_array(kv.key); } catch (const Error&) {}
    }
    volatile uint8_t sink = 0;
    for (const GgufTensorInfo& t : f.tensors()) {
      Tensor view = f.tensor(t.name);
      std::span<const uint8_t> bytes = f.tensor_data(t);
      // Touch both ends so the sanitizer sees any out-of-range view.
      if (!bytes.empty()) sink = sink + bytes.front() + bytes.back();
      if (view.nbytes() != t.nbytes) __builtin_trap();
    }
  } catch (const Error&) {
  }
  return 0;
}
