// The CUDA backend's status checks (internal to lib/kernels): a failed runtime or cuBLAS call as
// an hpct::Error naming what was being done, for the host code of every file in cuda/.
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

}  // namespace hpct::kernels::cuda
