#include "model/weight_store.h"

#include "core/error.h"
#include "core/half.h"

namespace deepinfer {

Tensor WeightStore::matrix(const Tensor& host) {
  DI_CHECK(host.is_contiguous(), "weight {} is not contiguous", host.describe());
  if (backend_.device().type == DeviceType::CPU) {
    bytes_mapped_ += host.nbytes();
    return host;
  }
  Buffer& buf = owned_.emplace_back(backend_, host.nbytes());
  bytes_owned_ += buf.size();
  Tensor dev(buf.data(), host.dtype(), host.shape(), backend_.device());
  backend_.copy(dev, host);
  return dev;
}

Tensor WeightStore::expert_stack(const Tensor& host) {
  if (backend_.device().type == DeviceType::CPU) {
    bytes_mapped_ += host.nbytes();
    return host;
  }
  return matrix(host);
}

Tensor WeightStore::f32_vector(const Tensor& host) {
  const int64_t n = host.numel();
  std::vector<float> values(static_cast<size_t>(n));
  DI_CHECK(host.is_contiguous(), "weight {} is not contiguous", host.describe());
  switch (host.dtype()) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) values[i] = host.data_as<const float>()[i];
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) values[i] = f16_to_f32(host.data_as<const uint16_t>()[i]);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) values[i] = bf16_to_f32(host.data_as<const uint16_t>()[i]);
      break;
    default:
      fail("expected a float vector, got {}", host.describe());
  }
  return f32_vector(values);
}

Tensor WeightStore::f32_vector(const std::vector<float>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  Buffer& buf = owned_.emplace_back(backend_, values.size() * sizeof(float));
  bytes_owned_ += buf.size();
  Tensor dev = buf.view(DType::F32, {n});
  Tensor src(const_cast<float*>(values.data()), DType::F32, {n});
  backend_.copy(dev, src);
  return dev;
}

}  // namespace deepinfer
