// Small uploads through page-locked slots (pinned_uploads.hpp).
#include "pinned_uploads.hpp"

#include <cstring>
#include <string>

#include "checks.hpp"
#include "hpct/core/error.hpp"

namespace hpct::kernels::cuda {

PinnedUploads::~PinnedUploads() {
  for (Slot& s : slots_) {
    if (s.done) cudaEventDestroy(s.done);
    if (s.pinned) cudaFreeHost(s.pinned);
  }
}

bool PinnedUploads::upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes > kSlotBytes) return false;
  if (slots_.empty()) {
    slots_.resize(kSlots);
    for (Slot& s : slots_) {
      if (cudaHostAlloc(&s.pinned, kSlotBytes, cudaHostAllocDefault) != cudaSuccess ||
          cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();  // clear the error of the failed allocation
        available_ = false;
        break;
      }
    }
  }
  if (!available_) return false;
  Slot& s = slots_[next_];
  next_ = (next_ + 1) % kSlots;
  check(cudaEventSynchronize(s.done), "an earlier upload");
  std::memcpy(s.pinned, src, bytes);
  check(cudaMemcpyAsync(dst, s.pinned, bytes, cudaMemcpyHostToDevice, stream), "copy to the device");
  check(cudaEventRecord(s.done, stream), "cudaEventRecord (an upload)");
  return true;
}

}  // namespace hpct::kernels::cuda
