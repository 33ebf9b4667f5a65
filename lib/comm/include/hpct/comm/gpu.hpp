// hpct/comm/gpu.hpp — the node's GPUs and NCCL on device buffers, for one GPU per rank.
//
// Built with CUDA + NCCL (HPCT_ENABLE_CUDA) the functions talk to the CUDA runtime and NCCL;
// otherwise they exist and say why they cannot (gpu_support_built() is false), so callers need no
// #ifdef. Every wait is bounded by a deadline: NCCL is initialised nonblocking and a communicator
// whose operation misses its deadline is aborted (ncclCommAbort), never waited on forever.
//
// Status: compiled in every CUDA build (CI); not yet run on a GPU (no device was available to the
// sessions that wrote it). tests/healthcheck covers the CPU build's refusals.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hpct/comm/deadline.hpp"

namespace hpct::comm {

struct GpuInfo {
  int index = 0;
  std::string name, pci_bus_id;
  uint64_t total_bytes = 0, free_bytes = 0;
};

/// True when this build has the CUDA runtime and NCCL.
bool gpu_support_built();
/// The GPUs the CUDA runtime sees on this node. Empty, with *why set, without a CUDA build, without
/// a driver, or without devices.
std::vector<GpuInfo> list_gpus(std::string* why);

/// One NCCL communicator over the ranks of an MPI communicator, one GPU per rank (the node-local
/// rank modulo the node's GPU count), with one stream. Buffers are device memory it owns.
class NcclComm {
 public:
  /// Collective over `comm`: picks the device, shares NCCL's unique id from rank 0 over MPI and
  /// initialises the communicator, all before `deadline` (steady_seconds()). Returns null with
  /// *why set on any failure; every rank must call it.
  /// `poll.yield` gives the core away while polling (more ranks than cores).
  static std::unique_ptr<NcclComm> create(MPI_Comm comm, int local_rank, double deadline, PollPolicy poll,
                                          std::string* why);
  /// A healthy communicator is finalized (bounded by create()'s window) and destroyed; one that
  /// failed was aborted and its device memory is left to the process's end.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int device() const { return device_; }
  /// Device buffers of `count` floats: input and output of the collectives below.
  bool resize(size_t count, std::string* why);
  bool upload(const float* host, size_t count, std::string* why);
  bool download(float* host, size_t count, std::string* why);
  /// Enqueue out = sum over ranks of in (count floats), or an all-to-all of count/n floats per
  /// peer (ncclSend/ncclRecv in one group: the MoE pattern). Then wait() for it.
  bool start_allreduce(size_t count, std::string* why);
  bool start_alltoall(size_t count, std::string* why);
  /// Polls the stream and NCCL's asynchronous error until done or `deadline`; on a timeout or an
  /// error the communicator is aborted and every later call fails.
  bool wait(double deadline, std::string* why);

 private:
  NcclComm() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int device_ = -1;
};

}  // namespace hpct::comm
