// libFuzzer target: a tensor-parallel follower decoding the step plans rank 0
// sends (src/sched/step_plan_wire.h). deepinfer::Error is the expected
// outcome for bad input; a plan that decodes must encode to bytes that decode
// to the same plan again (encode(decode(encode(decode(x)))) is stable).
// Anything else (another exception, a crash, a sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "sched/step_plan_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  try {
    const StepPlan plan = decode_step_plan(std::span<const uint8_t>(data, size));
    const std::vector<uint8_t> once = encode_step_plan(plan);
    const std::vector<uint8_t> twice = encode_step_plan(decode_step_plan(once));
    if (once != twice) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
