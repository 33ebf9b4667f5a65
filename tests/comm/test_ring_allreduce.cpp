// RingAllreduce against exact sums (nccl-tests' verifiable data: small integers from (rank,
// index), so every order of addition gives the same float) and against MPI_Allreduce, for counts
// around the segment and chunk edges, in and out of place, on 1-4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "hpct/comm/mpi.hpp"
#include "hpct/comm/ring_allreduce.hpp"

namespace hpct::comm {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
float value_of(int rank, size_t i) { return static_cast<float>((static_cast<size_t>(rank) * 7 + i * 13) % 61); }

TEST(RingAllreduce, SegmentsCoverTheBufferOnceAligned) {
  for (size_t count : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(1000), size_t(65537)})
    for (int n = 1; n <= 5; ++n) {
      size_t next = 0;
      for (int r = 0; r < n; ++r) {
        auto [b, e] = RingAllreduce::segment(count, n, r);
        EXPECT_EQ(b, next) << count << " " << n << " " << r;
        EXPECT_LE(b, e);
        if (e > b) {
          EXPECT_EQ(b % 16, 0u);
        }
        next = e;
      }
      EXPECT_EQ(next, count) << count << " " << n;
    }
}

// Chunks of 64 floats, so a segment of a few hundred floats takes several chunks and both halves
// of the scratch; counts below n * 16 leave some ranks an empty segment.
TEST(RingAllreduce, ExactSumsAtTheEdges) {
  const int n = world_size(), me = world_rank();
  RingAllreduce ring(MPI_COMM_WORLD, 64 * sizeof(float));
  EXPECT_EQ(ring.scratch_bytes(), n > 1 ? 2 * 64 * sizeof(float) : 0u);
  for (size_t count : {size_t(0), size_t(1), size_t(5), size_t(16), size_t(47), size_t(64), size_t(65), size_t(130),
                       size_t(1000), size_t(64 * 7 * 4 + 3)})
    for (bool in_place : {false, true}) {
      std::vector<float> in(count), out(count, -1.0f);
      for (size_t i = 0; i < count; ++i) in[i] = value_of(me, i);
      float* dst = in_place ? in.data() : out.data();
      ASSERT_TRUE(ring.run(in.data(), dst, count, steady_seconds() + 60));
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += value_of(q, i);
        wrong += dst[i] != want;
      }
      EXPECT_EQ(wrong, 0u) << "count " << count << (in_place ? " in place" : " out of place");
      if (!in_place) {
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(in[i], value_of(me, i)) << "input changed at " << i;
      }
    }
}

// From 4 MiB the reduction streams its stores past the cache (16-byte aligned SSE stores after a
// scalar prologue): buffers at odd float offsets exercise the prologue and the tail.
TEST(RingAllreduce, LargeBufferAtOddAddresses) {
  const int n = world_size(), me = world_rank();
  const size_t count = (size_t(1) << 20) + 5;
  std::vector<float> in_store(count + 1), out_store(count + 3, -1.0f);
  float* in = in_store.data() + 1;
  float* out = out_store.data() + 3;
  for (size_t i = 0; i < count; ++i) in[i] = value_of(me, i);
  RingAllreduce ring(MPI_COMM_WORLD, 4096 * sizeof(float) + 4);  // a chunk that is not a multiple of 16 floats
  ASSERT_TRUE(ring.run(in, out, count, steady_seconds() + 60));
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    float want = 0;
    for (int q = 0; q < n; ++q) want += value_of(q, i);
    wrong += out[i] != want;
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(out_store[2], -1.0f) << "wrote before the output";
}

// Fractional data: the ring adds in a different order than MPI_Allreduce, so results agree to
// rounding (n - 1 additions of values in [0, 1)), not bitwise.
TEST(RingAllreduce, AgreesWithMpiAllreduce) {
  const int me = world_rank(), n = world_size();
  const size_t count = (size_t(1) << 18) + 11;  // 1 MiB + a ragged tail, default 1 MiB chunks
  std::vector<float> in(count), ring_out(count), mpi_out(count);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i * 2654435761u + static_cast<size_t>(me) * 97) % 1000003) / 1000003.0f;
  RingAllreduce ring(MPI_COMM_WORLD);
  ASSERT_TRUE(ring.run(in.data(), ring_out.data(), count, steady_seconds() + 60));
  MPI_Allreduce(in.data(), mpi_out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double worst = 0;
  for (size_t i = 0; i < count; ++i) worst = std::max(worst, static_cast<double>(std::abs(ring_out[i] - mpi_out[i])));
  EXPECT_LE(worst, n * 2.4e-7 * n) << "largest difference from MPI_Allreduce";
}

}  // namespace
}  // namespace hpct::comm

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  hpct::comm::Environment env(&argc, &argv, hpct::comm::Threads::single);
  if (hpct::comm::world_rank() != 0) {
    auto& l = ::testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
  }
  int rc = RUN_ALL_TESTS(), any = rc;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
