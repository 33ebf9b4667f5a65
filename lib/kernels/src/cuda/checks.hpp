// The CUDA backend's status checks (internal to lib/kernels): a failed runtime or cuBLAS call as
// an hpct::Error naming what was being done, for the host code of every file in cuda/; and the
// device buffer its helpers keep between calls, grown to the largest they have needed.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "hpct/core/error.hpp"

namespace hpct::kernels::cuda {

inline void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess)
    throw Error("CUDA backend: " + what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}
inline void check(cublasStatus_t st, const std::string& what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw Error("CUDA backend: " + what + ": cuBLAS status " + std::to_string((int)st));
}

/// Device memory on a stream, grown (never shrunk) to the largest size asked; the owner frees it
/// with release() once its stream is done with it.
struct DeviceSlot {
  void* p = nullptr;
  size_t bytes = 0;
  /// At least n bytes (its old contents are not kept when it grows); `what` names it in an error.
  void* grown(size_t n, cudaStream_t stream, const char* what) {
    if (n > bytes) {
      if (p) cudaFreeAsync(p, stream);
      p = nullptr, bytes = 0;
      check(cudaMallocAsync(&p, n, stream), std::string("cudaMallocAsync of ") + std::to_string(n) + " bytes for " + what);
      bytes = n;
    }
    return p;
  }
  void release(cudaStream_t stream) noexcept {
    if (p) cudaFreeAsync(p, stream);
    p = nullptr, bytes = 0;
  }
};

}  // namespace hpct::kernels::cuda
