// Ring all-reduce over MPI point-to-point (see ring_allreduce.hpp for the design and its limits).
#include "hpct/comm/ring_allreduce.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>

#include "hpct/comm/mpi.hpp"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace hpct::comm {
namespace {

constexpr size_t kAlign = 16;  // floats: segments start on 64-byte boundaries of the buffer
// Buffers from this size up bypass the cache when the reduction writes them (add_into): beyond
// any core's L2, where a plain store would first read each line only to overwrite it.
constexpr size_t kStreamBytes = size_t(4) << 20;

int mod(int a, int n) { return ((a % n) + n) % n; }

// d = a + t. With `stream`, d is written with non-temporal stores: a large result is not read
// again by this core soon (the next step sends it, a peer copies it), and skipping the read for
// ownership of d's lines saves one of the three memory streams per element. Measured on 2 ranks at
// 64 MiB: busbw / p2p 0.70-0.85 with plain stores, 0.80-0.94 with these (docs/benchmarks/fabric.md).
void add_into(float* d, const float* a, const float* t, size_t len, bool stream) {
  size_t i = 0;
#if defined(__SSE2__)
  if (stream) {
    for (; i < len && (reinterpret_cast<uintptr_t>(d + i) & 15u); ++i) d[i] = a[i] + t[i];
    for (; i + 4 <= len; i += 4) _mm_stream_ps(d + i, _mm_add_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(t + i)));
    _mm_sfence();  // the streamed lines are visible before anything is sent from d
  }
#else
  (void)stream;
#endif
  for (; i < len; ++i) d[i] = a[i] + t[i];
}

}  // namespace

RingAllreduce::RingAllreduce(MPI_Comm comm, size_t chunk_bytes, int tag)
    : comm_(comm), tag_(tag), chunk_(std::max<size_t>(chunk_bytes / sizeof(float), kAlign)) {
  HPCT_CHECK_MPI(MPI_Comm_rank(comm, &rank_));
  HPCT_CHECK_MPI(MPI_Comm_size(comm, &size_));
  if (size_ > 1) scratch_.assign(2 * chunk_, 0.0f);
}

std::pair<size_t, size_t> RingAllreduce::segment(size_t count, int n, int r) {
  size_t seg = (count + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
  seg = (seg + kAlign - 1) / kAlign * kAlign;
  size_t b = std::min(count, seg * static_cast<size_t>(r));
  return {b, std::min(count, b + seg)};
}

bool RingAllreduce::fail() {
  keep_until_exit(std::move(scratch_));  // MPI may still write into it
  scratch_.assign(2 * chunk_, 0.0f);
  sends_.clear();
  return false;
}

bool RingAllreduce::run(const float* in, float* out, size_t count, double deadline, PollPolicy policy) {
  if (size_ == 1 || count == 0) {
    if (in != out && count) std::memcpy(out, in, count * sizeof(float));
    return true;
  }
  auto [b0, e0] = segment(count, size_, 0);
  if (e0 - b0 > static_cast<size_t>(INT_MAX))
    throw Error("RingAllreduce: " + std::to_string(count) + " floats over " + std::to_string(size_) +
                " ranks makes segments beyond MPI's int count; split the buffer");
  if (!reduce_scatter(in, out, count, deadline, policy)) return fail();
  if (!all_gather(out, count, deadline, policy)) return fail();
  return true;
}

// Step s sends segment (r - s) to the right (from in at s = 0, then what step s - 1 reduced) and
// receives segment (r - s - 1) from the left in chunks, adding in's own part: after n - 1 steps
// segment (r + 1) holds the full sum. All sends of a step are posted at once (their data are
// final); receives run two ahead, one per scratch half, so the copy of chunk k + 1 overlaps the
// addition of chunk k. One tag throughout: MPI's ordering between a pair of ranks matches the
// k-th send with the k-th receive.
bool RingAllreduce::reduce_scatter(const float* in, float* out, size_t count, double deadline, PollPolicy policy) {
  const int n = size_, right = mod(rank_ + 1, n), left = mod(rank_ - 1, n);
  const bool stream = count * sizeof(float) >= kStreamBytes;
  for (int s = 0; s < n - 1; ++s) {
    auto [sb, se] = segment(count, n, mod(rank_ - s, n));
    // Plain variables, not a structured binding: the lambda below captures them (Clang < 16).
    const auto rseg = segment(count, n, mod(rank_ - s - 1, n));
    const size_t rb = rseg.first, re = rseg.second;
    const float* src = s == 0 ? in : out;
    sends_.clear();
    for (size_t o = sb; o < se; o += chunk_) {
      MPI_Request q;
      HPCT_CHECK_MPI(MPI_Isend(src + o, static_cast<int>(std::min(chunk_, se - o)), MPI_FLOAT, right, tag_, comm_, &q));
      sends_.push_back(q);
    }
    const size_t chunks = (re - rb + chunk_ - 1) / chunk_;
    MPI_Request recv[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    auto post = [&](size_t k) {
      size_t o = rb + k * chunk_;
      HPCT_CHECK_MPI(MPI_Irecv(scratch_.data() + (k & 1) * chunk_, static_cast<int>(std::min(chunk_, re - o)), MPI_FLOAT,
                               left, tag_, comm_, &recv[k & 1]));
    };
    for (size_t k = 0; k < std::min<size_t>(chunks, 2); ++k) post(k);
    for (size_t k = 0; k < chunks; ++k) {
      if (!wait_all_until(&recv[k & 1], 1, deadline, policy)) return false;
      const size_t o = rb + k * chunk_, len = std::min(chunk_, re - o);
      add_into(out + o, in + o, scratch_.data() + (k & 1) * chunk_, len, stream);
      if (k + 2 < chunks) post(k + 2);
    }
    if (!sends_.empty() && !wait_all_until(sends_.data(), static_cast<int>(sends_.size()), deadline, policy)) return false;
  }
  return true;
}

// Step s forwards segment (r + 1 - s) to the right and receives segment (r - s) from the left
// straight into out.
bool RingAllreduce::all_gather(float* out, size_t count, double deadline, PollPolicy policy) {
  const int n = size_, right = mod(rank_ + 1, n), left = mod(rank_ - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    auto [sb, se] = segment(count, n, mod(rank_ + 1 - s, n));
    const auto rseg = segment(count, n, mod(rank_ - s, n));
    const size_t rb = rseg.first, re = rseg.second;
    MPI_Request q[2];
    int k = 0;
    if (re > rb) HPCT_CHECK_MPI(MPI_Irecv(out + rb, static_cast<int>(re - rb), MPI_FLOAT, left, tag_ + 1, comm_, &q[k++]));
    if (se > sb) HPCT_CHECK_MPI(MPI_Isend(out + sb, static_cast<int>(se - sb), MPI_FLOAT, right, tag_ + 1, comm_, &q[k++]));
    if (k && !wait_all_until(q, k, deadline, policy)) return false;
  }
  return true;
}

}  // namespace hpct::comm
