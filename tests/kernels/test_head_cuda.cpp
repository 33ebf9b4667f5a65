// The LM head in 16 bits on the CUDA backend (OpsBackend::matmul_forward_half,
// softmax_cross_entropy_half, matmul_backward_half) against the CPU backend's (the fp32 ops on
// widened and rounded copies), bf16 and fp16, on inputs given in 16 bits only, in fp32 only and mixed,
// with ignored rows (target -1) and padding columns (V < Vp). Each GPU op is fed the CPU's inputs
// (the CPU's 16-bit logits for the cross entropy, its 16-bit gradient for the backward), so each is
// checked on its own. Without a CUDA device every test is SKIPPED.
//
// Tolerances: a 16-bit logit or gradient is the device's fp32 value rounded once, and the device's
// fp32 value differs from the CPU's by ~1e-6 relative (another summation order; expf against
// glibc's exp): within 2 units in the last place (2^-7 relative for bf16, 2^-10 for fp16) plus 1e-6
// absolute for values near 0. The losses: fp32 on both sides from the same 16-bit logits, 1e-5
// relative. Ignored rows and padding columns: exactly 0. The backward's GEMMs: 1e-2 of the norm, as
// the other 16-bit GEMMs (test_linear_cuda).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hpct/kernels/half.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "cuda_test_util.hpp"

using namespace hpct::kernels;
using namespace hpct::kernels::test;  // cuda_test_util.hpp

namespace {

[[maybe_unused]] const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new BackendEnv);

Vec widened(const std::vector<uint16_t>& h, Precision p) {
  Vec f(h.size());
  from_half(h.data(), f.data(), h.size(), p);
  return f;
}

std::vector<uint16_t> get16(Gpu& g, const uint16_t* d, size_t n) {
  std::vector<uint16_t> h(n);
  g.be->copy_to_host(h.data(), d, n * sizeof(uint16_t));
  return h;
}

void head_case(Precision p) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int N = 37, C = 64, V = 1000, Vp = 1024;
  const double ulp2 = p == Precision::bf16 ? 0x1.0p-7 : 0x1.0p-10;
  Rounded x((size_t)N * C, 1, 1.0f, p), w((size_t)Vp * C, 2, 0.2f, p);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = i % 9 == 4 ? -1 : (i * 131 + 7) % V;
  const float dloss = 0.25f;

  // The CPU: logits, loss and gradient, backward.
  std::vector<uint16_t> logits((size_t)N * Vp), grad;
  cpu->matmul_forward_half(logits.data(), x.f.data(), w.f.data(), N, C, Vp, p);
  grad = logits;
  Vec losses(N);
  cpu->softmax_cross_entropy_half(grad.data(), losses.data(), targets.data(), dloss, N, V, Vp, p);
  const Vec dinp0 = randn((size_t)N * C, 3, 0.1f), dw0 = randn((size_t)Vp * C, 4, 0.1f);  // both accumulate
  Vec dinp = dinp0, dw = dw0;
  cpu->matmul_backward_half(dinp.data(), dw.data(), grad.data(), x.f.data(), w.f.data(), N, C, Vp, p);

  // The inputs in 16 bits only, in fp32 only, and mixed (an activation in 16 bits beside a weight
  // without its 16-bit copy).
  for (int form = 0; form < 3; ++form) {
    const std::string what = std::string(precision_name(p)) +
                             (form == 0 ? ", 16-bit inputs" : form == 1 ? ", fp32 inputs" : ", 16-bit input, fp32 weight");
    const Operand dx = form != 1 ? Operand::half(g.put(x.h)) : Operand(g.put(x.f));
    const Operand dwt = form == 0 ? Operand::half(g.put(w.h)) : Operand(g.put(w.f));
    uint16_t* dlogits = g.put(std::vector<uint16_t>(logits.size()));
    g.be->matmul_forward_half(dlogits, dx, dwt, N, C, Vp, p);
    expect_close(what + ": logits", widened(get16(g, dlogits, logits.size()), p), widened(logits, p), ulp2, 1e-6);

    uint16_t* dgrad = g.put(logits);  // the CPU's logits
    float* dlosses = g.put(Vec(N));
    g.be->softmax_cross_entropy_half(dgrad, dlosses, g.put(targets), dloss, N, V, Vp, p);
    expect_close(what + ": losses", g.get(dlosses, N), losses, 1e-5, 1e-6);
    const Vec got = widened(get16(g, dgrad, grad.size()), p);
    expect_close(what + ": d(logits)", got, widened(grad, p), ulp2, 1e-6);
    size_t nonzero = 0;
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < Vp; ++j)
        if ((targets[i] < 0 || j >= V) && got[(size_t)i * Vp + j] != 0.0f) ++nonzero;
    EXPECT_EQ(nonzero, 0u) << what << ": ignored rows and padding columns";

    float* ddinp = g.put(dinp0);
    float* ddw = g.put(dw0);
    g.be->matmul_backward_half(ddinp, ddw, g.put(grad), dx, dwt, N, C, Vp, p);
    expect_close_norm(what + ": dinp", g.get(ddinp, dinp.size()), dinp, 1e-2);
    expect_close_norm(what + ": dweight", g.get(ddw, dw.size()), dw, 1e-2);
  }
}

}  // namespace

TEST(CudaHalfHead, Bf16) { head_case(Precision::bf16); }
TEST(CudaHalfHead, Fp16) { head_case(Precision::fp16); }
TEST(CudaHalfHead, AskedForIn16BitRunsOnly) {
  NEED_GPU(g);
  EXPECT_TRUE(g.be->half_logits(Precision::bf16));
  EXPECT_TRUE(g.be->half_logits(Precision::fp16));
  EXPECT_FALSE(g.be->half_logits(Precision::fp32));
  EXPECT_FALSE(cpu_ops()->half_logits(Precision::bf16));
}
