// hpct/comm/ring_allreduce.hpp — NCCL's ring all-reduce on host buffers, over MPI point-to-point.
//
// Reduce-scatter then all-gather around the ring r -> r+1, each rank owning one segment of
// ceil(count / n) floats. The reduce-scatter receives in chunks into a double-buffered scratch
// that stays in cache and adds it to the rank's own input straight into the output, so no full
// copy of the buffer is ever made; the all-gather receives straight into the output. Per rank it
// moves 2(n-1)/n of the buffer each way, the minimum any all-reduce can (nccl-tests' busbw).
//
// Why not MPI_Allreduce: Open MPI 4.1's algorithms on one host ran at 0.24-0.38 (blocking) and
// 0.37-0.54 (MPI_Iallreduce) of a 64 MiB send between the same ranks (bench/allreduce_modes.c),
// this ring at 0.64-0.90; in ib_healthcheck's bench 0.41 for MPI_Iallreduce against 0.67-0.83 for
// the ring (docs/benchmarks/fabric.md). What it is not: a general MPI_Op (float sums only), or fault tolerant: on
// a deadline, operations stay pending inside MPI like every deadline wait (deadline.hpp).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "hpct/comm/deadline.hpp"

namespace hpct::comm {

class RingAllreduce {
 public:
  /// chunk_bytes: the reduce-scatter's unit (whole floats, at least 64 B). 256 KiB, 512 KiB and
  /// 1 MiB gave the same busbw here (docs/benchmarks/fabric.md). Uses tags tag and tag + 1
  /// on comm; nothing else may receive those tags with a wildcard source meanwhile.
  explicit RingAllreduce(MPI_Comm comm, size_t chunk_bytes = size_t(1) << 20, int tag = 31000);
  RingAllreduce(const RingAllreduce&) = delete;
  RingAllreduce& operator=(const RingAllreduce&) = delete;

  /// out[i] = sum over ranks of in[i] for i < count; in == out allowed. Collective over comm:
  /// every rank calls with the same count. Each wait polls until deadline (steady_seconds());
  /// false when it passes: operations then stay pending inside MPI, so in and out must outlive
  /// the job (the scratch is kept alive here), and comm must not be used for data again.
  bool run(const float* in, float* out, size_t count, double deadline, PollPolicy policy = {});

  /// [begin, end) of rank r's segment: the part of the result it completes in the reduce-scatter.
  static std::pair<size_t, size_t> segment(size_t count, int n, int r);
  /// Bytes of scratch held (two chunks).
  size_t scratch_bytes() const { return scratch_.size() * sizeof(float); }

 private:
  bool reduce_scatter(const float* in, float* out, size_t count, double deadline, PollPolicy policy);
  bool all_gather(float* out, size_t count, double deadline, PollPolicy policy);
  bool fail();

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, tag_;
  size_t chunk_;  // floats
  std::vector<float> scratch_;
  std::vector<MPI_Request> sends_;
};

}  // namespace hpct::comm
