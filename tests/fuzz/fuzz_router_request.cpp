// libFuzzer target: a request body as `deepinfer router` reads it before
// routing (src/router/request_plan.h). The first byte picks the path (chat,
// completions, responses, Anthropic messages); the rest is the body. The
// router parses it, takes its routing text, hashes it into prefix chunks and
// routes by them, and rewrites it for a prefill engine. ApiError and
// deepinfer::Error are the expected outcomes for bad input; anything else (an
// exception of another kind, a crash, a sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "router/request_plan.h"
#include "router/routing_policy.h"
#include "server/api_error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::router;
  if (size == 0) return 0;
  static const char* const kPaths[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"};
  const std::string_view path = kPaths[data[0] % 4];
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  static Router router(RoutingPolicy::CacheAware, 2, 4096);
  try {
    const RoutedRequest r = read_routed_request(path, body);
    const auto chunks = prefix_chunk_hashes(r.routing_text, 64);
    const RoutingChoice c = router.choose({{0, data[0] & 3}, {1, 1}, {2, 0}}, chunks);
    if (c.backend > 2 || c.matched_chunks > chunks.size()) __builtin_trap();
    const std::string prefill = prefill_body(r);
    if (prefill.empty() || estimated_prompt_tokens(r) < 0) __builtin_trap();
  } catch (const deepinfer::server::ApiError&) {
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
