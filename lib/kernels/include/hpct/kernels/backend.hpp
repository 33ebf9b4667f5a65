// hpct/kernels/backend.hpp — process-wide setup of the CPU kernel backends.
//
// What it is: an RAII scope that initialises Kokkos once per process (Serial in Debian's package)
// and pins OpenBLAS and oneDNN's OpenMP to one thread, because hpctrain runs one MPI rank per
// core and threads inside a rank would fight the other ranks for the same cores. What it is not:
// a device or stream manager (the CUDA backend takes streams explicitly, see cuda_ops.hpp).
// Trade-off: a reference count instead of a singleton, so a library user, a test environment and
// an app can each hold a scope; Kokkos is finalized when the last one goes.
#pragma once
#include <string>

namespace hpct::kernels {

/// Holds the kernel backends initialised. Safe to construct more than once (ref-counted); the last
/// destruction finalizes Kokkos if this scope initialised it. Every op in ops.hpp except gemm()
/// needs one alive and throws hpct::Error otherwise (gemm works without, but then OpenBLAS and
/// oneDNN use as many threads as they like).
class BackendScope {
 public:
  BackendScope();
  ~BackendScope();
  BackendScope(const BackendScope&) = delete;
  BackendScope& operator=(const BackendScope&) = delete;
};

/// One line for logs, e.g. "cpu: Kokkos Serial, OpenBLAS 0.3.21 (Zen), oneDNN 2.6.3 (bf16 via AVX512-BF16)".
std::string backend_description();

}  // namespace hpct::kernels
