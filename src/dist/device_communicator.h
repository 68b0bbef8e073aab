// The communicator for a backend's tensors: NCCL on a CUDA backend (in CUDA
// builds), otherwise a new Gloo group over the bootstrap group's store.
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.h"
#include "dist/dist_config.h"

namespace deepinfer {

class Backend;
class GlooCommunicator;

// Every rank of `bootstrap` calls this together; the new communicator has
// the same ranks and is named `group` (unique within the job).
std::unique_ptr<Communicator> make_device_communicator(Backend& backend, const DistConfig& config,
                                                       GlooCommunicator& bootstrap, std::string group);

}  // namespace deepinfer
