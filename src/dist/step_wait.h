// Waiting for a step of a multi-rank group on a device. Collectives are
// enqueued and return at once (NCCL); a peer that dies or hangs afterwards
// leaves this rank's kernels waiting on the device forever, and a plain
// event synchronize with them. So the wait polls: the step's event, the
// group's health (NCCL notices a lost peer asynchronously), and a deadline,
// past which the group's collectives are aborted and the step fails with a
// clear error instead of hanging the process.
#pragma once

#include <chrono>
#include <span>

namespace deepinfer {

class Communicator;
class DeviceEvent;

// Returns once `done` has completed. With groups and a positive timeout:
// throws CommError when a group reports an error, or (after aborting every
// group's collectives) when `done` has not completed within `timeout`. Spins
// for the first milliseconds (a step's usual length), then sleeps in short
// steps.
void wait_for_step(DeviceEvent& done, std::span<Communicator* const> groups, std::chrono::milliseconds timeout);

}  // namespace deepinfer
