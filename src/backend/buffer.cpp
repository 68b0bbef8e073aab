#include "backend/backend.h"
#include "core/error.h"

namespace deepinfer {

Buffer::Buffer(Backend& backend, size_t bytes) : backend_(&backend), size_(bytes) {
  data_ = bytes ? backend.allocate(bytes) : nullptr;
  DI_CHECK(bytes == 0 || data_ != nullptr, "{} backend could not allocate {} bytes", backend.name(), bytes);
}

Buffer::~Buffer() {
  if (data_) backend_->deallocate(data_);
}

Buffer::Buffer(Buffer&& other) noexcept
    : backend_(other.backend_), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    if (data_) backend_->deallocate(data_);
    backend_ = other.backend_;
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

Tensor Buffer::view(DType dtype, std::initializer_list<int64_t> shape, size_t offset_bytes) const {
  Tensor t(static_cast<char*>(data_) + offset_bytes, dtype, shape,
           backend_ ? backend_->device() : Device::cpu());
  DI_CHECK(offset_bytes + t.nbytes() <= size_, "view of {} at offset {} exceeds buffer of {} bytes",
           t.describe(), offset_bytes, size_);
  return t;
}

}  // namespace deepinfer
