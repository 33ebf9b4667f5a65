// NcclComm's started collectives (start_*, join, finish: comm/gpu.hpp) on one GPU, one rank: the
// order they promise against the CUDA backend's stream. With one rank a sum is its input, so each
// result is known; what can go wrong is when it is computed:
// - the collective must run after what the backend's stream held when it was started: the input is
//   written there behind some milliseconds of other work, so a collective that ran at once would
//   reduce the zeros before it;
// - the backend's work queued after join(t) must run after collective t: a copy of the result
//   queued then would read the zeros NCCL had not yet replaced;
// - finish() returns when all are done, its events reused by the next round.
// Without a GPU (or a CUDA build whose NCCL cannot start) every test is SKIPPED. Exact equality:
// nothing is computed but copies and one-term sums.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../engine/mpi_gtest_main.hpp"
#include "hpct/comm/deadline.hpp"
#include "hpct/comm/gpu.hpp"
#include "hpct/kernels/ops_backend.hpp"

using namespace hpct;

namespace {

struct OneGpu {
  std::unique_ptr<kernels::OpsBackend> be;
  std::unique_ptr<comm::NcclComm> nccl;
  std::string why;
  OneGpu() {
    if (!kernels::cuda_ops_available(&why)) return;
    if (comm::gpu_count(&why) < 1) return;
    be = kernels::cuda_ops(0);
    nccl = comm::NcclComm::create(test::world().raw(), 0, comm::steady_seconds() + 120, {}, &why);
  }
  bool ok() const { return be && nccl; }
};

double deadline() { return comm::steady_seconds() + 120; }

}  // namespace

TEST(NcclQueued, StartedCollectivesKeepTheBackendsOrder) {
  if (test::world().size() != 1) GTEST_SKIP() << "one rank";
  OneGpu g;
  if (!g.ok()) GTEST_SKIP() << g.why;
  kernels::OpsBackend& be = *g.be;
  const size_t big = size_t(64) << 20, n = size_t(1) << 20;  // 256 MB of slow work; 4 MB of input
  kernels::BackendBuffer slow(be, big * sizeof(float)), src(be, n * sizeof(float)), x(be, n * sizeof(float)),
      y(be, n * sizeof(float)), z(be, n * sizeof(float));
  std::vector<float> want(n), got(n);
  for (size_t i = 0; i < n; ++i) want[i] = static_cast<float>(i % 1000) + 0.25f;
  be.copy_from_host(src.as<void>(), want.data(), n * sizeof(float));
  be.zero(slow.as<void>(), big * sizeof(float));
  for (int round = 0; round < 3; ++round) {  // later rounds reuse the first round's events
    be.zero(x.as<void>(), n * sizeof(float));
    be.zero(y.as<void>(), n * sizeof(float));
    be.zero(z.as<void>(), n * sizeof(float));
    be.synchronize();
    for (int k = 0; k < 20; ++k) be.add_scaled(slow.as<float>(), slow.as<float>(), 0.5f, big);  // milliseconds
    be.add_scaled(x.as<float>(), src.as<float>(), 1.0f, n);  // x = src, behind them
    void* q = be.queue_handle();
    ASSERT_NE(q, nullptr) << "the CUDA backend names its stream";
    comm::DeviceCollectives::Ticket t1 = 0, t2 = 0;
    std::string why;
    ASSERT_TRUE(g.nccl->start_allreduce(x.as<void>(), n, comm::DeviceCollectives::Elem::f32, q, deadline(), &t1, &why))
        << why;
    ASSERT_TRUE(g.nccl->start_reduce_scatter_blocks(x.as<void>(), y.as<void>(), n, comm::DeviceCollectives::Elem::f32,
                                                    q, deadline(), &t2, &why))
        << why;
    EXPECT_LT(t1, t2) << "tickets in start order";
    g.nccl->join(t2, q);
    be.add_scaled(z.as<float>(), y.as<float>(), 1.0f, n);  // z = y, after the reduce-scatter
    ASSERT_TRUE(g.nccl->finish(deadline(), &why)) << why;
    be.copy_to_host(got.data(), y.as<void>(), n * sizeof(float));
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += got[i] != want[i];
    EXPECT_EQ(bad, 0u) << "round " << round << ": the collectives ran before the input was written";
    be.copy_to_host(got.data(), z.as<void>(), n * sizeof(float));
    bad = 0;
    for (size_t i = 0; i < n; ++i) bad += got[i] != want[i];
    EXPECT_EQ(bad, 0u) << "round " << round << ": the work queued after join ran before the collective";
  }
  std::string why;
  EXPECT_TRUE(g.nccl->finish(deadline(), &why)) << "nothing started: " << why;
}

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
