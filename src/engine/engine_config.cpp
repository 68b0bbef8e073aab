#include "engine/engine_config.h"

#include <cstdlib>
#include <string_view>

namespace deepinfer {

EngineConfig with_environment(EngineConfig c) {
  if (const char* bi = std::getenv("DEEPINFER_BATCH_INVARIANT"); bi && std::string_view(bi) == "1") {
    c.batch_invariant = true;
  }
  if (const char* z = std::getenv("DEEPINFER_ZERO_OVERHEAD_SCHEDULING"); z && *z) {
    c.zero_overhead_scheduling = std::string_view(z) != "0" && std::string_view(z) != "false";
  }
  c.dist = dist_config_from_env(process_environment());
  return c;
}

}  // namespace deepinfer
