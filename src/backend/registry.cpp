#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace deepinfer {

std::unique_ptr<Backend> create_backend(DeviceType type, const BackendOptions& options) {
  switch (type) {
    case DeviceType::CPU:
      return std::make_unique<cpu::CpuBackend>(options);
    case DeviceType::CUDA:
      fail("CUDA backend not built: this build of DeepInfer has only the CPU backend");
  }
  fail("unknown device type {}", static_cast<int>(type));
}

}  // namespace deepinfer
