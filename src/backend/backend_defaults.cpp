// Default implementations of the asynchronous-step hooks for backends whose
// ops complete before they return (the CPU backend).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backend/backend.h"
#include "core/error.h"

namespace deepinfer {

namespace {

// Always complete; its time is the host clock when it was recorded, which on
// a synchronous backend is when the preceding ops finished.
class HostEvent final : public DeviceEvent {
 public:
  void record() override { time_ = std::chrono::steady_clock::now(); }
  void synchronize() override {}
  bool ready() override { return true; }
  double elapsed_ms_since(const DeviceEvent& earlier) const override {
    const auto* e = dynamic_cast<const HostEvent*>(&earlier);
    DI_CHECK(e != nullptr, "events of different backends cannot be compared");
    return std::chrono::duration<double, std::milli>(time_ - e->time_).count();
  }

 private:
  std::chrono::steady_clock::time_point time_{};
};

constexpr size_t kHostAlignment = 64;

}  // namespace

void* Backend::allocate_host(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* p = std::aligned_alloc(kHostAlignment, rounded);
  DI_CHECK(p != nullptr, "could not allocate {} bytes of host memory", bytes);
  return p;
}

void Backend::deallocate_host(void* ptr) { std::free(ptr); }

std::optional<Backend::SharedDeviceMemory> Backend::allocate_shared_device(size_t) { return std::nullopt; }
void Backend::free_shared_device(void*) {}
void* Backend::open_shared_device(std::span<const std::byte>) { return nullptr; }
void Backend::close_shared_device(void*) {}

void Backend::copy_rows_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                              size_t rows) {
  for (size_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
  }
}

void Backend::copy_blocks_async(std::span<const BlockCopy> blocks, size_t dst_pitch, size_t src_pitch, size_t width,
                                size_t rows) {
  for (const BlockCopy& b : blocks) copy_rows_async(b.dst, dst_pitch, b.src, src_pitch, width, rows);
}

std::unique_ptr<DeviceEvent> Backend::create_event() { return std::make_unique<HostEvent>(); }

namespace {

// For backends whose ops complete before they return: a copy is done when
// it returns, so ordering and events are trivial.
class ImmediateCopyStream final : public CopyStream {
 public:
  explicit ImmediateCopyStream(Backend& backend) : backend_(backend) {}
  void wait_for_ops() override {}
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                 size_t rows) override {
    backend_.copy_rows_async(dst, dst_pitch, src, src_pitch, width, rows);
  }
  std::unique_ptr<DeviceEvent> record() override { return backend_.create_event(); }
  void synchronize() override {}

 private:
  Backend& backend_;
};

}  // namespace

std::unique_ptr<CopyStream> Backend::create_copy_stream() { return std::make_unique<ImmediateCopyStream>(*this); }

void Backend::linear_batched(const Tensor& x, const Tensor& weight, Tensor out) {
  const Tensor none;
  for (int64_t b = 0; b < weight.size(0); ++b) linear(x.select(1, b), weight.row(b), none, out.select(1, b));
}

void Backend::begin_capture() { fail("{} backend: graph capture is not supported", name()); }

std::unique_ptr<OpGraph> Backend::end_capture() { fail("{} backend: graph capture is not supported", name()); }

}  // namespace deepinfer
