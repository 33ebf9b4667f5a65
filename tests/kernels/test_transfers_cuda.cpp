// The CUDA backend's transfers beside its ops (OpsBackend::download_async / upload_async, their
// tickets, await_transfer, page-locked host memory; lib/kernels/src/cuda/transfer_queues.hpp), which
// ZeRO-Offload's store uses to hand gradients and parameters over during the backward and forward.
// Checked: a transfer sees every op queued before it (a large kernel's output is downloaded whole;
// an upload does not overwrite what a kernel queued before it still reads); ops queued after
// await_transfer see the upload; more transfers in flight than the ticket ring holds (64 a
// direction) all land and their tickets all finish. Exact comparisons: these are copies, and the
// kernels used (widen_half) are exact. Without a CUDA device every test is SKIPPED.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/ops_backend.hpp"

using namespace hpct::kernels;

namespace {

#define NEED_GPU(be)                  \
  std::unique_ptr<OpsBackend> be;     \
  {                                   \
    std::string why;                  \
    if (!cuda_ops_available(&why)) GTEST_SKIP() << why; \
    be = cuda_ops(0);                 \
  }

// bf16 patterns: every value is exact in fp32 (widen_half), none is a NaN.
std::vector<uint16_t> pattern(size_t n, uint16_t salt) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(0x3f80 + ((i * 7 + salt) % 0x0400));
  return v;
}

struct HostBuf {  // page-locked memory of the backend
  OpsBackend& be;
  void* p;
  HostBuf(OpsBackend& b, size_t bytes) : be(b), p(b.allocate_host(bytes)) {}
  ~HostBuf() { be.release_host(p); }
  template <class T>
  T* as() { return static_cast<T*>(p); }
};

}  // namespace

// Races made visible: 40 kernels queued before a transfer take milliseconds on the device while a
// copy started at once would read or write its first bytes within microseconds. The final kernel
// of the download case writes other values than the 39 before it; the upload case's kernels read
// what the upload then replaces.
constexpr int kPasses = 40;

TEST(CudaTransfers, ADownloadSeesTheOpsQueuedBeforeIt) {
  NEED_GPU(be);
  const size_t n = size_t(64) << 20;  // 256 MiB of fp32
  const std::vector<uint16_t> early = pattern(n, 3), last = pattern(n, 9);
  BackendBuffer a16(*be, n * 2), b16(*be, n * 2), d32(*be, n * 4);
  HostBuf out(*be, n * 4);  // page-locked before anything is queued (cudaHostAlloc may synchronise)
  be->copy_from_host(a16.as<void>(), early.data(), n * 2);
  be->copy_from_host(b16.as<void>(), last.data(), n * 2);
  be->zero(d32.as<void>(), n * 4);
  be->synchronize();
  for (int k = 0; k + 1 < kPasses; ++k) be->widen_half(d32.as<float>(), a16.as<uint16_t>(), n, Precision::bf16);
  be->widen_half(d32.as<float>(), b16.as<uint16_t>(), n, Precision::bf16);
  const OpsBackend::Transfer t = be->download_async(out.p, d32.as<void>(), n * 4);
  EXPECT_NE(t, 0u);
  be->wait_transfer(t);
  EXPECT_TRUE(be->transfer_done(t));
  std::vector<float> want(n);
  from_half(last.data(), want.data(), n, Precision::bf16);
  EXPECT_EQ(std::memcmp(out.p, want.data(), n * 4), 0) << "the download ran before the kernels queued ahead of it";
}

TEST(CudaTransfers, AnUploadWaitsForTheOpsBeforeItAndTheOpsAfterAwaitIt) {
  NEED_GPU(be);
  const size_t n = size_t(64) << 20;
  const std::vector<uint16_t> old16 = pattern(n, 5), new16 = pattern(n, 11);
  BackendBuffer d16(*be, n * 2), before(*be, n * 4), after(*be, n * 4);
  HostBuf src(*be, n * 2);
  std::memcpy(src.p, new16.data(), n * 2);
  be->copy_from_host(d16.as<void>(), old16.data(), n * 2);
  be->synchronize();
  for (int k = 0; k < kPasses; ++k)  // each reads the old values
    be->widen_half(before.as<float>(), d16.as<uint16_t>(), n, Precision::bf16);
  const OpsBackend::Transfer t = be->upload_async(d16.as<void>(), src.p, n * 2);
  be->await_transfer(t);
  be->widen_half(after.as<float>(), d16.as<uint16_t>(), n, Precision::bf16);  // must read the new ones
  std::vector<float> got(n), want(n);
  be->copy_to_host(got.data(), before.as<void>(), n * 4);
  from_half(old16.data(), want.data(), n, Precision::bf16);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0) << "the upload overwrote what earlier kernels read";
  be->copy_to_host(got.data(), after.as<void>(), n * 4);
  from_half(new16.data(), want.data(), n, Precision::bf16);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0) << "a kernel after await_transfer read before the upload";
  be->wait_transfer(t);
}

TEST(CudaTransfers, MoreInFlightThanTheRingAllLand) {
  NEED_GPU(be);
  const size_t blocks = 200, n = 4096;  // 200 per direction against a ring of 64
  std::vector<uint16_t> all(blocks * n);
  for (size_t b = 0; b < blocks; ++b) {
    const std::vector<uint16_t> p = pattern(n, static_cast<uint16_t>(b));
    std::copy(p.begin(), p.end(), all.begin() + b * n);
  }
  HostBuf up(*be, all.size() * 2), down(*be, all.size() * 2);
  std::memcpy(up.p, all.data(), all.size() * 2);
  std::memset(down.p, 0, all.size() * 2);
  BackendBuffer dev(*be, all.size() * 2);
  std::vector<OpsBackend::Transfer> ups, downs;
  for (size_t b = 0; b < blocks; ++b)
    ups.push_back(be->upload_async(dev.as<uint16_t>() + b * n, up.as<uint16_t>() + b * n, n * 2));
  for (size_t b = 0; b < blocks; ++b) be->await_transfer(ups[b]);
  for (size_t b = 0; b < blocks; ++b)  // queued after the awaits: each reads its uploaded block
    downs.push_back(be->download_async(down.as<uint16_t>() + b * n, dev.as<uint16_t>() + b * n, n * 2));
  for (size_t b = 0; b < blocks; ++b) be->wait_transfer(downs[b]);
  for (size_t b = 0; b < blocks; ++b) {
    EXPECT_TRUE(be->transfer_done(ups[b])) << "upload " << b;
    EXPECT_TRUE(be->transfer_done(downs[b])) << "download " << b;
  }
  EXPECT_EQ(std::memcmp(down.p, all.data(), all.size() * 2), 0);
  for (size_t b = 1; b < blocks; ++b) EXPECT_NE(ups[b], ups[b - 1]);
  EXPECT_NE(ups[0], downs[0]) << "tickets name their direction";
}
