#include "dist/step_wait.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <thread>

#include "backend/backend.h"
#include "dist/communicator.h"

namespace deepinfer {

void wait_for_step(DeviceEvent& done, std::span<Communicator* const> groups, std::chrono::milliseconds timeout) {
  if (groups.empty() || timeout.count() <= 0) {
    done.synchronize();
    return;
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  // Decode steps take milliseconds: poll without sleeping that long, so the
  // wait adds no latency to them; past it, sleep in steps of up to 1 ms.
  constexpr auto kSpin = std::chrono::milliseconds(50);
  constexpr auto kMaxSleep = std::chrono::microseconds(1000);
  std::chrono::microseconds sleep(20);
  Clock::time_point last_check = start;
  while (!done.ready()) {
    const Clock::time_point now = Clock::now();
    if (now - last_check >= std::chrono::milliseconds(1)) {
      for (Communicator* g : groups) g->check_health();
      last_check = now;
    }
    if (now - start >= timeout) {
      const std::string reason = fmt::format(
          "a step did not complete within {} ms: its collectives wait for a rank that is gone or stuck; "
          "aborted them",
          timeout.count());
      // Every group's collectives return (the step's kernels may wait in any of them).
      for (size_t i = 1; i < groups.size(); ++i) {
        try {
          groups[i]->abort(reason);
        } catch (const CommError&) {
        }
      }
      groups[0]->abort(reason);
    }
    if (now - start < kSpin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, kMaxSleep);
    }
  }
}

}  // namespace deepinfer
