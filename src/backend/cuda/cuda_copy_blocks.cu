// One launch for many KV block copies (CudaBackend::copy_blocks_async): a
// decode engine loading a prompt's blocks from a prefill engine's shared
// pool copies hundreds of blocks of tens of rows each; one cudaMemcpy2DAsync
// per block leaves the copy launch-bound far below the device's bandwidth.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

namespace {

// blockIdx.y: the block; blockIdx.x: the row; threads stride the row in 16-byte words.
__global__ void copy_blocks_kernel(const CopyBlocksArgs args, size_t dst_pitch, size_t src_pitch, size_t words) {
  const auto* src = reinterpret_cast<const uint4*>(static_cast<const char*>(args.src[blockIdx.y]) + blockIdx.x * src_pitch);
  auto* dst = reinterpret_cast<uint4*>(static_cast<char*>(args.dst[blockIdx.y]) + blockIdx.x * dst_pitch);
  for (size_t i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

void launch_copy_blocks(const CopyBlocksArgs& args, int n, size_t dst_pitch, size_t src_pitch, size_t width,
                        size_t rows, Stream stream) {
  if (n <= 0 || rows == 0 || width == 0) return;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(n));
  copy_blocks_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(args, dst_pitch, src_pitch, width / 16);
}

}  // namespace deepinfer::cuda
