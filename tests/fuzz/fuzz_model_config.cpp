// libFuzzer target: the architecture config readers on a GGUF file (bytes that
// start with "GGUF") or a config.json (anything else), then validation. A
// count such as block_count or num_hidden_layers must be checked before it
// sizes anything: a forged one that allocates gigabytes is reported by
// libFuzzer's malloc limit (run.sh sets it) as a crash.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/json_parse.h"
#include "loader/gguf.h"
#include "model/arch_registry.h"

namespace {

using namespace deepinfer;

void from_gguf(std::span<const uint8_t> bytes) {
  GgufFile f = GgufFile::parse(bytes);
  const std::string arch(f.get_string("general.architecture"));
  ModelConfig c = find_arch_for_gguf(arch).from_gguf(f, arch);
  c.validate();
}

void from_hf(std::string_view text) {
  const nlohmann::json cfg = parse_json(text, "config.json");
  if (!cfg.is_object()) return;
  auto archs = cfg.find("architectures");
  if (archs == cfg.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) return;
  const std::string hf_arch = (*archs)[0].get<std::string>();
  ModelConfig c = find_arch_for_hf(hf_arch).from_hf(cfg, hf_arch);
  c.validate();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    if (size >= 4 && std::memcmp(data, "GGUF", 4) == 0) {
      from_gguf({data, size});
    } else {
      from_hf({reinterpret_cast<const char*>(data), size});
    }
  } catch (const Error&) {
  }
  return 0;
}
