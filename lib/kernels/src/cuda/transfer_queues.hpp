// The CUDA backend's transfers beside its ops (internal to lib/kernels): OpsBackend's
// download_async / upload_async / transfer_done / wait_transfer / await_transfer, and its
// page-locked host memory.
//
// What it is: one copy stream per direction (device -> host, host -> device), so a download and an
// upload run at once on the card's copy engines while the compute stream goes on. Each transfer
// is queued after every op queued before it on the compute stream (an event that stream records
// and the copy stream waits for), and records an event of its own in a ring per direction; its
// ticket is its sequence number in that direction with the direction in the low bit. A copy
// stream runs in call order, so a finished transfer says every earlier one of its direction has
// finished: a ring slot is reused once the transfer that last used it is known to be done.
// What it is not: a scheduler. Callers keep src and dst alive (and unchanged where they are read)
// until the ticket says so; device memory freed stream-ordered on the compute stream must not be
// under a transfer then (ZeRO-Offload's store waits first).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace hpct::kernels::cuda {

class TransferQueues {
 public:
  /// After the ops of `compute` (the backend's stream). Throws hpct::Error where the streams or
  /// events cannot be made.
  explicit TransferQueues(cudaStream_t compute);
  ~TransferQueues();
  TransferQueues(const TransferQueues&) = delete;
  TransferQueues& operator=(const TransferQueues&) = delete;

  uint64_t download(void* dst, const void* src, size_t bytes);
  uint64_t upload(void* dst, const void* src, size_t bytes);
  bool done(uint64_t ticket);
  void wait(uint64_t ticket);
  /// The compute stream's later ops wait for the transfer (on the device).
  void order_compute_after(uint64_t ticket);

  /// Page-locked host memory (cudaHostAlloc); where the driver will not give it, ordinary memory
  /// (the copies then run at pageable speed, correct all the same).
  void* allocate_host(size_t bytes);
  void release_host(void* p) noexcept;

 private:
  static constexpr size_t kRing = 64;  // events per direction: transfers in flight before one waits
  struct Queue {
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> ring;
    uint64_t issued = 0, finished = 0;  // transfers 1..issued queued; 1..finished known to be done
  };
  uint64_t queue(int dir, void* dst, const void* src, size_t bytes);
  Queue& of(uint64_t ticket) { return q_[ticket & 1]; }

  cudaStream_t compute_;
  cudaEvent_t order_ = nullptr;  // recorded on compute_ before each transfer, waited for by its copy stream
  Queue q_[2];                   // 0: downloads, 1: uploads
  std::mutex host_mu_;
  std::unordered_set<void*> unpinned_;  // allocate_host's fallbacks (freed with std::free)
};

}  // namespace hpct::kernels::cuda
