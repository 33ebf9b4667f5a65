// The ZeroEngine's in-flight operations, shared by zero.cpp and zero_step.cpp (private to the
// parallel library).
#pragma once
#include <mpi.h>

#include <cstddef>

#include "hpct/io/async_io.hpp"
#include "hpct/parallel/zero.hpp"

namespace hpct::parallel {

inline constexpr size_t kTile = 1 << 16;  // elements of a widened gradient tile in the update

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
