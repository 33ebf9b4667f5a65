// The CUDA backend's fused forms (fusions.cu) against the CPU backend's, which are the unfused
// composites by definition (OpsBackend's defaults): residual + LayerNorm, residual + RMSNorm, fc +
// bias + GELU. Each at a width that takes the 16-byte loads (C % 4 == 0, aligned) and at one that
// cannot (odd C, or pointers one float off 16 bytes), in place (res = b) and not. Without a CUDA
// device every test is SKIPPED.
//
// Tolerances: the norms sum a row of 70-1024 values in another order (warp shuffles against the
// CPU's loop): 1e-4 relative + 1e-5 absolute, as test_ops_backend_cuda's layernorm. The fc GEMM is
// cuBLAS against OpenBLAS/oneDNN, and the bias is added after it rather than before: fp32 1e-4 +
// 1e-4 absolute (sums of 64-96 O(1) products); bf16 1e-2 of the norm (cuBLAS may round its inputs
// to bf16 where the CPU does not: ~2^-9 relative per product).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "cuda_test_util.hpp"

using namespace hpct::kernels;
using namespace hpct::kernels::test;  // cuda_test_util.hpp

namespace {

[[maybe_unused]] const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new BackendEnv);

// rms: RMSNorm (no mean, no bias); in_place: res is b's buffer (as the model calls it).
void residual_norm_case(int N, int C, bool rms, bool in_place, int shift) {
  NEED_GPU(g);
  g.shift = shift;
  auto cpu = cpu_ops();
  const std::string what = std::string(rms ? "rmsnorm" : "layernorm") + " C=" + std::to_string(C) +
                           (in_place ? " in place" : "") + (shift ? " unaligned" : "");
  // a: the skip path; b: the branch, offset so that the sum's mean is far from 0 (the variance's
  // second pass matters).
  Vec a = randn((size_t)N * C, 1, 2.0f), b = randn((size_t)N * C, 2), w = randn(C, 3), bias = randn(C, 4);
  for (auto& x : b) x += 3.0f;
  Vec res((size_t)N * C), out((size_t)N * C), mean(N), rstd(N);
  float* d_a = g.put(a);
  float* d_b = g.put(b);
  float* d_res = in_place ? d_b : g.put(res);
  float* d_out = g.put(out);
  float* d_mean = g.put(mean);
  float* d_rstd = g.put(rstd);
  if (rms) {
    cpu->residual_rmsnorm_forward(res.data(), out.data(), rstd.data(), a.data(), b.data(), w.data(), N, C);
    g.be->residual_rmsnorm_forward(d_res, d_out, d_rstd, d_a, d_b, g.put(w), N, C);
  } else {
    cpu->residual_layernorm_forward(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                                    bias.data(), N, C);
    g.be->residual_layernorm_forward(d_res, d_out, d_mean, d_rstd, d_a, d_b, g.put(w), g.put(bias), N, C);
    expect_close(what + " mean", g.get(d_mean, N), mean, 1e-4, 1e-5);
  }
  expect_close(what + " res", g.get(d_res, res.size()), res, 0, 0);  // one addition: exact
  expect_close(what + " out", g.get(d_out, out.size()), out, 1e-4, 1e-5);
  expect_close(what + " rstd", g.get(d_rstd, N), rstd, 1e-4, 1e-5);
}

}  // namespace

// 300 rows (more warps than one block holds); C = 768 and 1024: the 16-byte loads; C = 70: not.
TEST(CudaFusions, ResidualLayerNorm) {
  residual_norm_case(300, 768, false, false, 0);
  residual_norm_case(300, 768, false, true, 0);
  residual_norm_case(300, 70, false, true, 0);
  residual_norm_case(300, 1024, false, false, 1);
}
TEST(CudaFusions, ResidualRmsNorm) {
  residual_norm_case(300, 1024, true, true, 0);
  residual_norm_case(300, 70, true, false, 0);
  residual_norm_case(300, 768, true, true, 1);
}

namespace {

void matmul_gelu_case(Precision p, int OC, bool with_bias, int shift) {
  NEED_GPU(g);
  g.shift = shift;
  auto cpu = cpu_ops();
  const int N = 257, C = 64;
  const std::string what = std::string(p == Precision::fp32 ? "fp32" : "bf16") + " OC=" + std::to_string(OC) +
                           (with_bias ? "" : " no bias") + (shift ? " unaligned" : "");
  Vec inp = randn((size_t)N * C, 1), w = randn((size_t)OC * C, 2, 0.2f), bias = randn(OC, 3);
  Vec pre((size_t)N * OC), act((size_t)N * OC);
  cpu->matmul_gelu_forward(pre.data(), act.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, nullptr, N,
                           C, OC, p);
  float* d_pre = g.put(pre);
  float* d_act = g.put(act);
  g.be->matmul_gelu_forward(d_pre, d_act, g.put(inp), g.put(w), with_bias ? g.put(bias) : nullptr, nullptr, N, C, OC,
                            p);
  const Vec gp = g.get(d_pre, pre.size()), ga = g.get(d_act, act.size());
  if (p == Precision::fp32) {
    expect_close(what + " pre", gp, pre, 1e-4, 1e-4);
    expect_close(what + " act", ga, act, 1e-4, 1e-4);
  } else {
    expect_close_norm(what + " pre", gp, pre, 1e-2);
    expect_close_norm(what + " act", ga, act, 1e-2);
  }
  // act is GELU of the device's own pre, whatever the GEMM's rounding: the element-wise part alone.
  Vec act_of_gp(gp.size());
  cpu->gelu_forward(act_of_gp.data(), gp.data(), gp.size());
  expect_close(what + " act = gelu(pre)", ga, act_of_gp, 1e-5, 1e-6);
}

}  // namespace

TEST(CudaFusions, MatmulBiasGeluFp32) {
  matmul_gelu_case(Precision::fp32, 96, true, 0);
  matmul_gelu_case(Precision::fp32, 96, false, 0);
  matmul_gelu_case(Precision::fp32, 37, true, 0);
}
TEST(CudaFusions, MatmulBiasGeluBf16) {
  matmul_gelu_case(Precision::bf16, 96, true, 0);
  matmul_gelu_case(Precision::bf16, 96, true, 1);
}

// The GELU MLP's pre-activation kept in 16 bits (OpsBackend::half_pre_activations): the device's
// pre is the rounding of its fp32 GEMM sum plus the bias, which the CPU's composite (the default:
// matmul_forward into `wide`, rounded, widened back, GELU) matches to the GEMM's summation order:
// within one 16-bit step of each value (2^-7 relative for bf16, 2^-10 for fp16, plus a tiny
// absolute for values near 0), at most 1% of the values one step apart. act must be GELU of the
// device's own kept pre (1e-5: the same formula, only the exp's rounding), not of the fp32 sum;
// and the backward from 16-bit pre equals the CPU's from the same values (the element-wise formula,
// 1e-4 as gelu_backward_into above), both load widths (n % 4 == 0, aligned; then an odd n). Its
// 16-bit form (the gradient the model then keeps) is the rounding of the same fp32 values: within
// one 16-bit step. fc's backward from that 16-bit gradient: dinp and dweight as the bf16/fp16
// GEMMs above (1e-2 of the norm), dbias the same 16-bit values summed in another order (1e-4 +
// 1e-4 absolute: 257 terms of O(1)).
namespace {

void pre_activation_case(Precision p, int OC, int shift) {
  NEED_GPU(g);
  g.shift = shift;
  auto cpu = cpu_ops();
  const int N = 257, C = 64;
  const size_t n = (size_t)N * OC;
  const std::string what = std::string(precision_name(p)) + " OC=" + std::to_string(OC) + (shift ? " unaligned" : "");
  Vec inp = randn((size_t)N * C, 1), w = randn((size_t)OC * C, 2, 0.2f), bias = randn(OC, 3), act(n), wide(n);
  std::vector<uint16_t> pre16(n);
  cpu->matmul_gelu_forward(Output::half(pre16.data(), p), act.data(), inp.data(), w.data(), bias.data(), wide.data(), N,
                           C, OC, p);
  Vec pre(n);
  from_half(pre16.data(), pre.data(), n, p);
  uint16_t* d_pre = half_buffer(g, n);
  float* d_act = g.put(Vec(n));
  float* d_wide = g.put(Vec(n));
  g.be->matmul_gelu_forward(Output::half(d_pre, p), d_act, g.put(inp), g.put(w), g.put(bias), d_wide, N, C, OC, p);
  const Vec gp = widened(g, d_pre, n, p), ga = g.get(d_act, n);
  const double step = p == Precision::bf16 ? 1.0 / 128 : 1.0 / 1024;
  expect_close(what + " pre", gp, pre, step, 1e-3);
  size_t apart = 0;
  for (size_t i = 0; i < n; ++i) apart += gp[i] != pre[i];
  EXPECT_LE(apart, n / 100) << what << ": pre values a 16-bit step from the CPU's";
  Vec act_of_gp(n);
  cpu->gelu_forward(act_of_gp.data(), gp.data(), n);
  expect_close(what + " act = gelu(kept pre)", ga, act_of_gp, 1e-5, 1e-6);

  const Vec dout = randn(n, 4);
  for (size_t len : {n, n - 3}) {
    Vec dpre(len);
    cpu->gelu_backward_into(dpre.data(), Operand::half(pre16.data()), dout.data(), len, p);
    float* d_dpre = g.put(Vec(len, std::nanf("")));
    g.be->gelu_backward_into(d_dpre, Operand::half(g.put(pre16)), g.put(dout), len, p);
    expect_close(what + " gelu_backward_into from 16 bits, n=" + std::to_string(len), g.get(d_dpre, len), dpre, 1e-4,
                 1e-5);
    std::vector<uint16_t> dpre16(len);
    cpu->gelu_backward_into(Output::half(dpre16.data(), p), Operand::half(pre16.data()), dout.data(), len, p);
    uint16_t* d_dpre16 = half_buffer(g, len);
    g.be->gelu_backward_into(Output::half(d_dpre16, p), Operand::half(g.put(pre16)), g.put(dout), len, p);
    Vec want(len);
    from_half(dpre16.data(), want.data(), len, p);
    expect_close(what + " 16-bit gelu_backward_into, n=" + std::to_string(len), widened(g, d_dpre16, len, p), want, step,
                 1e-6);
    if (len != n) continue;
    // fc's backward from the 16-bit gradient (the CPU's: widened, then the fp32 op).
    Vec dinp((size_t)N * C), dw = randn((size_t)OC * C, 5), db = randn(OC, 6);  // dw, db accumulate onto these
    float* d_dinp = g.put(Vec(dinp.size(), std::nanf("")));
    float* d_dw = g.put(dw);
    float* d_db = g.put(db);
    cpu->matmul_backward_into(dinp.data(), dw.data(), db.data(), Operand::half(dpre16.data()), inp.data(), w.data(), N,
                              C, OC, p);
    g.be->matmul_backward_into(d_dinp, d_dw, d_db, Operand::half(g.put(dpre16)), g.put(inp), g.put(w), N, C, OC, p);
    expect_close_norm(what + " fc backward from 16 bits: dinp", g.get(d_dinp, dinp.size()), dinp, 1e-2);
    expect_close_norm(what + " fc backward from 16 bits: dweight", g.get(d_dw, dw.size()), dw, 1e-2);
    expect_close(what + " fc backward from 16 bits: dbias", g.get(d_db, db.size()), db, 1e-4, 1e-4);
  }
}

}  // namespace

TEST(CudaFusions, PreActivationKeptIn16Bits) {
  pre_activation_case(Precision::bf16, 96, 0);
  pre_activation_case(Precision::fp16, 96, 0);
  pre_activation_case(Precision::bf16, 37, 1);  // the scalar kernels: odd width, unaligned
}

// The written (not accumulated) gradients: the device buffer starts as NaN, which a memset-free
// kernel must never read (cuBLAS with beta 0 does not). dweight and dbias still accumulate onto
// non-zero starts. Tolerances as matmul's fp32 (sums of 96 and 257 products) and GELU's 1e-4.
TEST(CudaFusions, GradientsWrittenWithoutAMemset) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int N = 257, C = 64, OC = 96;
  const Precision p = Precision::fp32;
  Vec inp = randn((size_t)N * C, 1), w = randn((size_t)OC * C, 2, 0.2f), dout = randn((size_t)N * OC, 3);
  Vec dinp((size_t)N * C, 7.0f), dw = randn((size_t)OC * C, 4), db = randn(OC, 5);
  const Vec nan_in((size_t)N * C, std::nanf("")), nan_out((size_t)N * OC, std::nanf(""));
  float* d_dinp = g.put(nan_in);
  float* d_dw = g.put(dw);
  float* d_db = g.put(db);
  cpu->matmul_backward_into(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC, p);
  g.be->matmul_backward_into(d_dinp, d_dw, d_db, g.put(dout), g.put(inp), g.put(w), N, C, OC, p);
  expect_close("matmul_backward_into dinp", g.get(d_dinp, dinp.size()), dinp, 1e-4, 1e-4);
  expect_close("matmul_backward_into dweight", g.get(d_dw, dw.size()), dw, 1e-4, 1e-4);
  expect_close("matmul_backward_into dbias", g.get(d_db, db.size()), db, 1e-4, 1e-5);

  Vec x = randn((size_t)N * OC, 6, 2.0f), dx((size_t)N * OC, 7.0f);
  float* d_dx = g.put(nan_out);
  cpu->gelu_backward_into(dx.data(), x.data(), dout.data(), dx.size(), p);
  g.be->gelu_backward_into(d_dx, g.put(x), g.put(dout), dx.size(), p);
  expect_close("gelu_backward_into", g.get(d_dx, dx.size()), dx, 1e-4, 1e-5);
  // An odd length: the scalar kernel (the float4 one needs n % 4 == 0), accumulating.
  const size_t odd = 1001;
  Vec acc = randn(odd, 8);
  float* d_acc = g.put(acc);
  cpu->gelu_backward(acc.data(), x.data(), dout.data(), odd);
  g.be->gelu_backward(d_acc, g.put(x), g.put(dout), odd);
  expect_close("gelu_backward, odd length", g.get(d_acc, odd), acc, 1e-4, 1e-5);
}

namespace {

// Two runs of cuDNN's backward on the same inputs: its default kernels may sum dQ over key tiles
// with atomics, so the fp32 sums may differ in their last bits, and a 16-bit result (everything it
// writes is 16-bit) then by one 16-bit step: 2^-7 relative at most in bf16 (+1e-6 for values
// near 0). Anything larger is a wrong value, not an order of additions.
constexpr double kCudnnRerunRel = 1.0 / 128, kCudnnRerunAbs = 1e-6;

// The 4 16-bit values half_buffer() left after n elements at d are still its NaN fill: nothing
// wrote past the end.
void expect_tail_untouched(Gpu& g, const uint16_t* d, size_t n, const std::string& what) {
  std::vector<uint16_t> h(n + 4);
  g.be->copy_to_host(h.data(), d, h.size() * sizeof(uint16_t));
  for (size_t i = n; i < n + 4; ++i) EXPECT_EQ(h[i], 0x7fc1) << what << ": written past the end, at " << i;
}

// attention_backward_into from a NaN-filled dqkv against attention_backward onto zeros, on the
// same device kernel: the written form must equal the accumulated one (the GEMMs' beta 0 against
// beta 1 on zeros; cuDNN's 16-bit gradient widened against added to zeros). Exactly for the
// materialised kernel; for cuDNN's within two runs of its backward (kCudnnRerun*; a NaN read stays
// a NaN).
void attention_into_case(Precision p, int T, bool want_fused) {
  NEED_GPU(g);
  const int B = 2, C = 128, NH = 2;
  const AttentionUse use{};
  const AttentionKernel k = g.be->attention_kernel(B, T, C, NH, p, use);
  if (want_fused && !k.fused) GTEST_SKIP() << k.what;
  ASSERT_EQ(k.fused, want_fused) << k.what;
  const size_t N = (size_t)B * T, state = g.be->attention_state_floats(B, T, C, NH, p, use);
  const Vec qkv = randn(N * 3 * C, 11), dout = randn(N * C, 12);
  BackendBuffer d_state(*g.be, state * sizeof(float));
  float* d_out = g.put(Vec(N * C));
  const float* d_qkv = g.put(qkv);
  const float* d_dout = g.put(dout);
  g.be->attention_forward(d_out, d_state.as<float>(), d_qkv, B, T, C, NH, p, nullptr, nullptr, use);
  float* d_acc = g.put(Vec(N * 3 * C, 0.0f));
  float* d_into = g.put(Vec(N * 3 * C, std::nanf("")));
  g.be->attention_backward(d_acc, d_dout, d_qkv, d_state.as<float>(), {}, B, T, C, NH, p, nullptr, use);
  g.be->attention_backward_into(d_into, d_dout, d_qkv, d_state.as<float>(), {}, B, T, C, NH, p, nullptr, use);
  const double tol = want_fused ? kCudnnRerunRel : 0, abs = want_fused ? kCudnnRerunAbs : 0;
  expect_close(std::string("attention_backward_into, ") + k.what, g.get(d_into, N * 3 * C), g.get(d_acc, N * 3 * C),
               tol, abs);
}

// attention_backward_into a 16-bit dqkv (the model's route to the qkv GEMMs where the kernel says
// half_gradient) against the fp32 form on the same device kernel. cuDNN's: its own 16-bit gradient
// written where it is (aligned) or through its scratch (one element off 16 bytes), so the values
// widened are the fp32 form's (within two runs of its backward), nothing is written past its end,
// and the kernel says half_gradient. The materialised kernel (--attention-kernel plain, bf16): its fp32
// gradient rounded once, bitwise the fp32 form rounded on the host; it does not say half_gradient.
void attention_half_gradient_case(bool fused, int shift) {
  NEED_GPU(g);
  const Precision p = Precision::bf16;
  const int B = 2, T = 128, C = 128, NH = 2;
  const AttentionUse use{};
  g.be->allow_fused_attention(fused);
  const AttentionKernel k = g.be->attention_kernel(B, T, C, NH, p, use);
  if (fused && !k.fused) GTEST_SKIP() << k.what;
  ASSERT_EQ(k.fused, fused) << k.what;
  EXPECT_EQ(k.half_gradient, fused) << k.what;
  const size_t N = (size_t)B * T, n3 = N * 3 * C, state = g.be->attention_state_floats(B, T, C, NH, p, use);
  const Vec qkv = randn(n3, 13), dout = randn(N * C, 14);
  BackendBuffer d_state(*g.be, state * sizeof(float));
  float* d_out = g.put(Vec(N * C));
  const float* d_qkv = g.put(qkv);
  const float* d_dout = g.put(dout);
  g.be->attention_forward(d_out, d_state.as<float>(), d_qkv, B, T, C, NH, p, nullptr, nullptr, use);
  float* d_wide = g.put(Vec(n3, std::nanf("")));
  g.be->attention_backward_into(d_wide, d_dout, d_qkv, d_state.as<float>(), {}, B, T, C, NH, p, nullptr, use);
  g.shift = shift;
  uint16_t* d_half = half_buffer(g, n3);
  g.be->attention_backward_into(Output::half(d_half, p), d_dout, d_qkv, d_state.as<float>(), {}, B, T, C, NH, p, nullptr,
                                use);
  const std::string what = std::string("16-bit attention_backward_into, ") + k.what + (shift ? ", unaligned" : "");
  const Vec wide = g.get(d_wide, n3), half = widened(g, d_half, n3, p);
  expect_tail_untouched(g, d_half, n3, what);
  if (fused) {
    expect_close(what, half, wide, kCudnnRerunRel, kCudnnRerunAbs);
    return;
  }
  std::vector<uint16_t> r(n3);
  to_half(wide.data(), r.data(), n3, p);
  Vec want(n3);
  from_half(r.data(), want.data(), n3, p);
  expect_close(what, half, want, 0, 0);
}

// The fused kernel where the caller keeps the 16-bit output (AttentionUse::output_kept): its state
// holds no copy (exactly the output's floats fewer), forward writes the caller's buffer (through
// the scratch where it is one element off 16 bytes) bitwise what it writes with its own copy
// (cuDNN's forward has no atomics) and nothing past its end, and the backward from the caller's
// output gives the state-copy backward's dqkv within two runs of its backward.
void attention_output_kept_case(int shift) {
  NEED_GPU(g);
  const Precision p = Precision::bf16;
  const int B = 2, T = 128, C = 128, NH = 2;
  AttentionUse own{}, kept{};
  kept.output_kept = true;
  const AttentionKernel k = g.be->attention_kernel(B, T, C, NH, p, kept);
  if (!k.fused) GTEST_SKIP() << k.what;
  const size_t N = (size_t)B * T, n = N * C, n3 = 3 * n;
  const size_t s_own = g.be->attention_state_floats(B, T, C, NH, p, own),
               s_kept = g.be->attention_state_floats(B, T, C, NH, p, kept);
  EXPECT_EQ(s_own - s_kept, (n + 7) / 8 * 4) << "the state's copy of the output, 16-byte padded";
  const Vec qkv = randn(n3, 15), dout = randn(n, 16);
  const float* d_qkv = g.put(qkv);
  const float* d_dout = g.put(dout);
  BackendBuffer st_own(*g.be, s_own * sizeof(float)), st_kept(*g.be, s_kept * sizeof(float));
  uint16_t* y_own = half_buffer(g, n);
  g.shift = shift;
  uint16_t* y_kept = half_buffer(g, n);
  g.be->attention_forward(Output::half(y_own, p), st_own.as<float>(), d_qkv, B, T, C, NH, p, nullptr, nullptr, own);
  g.be->attention_forward(Output::half(y_kept, p), st_kept.as<float>(), d_qkv, B, T, C, NH, p, nullptr, nullptr, kept);
  const std::string what = std::string("output kept by the caller") + (shift ? ", unaligned" : "");
  expect_close(what + ": forward", widened(g, y_kept, n, p), widened(g, y_own, n, p), 0, 0);
  expect_tail_untouched(g, y_kept, n, what + ": forward");
  g.shift = 0;
  float* d_own = g.put(Vec(n3, std::nanf("")));
  float* d_kept = g.put(Vec(n3, std::nanf("")));
  g.be->attention_backward_into(d_own, d_dout, d_qkv, st_own.as<float>(), {}, B, T, C, NH, p, nullptr, own);
  g.be->attention_backward_into(d_kept, d_dout, d_qkv, st_kept.as<float>(), Operand::half(y_kept), B, T, C, NH, p,
                                nullptr, kept);
  expect_close(what + ": backward", g.get(d_kept, n3), g.get(d_own, n3), kCudnnRerunRel, kCudnnRerunAbs);
}

}  // namespace

TEST(CudaFusions, AttentionOutputKeptByTheCaller) {
  attention_output_kept_case(0);
  attention_output_kept_case(1);
}
TEST(CudaFusions, AttentionGradientWrittenMaterialised) { attention_into_case(Precision::fp32, 40, false); }
TEST(CudaFusions, AttentionGradientWrittenFused) { attention_into_case(Precision::bf16, 128, true); }
TEST(CudaFusions, AttentionGradientIn16BitsFused) {
  attention_half_gradient_case(true, 0);
  attention_half_gradient_case(true, 1);
}
TEST(CudaFusions, AttentionGradientIn16BitsMaterialised) { attention_half_gradient_case(false, 0); }
