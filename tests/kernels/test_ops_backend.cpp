// The CPU OpsBackend and the backend plumbing every build has: memory calls, buffers, and the
// CUDA backend's refusal where it cannot run (a CPU-only build, or a CUDA build without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/half.hpp"
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

// A GEMM input given in 16 bits only, or in both forms, is the same input as its fp32 values (the
// CPU widens the 16-bit ones, exactly, and rounds them back to the op's precision): bitwise the same
// products in every form, forward and backward, bf16 and fp16. An fp32 op refuses a 16-bit-only one.
TEST(OpsBackend, CpuGemmOperandFormsAreOneInput) {
  BackendScope scope;
  auto be = cpu_ops();
  const int N = 7, C = 16, OC = 10;
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    std::vector<float> x(N * C), w(OC * C), b(OC), dout(N * OC);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.013f * static_cast<float>((i * 37) % 101) - 0.6f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.021f * static_cast<float>((i * 53) % 89) - 0.9f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = 0.1f * static_cast<float>(i);
    for (size_t i = 0; i < dout.size(); ++i) dout[i] = 0.03f * static_cast<float>((i * 29) % 31) - 0.4f;
    std::vector<uint16_t> x16(x.size()), w16(w.size());
    to_half(x.data(), x16.data(), x.size(), p);
    to_half(w.data(), w16.data(), w.size(), p);
    from_half(x16.data(), x.data(), x.size(), p);  // the fp32 form holds the rounded values
    from_half(w16.data(), w.data(), w.size(), p);
    struct Out {
      std::vector<float> out, dx, dw, db;
    };
    auto run = [&](Operand xi, Operand wi) {
      Out o{std::vector<float>(N * OC), std::vector<float>(N * C), std::vector<float>(OC * C, 0.5f),
            std::vector<float>(OC, 0.25f)};
      be->matmul_forward(o.out.data(), xi, wi, b.data(), N, C, OC, p);
      be->matmul_backward_into(o.dx.data(), o.dw.data(), o.db.data(), dout.data(), xi, wi, N, C, OC, p);
      return o;
    };
    const Out want = run(x.data(), w.data());
    for (const auto& [xi, wi] : {std::pair{Operand::half(x16.data()), Operand::half(w16.data())},
                                 std::pair{Operand(x.data(), x16.data()), Operand(w.data(), w16.data())},
                                 std::pair{Operand(x.data()), Operand::half(w16.data())}}) {
      const Out got = run(xi, wi);
      EXPECT_EQ(got.out, want.out) << precision_name(p);
      EXPECT_EQ(got.dx, want.dx) << precision_name(p);
      EXPECT_EQ(got.dw, want.dw) << precision_name(p);
      EXPECT_EQ(got.db, want.db) << precision_name(p);
    }
  }
  std::vector<float> out(N * OC), w(OC * C);
  std::vector<uint16_t> x16(N * C);
  EXPECT_THROW(be->matmul_forward(out.data(), Operand::half(x16.data()), w.data(), nullptr, N, C, OC, Precision::fp32),
               hpct::Error);
}

// The fused forms are their composites on the CPU, bitwise (the CUDA kernels are checked against
// these in test_fusions_cuda); the written gradients ignore what their buffer held (NaN here).
TEST(OpsBackend, FusedFormsAreTheirComposites) {
  BackendScope scope;
  auto be = cpu_ops();
  const int N = 5, C = 8, OC = 12;
  auto fill = [](std::vector<float>& v, int k) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>((i * k) % 101) - 0.5f;
  };
  std::vector<float> a(N * C), b(N * C), w(C), bias(C), x(N * C), fw(OC * C), fb(OC), dout(N * OC);
  fill(a, 37), fill(b, 41), fill(w, 43), fill(bias, 47), fill(x, 53), fill(fw, 59), fill(fb, 61), fill(dout, 67);
  std::vector<float> res(N * C), out(N * C), mean(N), rstd(N), res2 = b, out2(N * C), mean2(N), rstd2(N);
  residual_forward(res.data(), a.data(), b.data(), res.size());
  layernorm_forward(out.data(), mean.data(), rstd.data(), res.data(), w.data(), bias.data(), N, C);
  be->residual_layernorm_forward(res2.data(), out2.data(), mean2.data(), rstd2.data(), a.data(), res2.data(), w.data(),
                                 bias.data(), N, C);  // in place, as the model calls it
  EXPECT_EQ(res2, res);
  EXPECT_EQ(out2, out);
  EXPECT_EQ(mean2, mean);
  EXPECT_EQ(rstd2, rstd);
  rmsnorm_forward(out.data(), rstd.data(), res.data(), w.data(), N, C);
  be->residual_rmsnorm_forward(res2.data(), out2.data(), rstd2.data(), a.data(), b.data(), w.data(), N, C);
  EXPECT_EQ(res2, res);
  EXPECT_EQ(out2, out);
  EXPECT_EQ(rstd2, rstd);

  std::vector<float> pre(N * OC), act(N * OC), pre2(N * OC), act2(N * OC);
  matmul_forward(pre.data(), x.data(), fw.data(), fb.data(), N, C, OC, Precision::fp32);
  gelu_forward(act.data(), pre.data(), act.size());
  be->matmul_gelu_forward(pre2.data(), act2.data(), x.data(), fw.data(), fb.data(), nullptr, N, C, OC,
                          Precision::fp32);
  EXPECT_EQ(pre2, pre);
  EXPECT_EQ(act2, act);

  const float nan = std::nanf("");
  std::vector<float> dx(N * C, 0.0f), dw(OC * C, 0.5f), db(OC, 0.25f), dx2(N * C, nan), dw2 = dw, db2 = db;
  matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), fw.data(), N, C, OC, Precision::fp32);
  be->matmul_backward_into(dx2.data(), dw2.data(), db2.data(), dout.data(), x.data(), fw.data(), N, C, OC,
                           Precision::fp32);
  EXPECT_EQ(dx2, dx);
  EXPECT_EQ(dw2, dw);
  EXPECT_EQ(db2, db);
  std::vector<float> dpre(N * OC, 0.0f), dpre2(N * OC, nan);
  gelu_backward(dpre.data(), pre.data(), dout.data(), dpre.size());
  be->gelu_backward_into(dpre2.data(), pre.data(), dout.data(), dpre2.size(), Precision::fp32);
  EXPECT_EQ(dpre2, dpre);

  const int B = 1, T = 3, AC = 4, NH = 2;  // attention on B*T = 3 rows of q | k | v
  std::vector<float> qkv(B * T * 3 * AC), aout(B * T * AC), att(B * NH * T * T), ad(B * T * AC);
  fill(qkv, 71), fill(ad, 73);
  be->attention_forward(aout.data(), att.data(), qkv.data(), B, T, AC, NH, Precision::fp32, nullptr, nullptr, {});
  std::vector<float> dqkv(qkv.size(), 0.0f), dqkv2(qkv.size(), nan);
  be->attention_backward(dqkv.data(), ad.data(), qkv.data(), att.data(), {}, B, T, AC, NH, Precision::fp32, nullptr, {});
  be->attention_backward_into(dqkv2.data(), ad.data(), qkv.data(), att.data(), {}, B, T, AC, NH, Precision::fp32, nullptr,
                              {});
  EXPECT_EQ(dqkv2, dqkv);
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
