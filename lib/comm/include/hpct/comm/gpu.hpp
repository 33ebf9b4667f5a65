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
/// How many GPUs the CUDA runtime sees (no device is touched); 0 with *why set when none.
int gpu_count(std::string* why);
/// The GPUs the CUDA runtime sees on this node. Empty, with *why set, without a CUDA build, without
/// a driver, or without devices.
std::vector<GpuInfo> list_gpus(std::string* why);

/// Collectives in place on one device's memory, for layers whose tensors live there (tensor
/// parallelism) and for the GPU-resident ZeRO engine's data-parallel gradients and parameters. The
/// caller has finished writing the input (its own stream synchronized); each call returns when the
/// collective is done, or false with *why set when it failed or missed `deadline` (steady_seconds()).
/// Counts are in elements of `e`. NcclComm below is the one a run uses; a test may put another
/// transport behind the same calls.
class DeviceCollectives {
 public:
  /// Element types. bf16 and f16 sums add in fp32 and round each partial sum (NCCL's, and the host
  /// engine's 16-bit MPI operator's, rule); f64 has no maximum.
  enum class Elem { f32, f64, bf16, f16 };
  static size_t bytes(Elem e) { return e == Elem::f64 ? 8 : e == Elem::f32 ? 4 : 2; }
  virtual ~DeviceCollectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// buf = the element-wise sum (or maximum) of every rank's buf.
  virtual bool allreduce(void* buf, size_t count, Elem e, bool max, double deadline, std::string* why) = 0;
  /// buf: size() blocks of `block` elements, this rank's at rank() * block; the others' are gathered in.
  virtual bool allgather_blocks(void* buf, size_t block, Elem e, double deadline, std::string* why) = 0;
  /// slice (block elements) = the sum over ranks of block rank() of their full (size() blocks).
  virtual bool reduce_scatter_blocks(const void* full, void* slice, size_t block, Elem e, double deadline,
                                     std::string* why) = 0;

  // ---- collectives queued behind the caller's device queue, not waited for ----
  // For reductions that overlap the work queued after them (the resident engine's gradients during
  // backward). `queue`: the caller's device queue (an OpsBackend's queue_handle(): a cudaStream_t),
  // or nullptr. Where queues() is false (the defaults) start_* are the calls above, done when they
  // return, and the caller drains its queue first as for those; join and finish do nothing.
  using Ticket = uint64_t;
  /// True where start_* run after everything `queue` holds when called, and return at once.
  virtual bool queues() const { return false; }
  /// As reduce_scatter_blocks / allreduce (sums), started. `full` (or `buf`) must not change, and
  /// the result is read, only by work queued on `queue` after join(*t) or once finish() returned.
  /// `deadline` bounds only what the call itself waits for (NCCL's enqueue), not the collective.
  virtual bool start_reduce_scatter_blocks(const void* full, void* slice, size_t block, Elem e, void* queue,
                                           double deadline, Ticket* t, std::string* why) {
    (void)queue;
    *t = 0;
    return reduce_scatter_blocks(full, slice, block, e, deadline, why);
  }
  virtual bool start_allreduce(void* buf, size_t count, Elem e, void* queue, double deadline, Ticket* t,
                               std::string* why) {
    (void)queue;
    *t = 0;
    return allreduce(buf, count, e, false, deadline, why);
  }
  /// As allgather_blocks, started: buf's other blocks are written, and read, only as above.
  virtual bool start_allgather_blocks(void* buf, size_t block, Elem e, void* queue, double deadline, Ticket* t,
                                      std::string* why) {
    (void)queue;
    *t = 0;
    return allgather_blocks(buf, block, e, deadline, why);
  }
  /// The work `queue` receives from now on runs after started collective t (and every one before
  /// it); the host does not wait.
  virtual void join(Ticket /*t*/, void* /*queue*/) {}
  /// Returns when every started collective has completed, or false (why set) when one failed or
  /// `deadline` passed (the communicator is then aborted, as for the calls above).
  virtual bool finish(double /*deadline*/, std::string* /*why*/) { return true; }
};

/// One NCCL communicator over the ranks of an MPI communicator, one GPU per rank (the node-local
/// rank modulo the node's GPU count), with one stream. Buffers are device memory it owns; the
/// DeviceCollectives calls take the caller's (on device()) and run on the same stream.
class NcclComm final : public DeviceCollectives {
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

  // DeviceCollectives: enqueued on this communicator's stream, then waited for as wait() does.
  bool allreduce(void* buf, size_t count, Elem e, bool max, double deadline, std::string* why) override;
  bool allgather_blocks(void* buf, size_t block, Elem e, double deadline, std::string* why) override;
  bool reduce_scatter_blocks(const void* full, void* slice, size_t block, Elem e, double deadline,
                             std::string* why) override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  /// Started collectives: on this communicator's stream behind an event recorded on `queue` (a
  /// cudaStream_t of the same device), each followed by an event join() makes `queue` wait for.
  bool queues() const override { return true; }
  bool start_reduce_scatter_blocks(const void* full, void* slice, size_t block, Elem e, void* queue, double deadline,
                                   Ticket* t, std::string* why) override;
  bool start_allreduce(void* buf, size_t count, Elem e, void* queue, double deadline, Ticket* t,
                       std::string* why) override;
  bool start_allgather_blocks(void* buf, size_t block, Elem e, void* queue, double deadline, Ticket* t,
                              std::string* why) override;
  void join(Ticket t, void* queue) override;
  bool finish(double deadline, std::string* why) override;

 private:
  NcclComm() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int device_ = -1, rank_ = 0, size_ = 1;
};

}  // namespace hpct::comm
