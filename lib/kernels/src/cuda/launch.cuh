// Launch helpers shared by the CUDA kernel files of lib/kernels (internal, not installed): block
// counts, the launch check, a grid-stride loop and warp reductions.
#pragma once
#include <cuda_fp16.h>
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
/// Whether four 16-bit values can be stored at once (8 bytes) there; null counts as aligned.
inline bool aligned8(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 8 == 0; }

// 16-bit values as bits: bf16 (the top half of an fp32, round to nearest even, a NaN stays a quiet
// NaN) or IEEE half (round to nearest even), as half.hpp's to_half and from_half on the host.
__device__ __forceinline__ uint16_t half_bits(float f, bool bf16) {
  if (!bf16) return __half_as_ushort(__float2half_rn(f));
  const unsigned u = __float_as_uint(f);
  const unsigned rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : rounded);
}
__device__ __forceinline__ float half_value(uint16_t h, bool bf16) {
  return bf16 ? __uint_as_float(static_cast<unsigned>(h) << 16) : __half2float(__ushort_as_half(h));
}

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
