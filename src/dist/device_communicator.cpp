#include "dist/device_communicator.h"

#include "backend/backend.h"
#include "core/error.h"
#include "dist/gloo_communicator.h"

#ifdef DEEPINFER_HAS_NCCL
#include "backend/cuda/cuda_backend.h"
#include "dist/cuda/nccl_communicator.h"
#endif

namespace deepinfer {

std::unique_ptr<Communicator> make_device_communicator(Backend& backend, const DistConfig& config,
                                                       GlooCommunicator& bootstrap, std::string group) {
  const Device device = backend.device();
  if (device.type == DeviceType::CUDA) {
#ifdef DEEPINFER_HAS_NCCL
    auto* cuda = dynamic_cast<cuda::CudaBackend*>(&backend);
    DI_CHECK(cuda != nullptr, "dist: backend '{}' is on a CUDA device but is not the CUDA backend", backend.name());
    return std::make_unique<NcclCommunicator>(cuda->stream(), device.index, bootstrap, std::move(group),
                                              config.timeout);
#else
    fail("dist: backend '{}' is on a CUDA device, and this build has no NCCL (configure with -DDEEPINFER_CUDA=ON)",
         backend.name());
#endif
  }
  return std::make_unique<GlooCommunicator>(bootstrap.store(), std::move(group), bootstrap.rank(), bootstrap.size(),
                                            config.timeout, gloo_transport_for(config));
}

}  // namespace deepinfer
