// The CUDA backend's small uploads through page-locked slots (internal to lib/kernels): what lets
// copy_from_host return before a small copy (tokens, targets, a routing table) has reached the
// device without draining the compute stream once per micro-step.
//
// What it is: a ring of 8 page-locked slots of 1 MiB, made on first use; an upload copies src into
// the next slot on the host, queues the slot's copy on the caller's stream and records the slot's
// event, and a slot is reused only once its event says its previous upload is done (normally long
// before). What it is not: for large copies (over a slot) or where page-locked memory cannot be
// had: upload() says false and the caller copies synchronously.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace hpct::kernels::cuda {

class PinnedUploads {
 public:
  static constexpr size_t kSlotBytes = size_t(1) << 20, kSlots = 8;

  PinnedUploads() = default;
  /// The caller has synchronised the streams its uploads ran on.
  ~PinnedUploads();
  PinnedUploads(const PinnedUploads&) = delete;
  PinnedUploads& operator=(const PinnedUploads&) = delete;

  /// dst (device) = src (host, reusable on return) in `stream`'s order, through a slot; false
  /// (nothing queued) when bytes exceed a slot or page-locked memory could not be had.
  bool upload(void* dst, const void* src, size_t bytes, cudaStream_t stream);

 private:
  struct Slot {
    void* pinned = nullptr;
    cudaEvent_t done = nullptr;
  };
  std::vector<Slot> slots_;  // made on first use
  size_t next_ = 0;
  bool available_ = true;
};

}  // namespace hpct::kernels::cuda
