// Private to the CPU ops (cpu_ops.cpp, cpu_qkv.cpp, cpu_optim.cpp): the host execution policy, the SIMD chunk
// loop every element-wise op runs over, and the argument checks.
#pragma once
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <string>

#include "hpct/core/error.hpp"

namespace hpct::kernels::detail {

using Policy = Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>;

inline constexpr size_t kChunk = 8192;  // elements per SIMD chunk: amortises dispatch, still splits over threads

inline void require_backend(const char* op) {
  if (!Kokkos::is_initialized())
    throw Error(std::string(op) + ": the kernel backend is not initialised",
                Error::Context{"", "", "construct an hpct::kernels::BackendScope before calling kernels"});
}

inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw Error(std::string(op) + ": " + what);
}

// Runs body(lo, hi) over [0, n) in chunks of kChunk elements; the body's loop is the SIMD loop.
template <typename Body>
void for_chunks(const char* name, size_t n, Body body) {
  const size_t chunks = (n + kChunk - 1) / kChunk;
  Kokkos::parallel_for(name, Policy(0, chunks), KOKKOS_LAMBDA(size_t ch) {
    const size_t lo = ch * kChunk;
    body(lo, std::min(n, lo + kChunk));
  });
}

}  // namespace hpct::kernels::detail
