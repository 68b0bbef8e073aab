// CudaBackend's asynchronous-step hooks: pinned host memory, copies that do
// not wait, events on the backend's stream and CUDA-graph capture/replay.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/error.h"

namespace deepinfer::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA backend: {} failed: {}", what, cudaGetErrorString(e));
}

class CudaEvent final : public DeviceEvent {
 public:
  explicit CudaEvent(cudaStream_t stream) : stream_(stream) {
    check(cudaEventCreateWithFlags(&event_, cudaEventDefault), "cudaEventCreate");
  }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void record() override {
    check(cudaEventRecord(event_, stream_), "cudaEventRecord");
    recorded_ = true;
  }
  void synchronize() override {
    if (recorded_) check(cudaEventSynchronize(event_), "cudaEventSynchronize");
  }
  bool ready() override {
    if (!recorded_) return true;
    cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    check(e, "cudaEventQuery");
    return true;
  }
  double elapsed_ms_since(const DeviceEvent& earlier) const override {
    const auto* e = dynamic_cast<const CudaEvent*>(&earlier);
    DI_CHECK(e != nullptr && e->recorded_ && recorded_, "elapsed time needs two recorded CUDA events");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, e->event_, event_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

class CudaGraph final : public OpGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void replay() override { check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch"); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

void* CudaBackend::allocate_host(size_t bytes) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault), "cudaHostAlloc");
  return p;
}

void CudaBackend::deallocate_host(void* ptr) {
  if (ptr) cudaFreeHost(ptr);
}

void CudaBackend::copy_async(Tensor dst, const Tensor& src) {
  DI_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.nbytes() == src.nbytes(),
           "copy_async needs contiguous tensors of equal size, got {} and {}", dst.describe(), src.describe());
  if (src.nbytes() == 0) return;
  check(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)),
        "cudaMemcpyAsync");
}

void CudaBackend::copy_rows_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                                  size_t rows) {
  if (width == 0 || rows == 0) return;
  check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault,
                          static_cast<cudaStream_t>(stream_)),
        "cudaMemcpy2DAsync");
}

void CudaBackend::copy_blocks_async(std::span<const BlockCopy> blocks, size_t dst_pitch, size_t src_pitch,
                                    size_t width, size_t rows) {
  if (blocks.empty() || width == 0 || rows == 0) return;
  // The kernel moves 16-byte words between device addresses (this device's,
  // or another process's mapped here); anything else takes the copy engines.
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  auto on_device = [](const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice;
  };
  bool kernel = width % 16 == 0 && dst_pitch % 16 == 0 && src_pitch % 16 == 0 && rows <= 65535;
  for (size_t i = 0; i < blocks.size() && kernel; ++i) kernel = aligned(blocks[i].dst) && aligned(blocks[i].src);
  kernel = kernel && on_device(blocks.front().src) && on_device(blocks.front().dst);
  if (!kernel) {
    Backend::copy_blocks_async(blocks, dst_pitch, src_pitch, width, rows);
    return;
  }
  for (size_t at = 0; at < blocks.size(); at += kCopyBlocksPerLaunch) {
    const size_t n = std::min(kCopyBlocksPerLaunch, blocks.size() - at);
    CopyBlocksArgs args{};
    for (size_t i = 0; i < n; ++i) {
      args.dst[i] = blocks[at + i].dst;
      args.src[i] = blocks[at + i].src;
    }
    launch_copy_blocks(args, static_cast<int>(n), dst_pitch, src_pitch, width, rows, stream_);
    check(cudaGetLastError(), "copy_blocks kernel launch");
  }
}

namespace {

// A non-blocking stream of its own: copies overlap the op stream's kernels
// (the copy engines are separate); wait_for_ops() is an event edge.
class CudaCopyStream final : public CopyStream {
 public:
  explicit CudaCopyStream(cudaStream_t ops) : ops_(ops) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&ops_done_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaCopyStream() override {
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(ops_done_);
    cudaStreamDestroy(stream_);
  }
  CudaCopyStream(const CudaCopyStream&) = delete;
  CudaCopyStream& operator=(const CudaCopyStream&) = delete;

  void wait_for_ops() override {
    check(cudaEventRecord(ops_done_, ops_), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream_, ops_done_, 0), "cudaStreamWaitEvent");
  }
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                 size_t rows) override {
    if (width == 0 || rows == 0) return;
    check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault, stream_),
          "cudaMemcpy2DAsync");
  }
  std::unique_ptr<DeviceEvent> record() override {
    auto e = std::make_unique<CudaEvent>(stream_);
    e->record();
    return e;
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t ops_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ops_done_ = nullptr;
};

}  // namespace

std::unique_ptr<CopyStream> CudaBackend::create_copy_stream() {
  return std::make_unique<CudaCopyStream>(static_cast<cudaStream_t>(stream_));
}

std::unique_ptr<DeviceEvent> CudaBackend::create_event() {
  return std::make_unique<CudaEvent>(static_cast<cudaStream_t>(stream_));
}

void CudaBackend::begin_capture() {
  DI_CHECK(!capturing_, "CUDA backend: a graph capture is already in progress");
  // Thread-local mode: other threads (the server's I/O) may use the CUDA API
  // meanwhile without invalidating the capture.
  check(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream_), cudaStreamCaptureModeThreadLocal),
        "cudaStreamBeginCapture");
  capturing_ = true;
}

std::unique_ptr<OpGraph> CudaBackend::end_capture() {
  DI_CHECK(capturing_, "CUDA backend: end_capture without begin_capture");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(e, "cudaGraphInstantiate");
  return std::make_unique<CudaGraph>(exec, static_cast<cudaStream_t>(stream_));
}

std::optional<DeviceMemoryInfo> CudaBackend::memory_info() const {
  DeviceMemoryInfo info;
  check(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo");
  return info;
}

}  // namespace deepinfer::cuda
