#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#ifdef DEEPINFER_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace deepinfer {

std::unique_ptr<Backend> create_backend(DeviceType type, const BackendOptions& options) {
  switch (type) {
    case DeviceType::CPU:
      return std::make_unique<cpu::CpuBackend>(options);
    case DeviceType::CUDA:
#ifdef DEEPINFER_HAS_CUDA
      return std::make_unique<cuda::CudaBackend>(options, options.device_index);
#else
      fail("CUDA backend not built: this build of DeepInfer has only the CPU backend");
#endif
  }
  fail("unknown device type {}", static_cast<int>(type));
}

}  // namespace deepinfer
