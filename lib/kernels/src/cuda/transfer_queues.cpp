// The CUDA backend's transfer queues (see transfer_queues.hpp).
#include "transfer_queues.hpp"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <string>

#include "checks.hpp"
#include "hpct/core/error.hpp"

namespace hpct::kernels::cuda {
namespace {
const char* dir_name(uint64_t ticket) { return (ticket & 1) ? "an upload" : "a download"; }
}  // namespace

TransferQueues::TransferQueues(cudaStream_t compute) : compute_(compute) {
  check(cudaEventCreateWithFlags(&order_, cudaEventDisableTiming), "cudaEventCreate (transfer order)");
  for (Queue& q : q_) {
    check(cudaStreamCreateWithFlags(&q.stream, cudaStreamNonBlocking), "cudaStreamCreate (a copy stream)");
    q.ring.resize(kRing, nullptr);
    for (cudaEvent_t& e : q.ring) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate (a transfer)");
  }
}

TransferQueues::~TransferQueues() {
  for (Queue& q : q_) {
    if (q.stream) cudaStreamSynchronize(q.stream);
    for (cudaEvent_t e : q.ring)
      if (e) cudaEventDestroy(e);
    if (q.stream) cudaStreamDestroy(q.stream);
  }
  if (order_) cudaEventDestroy(order_);
}

uint64_t TransferQueues::queue(int dir, void* dst, const void* src, size_t bytes) {
  Queue& q = q_[dir];
  const uint64_t seq = q.issued + 1;
  // The ring slot's previous transfer (kRing earlier, same direction) must be done before its event
  // is recorded again; the copy stream is in order, so that is one wait at most.
  if (seq > kRing && q.finished < seq - kRing) {
    check(cudaEventSynchronize(q.ring[seq % kRing]), std::string("waiting for ") + (dir ? "an upload" : "a download"));
    q.finished = seq - kRing;
  }
  check(cudaEventRecord(order_, compute_), "cudaEventRecord (transfer order)");
  check(cudaStreamWaitEvent(q.stream, order_, 0), "cudaStreamWaitEvent (transfer order)");
  check(cudaMemcpyAsync(dst, src, bytes, dir ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, q.stream),
        dir ? "an upload to the device" : "a download to the host");
  check(cudaEventRecord(q.ring[seq % kRing], q.stream), "cudaEventRecord (a transfer)");
  q.issued = seq;
  return seq << 1 | uint64_t(dir);
}

uint64_t TransferQueues::download(void* dst, const void* src, size_t bytes) { return queue(0, dst, src, bytes); }
uint64_t TransferQueues::upload(void* dst, const void* src, size_t bytes) { return queue(1, dst, src, bytes); }

bool TransferQueues::done(uint64_t ticket) {
  if (ticket == 0) return true;
  Queue& q = of(ticket);
  const uint64_t seq = ticket >> 1;
  if (seq <= q.finished) return true;
  // A later transfer may have reused the slot: its completion implies this one's (in order).
  const cudaError_t st = cudaEventQuery(q.ring[seq % kRing]);
  if (st == cudaErrorNotReady) return false;
  check(st, std::string("querying ") + dir_name(ticket));
  q.finished = std::max(q.finished, seq);
  return true;
}

void TransferQueues::wait(uint64_t ticket) {
  if (done(ticket)) return;
  Queue& q = of(ticket);
  check(cudaEventSynchronize(q.ring[(ticket >> 1) % kRing]), std::string("waiting for ") + dir_name(ticket));
  q.finished = std::max(q.finished, ticket >> 1);
}

void TransferQueues::order_compute_after(uint64_t ticket) {
  if (done(ticket)) return;
  check(cudaStreamWaitEvent(compute_, of(ticket).ring[(ticket >> 1) % kRing], 0),
        std::string("cudaStreamWaitEvent (") + dir_name(ticket) + ")");
}

void* TransferQueues::allocate_host(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) == cudaSuccess) return p;
  cudaGetLastError();  // clear the failed call's error
  p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64 * (bytes == 0));
  if (!p) throw std::bad_alloc();
  std::lock_guard<std::mutex> lock(host_mu_);
  unpinned_.insert(p);
  return p;
}

void TransferQueues::release_host(void* p) noexcept {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(host_mu_);
    if (unpinned_.erase(p)) {
      std::free(p);
      return;
    }
  }
  cudaFreeHost(p);
}

}  // namespace hpct::kernels::cuda
