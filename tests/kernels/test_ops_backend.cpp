// The CPU OpsBackend and the backend plumbing every build has: memory calls, buffers, and the
// CUDA backend's refusal where it cannot run (a CPU-only build, or a CUDA build without a GPU).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/ops.hpp"
#include "hpct/kernels/ops_backend.hpp"

using namespace hpct::kernels;

TEST(OpsBackend, CpuMemoryRoundTrip) {
  auto be = cpu_ops();
  EXPECT_EQ(be->name(), "cpu");
  EXPECT_TRUE(be->host_memory());
  std::vector<float> in = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  BackendBuffer buf(*be, in.size() * sizeof(float));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.as<void>()) % 64, 0u);
  be->copy_from_host(buf.as<void>(), in.data(), in.size() * sizeof(float));
  std::vector<float> out(in.size(), -1.0f);
  be->copy_to_host(out.data(), buf.as<void>(), out.size() * sizeof(float));
  EXPECT_EQ(out, in);
  be->zero(buf.as<void>(), 2 * sizeof(float));
  be->copy_to_host(out.data(), buf.as<void>(), out.size() * sizeof(float));
  EXPECT_EQ(out, (std::vector<float>{0.0f, 0.0f, 3.25f, 0.0f, 7.0f}));
  BackendBuffer moved = std::move(buf);
  EXPECT_EQ(buf.bytes(), 0u);
  EXPECT_EQ(moved.bytes(), in.size() * sizeof(float));
}

// The CPU backend is ops.hpp: the same call gives bitwise the same result.
TEST(OpsBackend, CpuForwardsToTheCpuOps) {
  BackendScope scope;
  auto be = cpu_ops();
  const int N = 5, C = 8, OC = 6;
  std::vector<float> x(N * C), w(OC * C), b(OC);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>((i * 37) % 101) - 0.5f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.02f * static_cast<float>((i * 53) % 89) - 0.9f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.1f * static_cast<float>(i);
  std::vector<float> direct(N * OC), via(N * OC);
  matmul_forward(direct.data(), x.data(), w.data(), b.data(), N, C, OC, Precision::bf16);
  be->matmul_forward(via.data(), x.data(), w.data(), b.data(), N, C, OC, Precision::bf16);
  EXPECT_EQ(via, direct);
}

// Row moves: scatter_rows puts back what gather_rows took (random-LTD's kept rows); other rows stay.
TEST(OpsBackend, ScatterRowsInvertsGatherRows) {
  BackendScope scope;
  auto be = cpu_ops();
  const int N = 7, C = 5;
  std::vector<float> full(N * C), sub(3 * C), back(N * C, -1.0f);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
  const std::vector<int32_t> rows = {5, 1, 3};
  be->gather_rows(sub.data(), full.data(), rows.data(), rows.size(), C);
  for (size_t j = 0; j < rows.size(); ++j)
    for (int c = 0; c < C; ++c) EXPECT_EQ(sub[j * C + c], full[(size_t)rows[j] * C + c]);
  be->scatter_rows(back.data(), sub.data(), rows.data(), rows.size(), C);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) {
      const bool kept = r == 1 || r == 3 || r == 5;
      EXPECT_EQ(back[(size_t)r * C + c], kept ? full[(size_t)r * C + c] : -1.0f) << "row " << r;
    }
}

// Where the CUDA backend cannot run, it says why in one line, naming the backend.
TEST(OpsBackend, CudaRefusesWithAReasonWhereItCannotRun) {
  std::string why;
  if (cuda_ops_available(&why)) GTEST_SKIP() << "a CUDA device is here: test_gpt_cuda covers it";
  EXPECT_FALSE(why.empty());
  try {
    cuda_ops(0);
    FAIL() << "cuda_ops() returned a backend although cuda_ops_available() is false";
  } catch (const hpct::Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA backend: " + why), std::string::npos) << e.what();
  }
}
