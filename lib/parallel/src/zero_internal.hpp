// The ZeroEngine's in-flight operations, shared by zero.cpp and zero_step.cpp, and the MPI helpers
// it shares with DeviceEngine (private to the parallel library).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <string>

#include "hpct/core/error.hpp"

#include "hpct/io/async_io.hpp"
#include "hpct/parallel/zero.hpp"

namespace hpct::parallel {

/// The MPI sum of 16-bit gradients (p: bf16 or fp16) in MPI_UINT16_T buffers: inout = round(inout +
/// in), added in fp32 (MPI has no bf16/fp16 sum). The caller frees it with MPI_Op_free.
MPI_Op make_sum16_op(kernels::Precision p);

/// n as one MPI call's count; a block of 2^31 elements or more throws, naming `what`.
inline int as_count(size_t n, const char* what) {
  if (n >= (size_t(1) << 31))
    throw Error(std::string(what) + ": a block of " + std::to_string(n) +
                " elements exceeds one MPI call (2^31); the model needs smaller blocks");
  return static_cast<int>(n);
}

struct ZeroEngine::Gathered {
  io::BufferPool::Lease buf;     // the block in fp32, what params() returns
  io::BufferPool::Lease buf16;   // 16-bit runs: the gathered 16-bit block, widened into buf when it arrives
  io::BufferPool::Lease send;    // this rank's slice read from the swap file (parameter offload)
  io::BufferPool::Lease send16;  // 16-bit runs: that slice rounded, what the gather sends
  io::PendingRead reading;       // that read, while in flight: the gather starts when it is done
  bool started = false;          // the all-gather has been posted
  bool ready = false;            // buf holds the block
  MPI_Request req = MPI_REQUEST_NULL;
  size_t numel = 0;
  float* data() { return reinterpret_cast<float*>(buf.data()); }
};

struct ZeroEngine::Reduction {
  int block = 0;
  MPI_Request req = MPI_REQUEST_NULL;
  io::BufferPool::Lease send, recv;  // stage 2/3: the gradient block and the received slice
  size_t numel = 0;
};

}  // namespace hpct::parallel
