// Launch helpers shared by the CUDA kernel files of lib/kernels (internal, not installed): block
// counts, the launch check, a grid-stride loop and warp reductions.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "hpct/core/error.hpp"

namespace hpct::kernels::cuda {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 65535u * 8u;  // grid-stride beyond this: enough blocks to fill any GPU

/// Blocks of kThreads for n threads of work, capped (the kernels loop with a grid stride).
inline unsigned blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

/// Launches are asynchronous: this catches bad configurations and earlier sticky errors, not
/// faults inside the kernel (those surface at the caller's next synchronisation).
inline void check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw Error(std::string("hpct::kernels::cuda::") + op + ": " + cudaGetErrorName(err) + ": " +
                cudaGetErrorString(err));
}

/// Whether a pointer can be read as float4 (16 bytes); null counts as aligned (an absent operand).
inline bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Every index i < n once, over the whole grid.
#define HPCT_GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// Reductions over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ __forceinline__ double warp_sum(double x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

}  // namespace hpct::kernels::cuda
