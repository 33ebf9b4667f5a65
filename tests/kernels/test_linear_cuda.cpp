// 16-bit activations on the CUDA backend. Read: the linear-layer GEMMs on their operand forms
// (linear_gemms.hpp): every form of the input and the weight (fp32 only, 16-bit only, both) in
// matmul_forward (with its bias in the GEMM too), matmul_backward, matmul_backward_into and
// matmul_gelu_forward, against the CPU backend on the fp32 values of the rounded inputs (which is
// what every form means: operand.hpp).
// Written: the ops whose output a GEMM reads next (LayerNorm, RMSNorm, both with the residual add,
// fc's bias + GELU, GELU, SwiGLU, attention with both kernels) into a 16-bit Output, against the
// CPU's fp32 output. Without a CUDA device every test is SKIPPED.
//
// Tolerances: the GEMMs against the CPU, 1e-2 of the norm, as test_ops_backend_cuda's bf16 matmul
// (sums of 48-300 products of O(1) values; the CPU sums the same rounded inputs in another order,
// and the fp32-only forms let cuBLAS keep fp32 where it likes: more precise, not less). Between the
// forms that give the GPU the same 16-bit inputs (both forms, or 16 bits only) the same kernel runs
// on the same bits: equal, bitwise. A 16-bit output is the device's fp32 value rounded once: within
// 2 units in the last place of the CPU's fp32 value (2^-6 relative for bf16, 2^-9 for fp16: the
// fp32 values differ by ~1e-6, which can move the rounding by one unit, and rounding itself is half
// a unit), and where the backend's own fp32 output exists for the same call (attention), the 16-bit
// output is its rounding, bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "cuda_test_util.hpp"

using namespace hpct::kernels;
using namespace hpct::kernels::test;  // cuda_test_util.hpp

namespace {

[[maybe_unused]] const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new BackendEnv);

enum class Form { fp32, half, both };
const char* form_name(Form f) { return f == Form::fp32 ? "fp32" : f == Form::half ? "16-bit" : "both"; }

// Rounded host values (cuda_test_util.hpp) and the device operand of the asked form.
struct Input : Rounded {
  using Rounded::Rounded;
  Operand on(Gpu& g, Form form) {
    const float* df = form == Form::half ? nullptr : g.put(f);
    const uint16_t* dh = form == Form::fp32 ? nullptr : g.put(h);
    return Operand(df, dh);
  }
};

struct Result {
  Vec out, act, dinp, dw, db;
};

Result run(OpsBackend& be, Gpu* g, Input& x, Form fx, Input& w, Form fw, const Vec& b, const Vec& dout, int N, int C,
           int OC, Precision p) {
  Result r{Vec((size_t)N * OC), Vec((size_t)N * OC), Vec((size_t)N * C), randn((size_t)OC * C, 6), randn(OC, 7)};
  const Vec start_dinp = randn((size_t)N * C, 5);
  if (!g) {  // the CPU on the fp32 values
    be.matmul_gelu_forward(r.out.data(), r.act.data(), x.f.data(), w.f.data(), b.data(), nullptr, N, C, OC, p);
    Vec dinp = start_dinp;
    be.matmul_backward(dinp.data(), r.dw.data(), r.db.data(), dout.data(), x.f.data(), w.f.data(), N, C, OC, p);
    be.matmul_backward_into(r.dinp.data(), r.dw.data(), r.db.data(), dout.data(), x.f.data(), w.f.data(), N, C, OC, p);
    for (size_t i = 0; i < dinp.size(); ++i) r.dinp[i] += dinp[i];  // accumulated + written
    return r;
  }
  const Operand dx = x.on(*g, fx), dwt = w.on(*g, fw);
  float *out = g->put(r.out), *act = g->put(r.act), *dinp = g->put(start_dinp), *dinp2 = g->put(r.dinp);
  float *dw = g->put(r.dw), *db = g->put(r.db);
  const float* ddout = g->put(dout);
  be.matmul_gelu_forward(out, act, dx, dwt, g->put(b), nullptr, N, C, OC, p);
  be.matmul_backward(dinp, dw, db, ddout, dx, dwt, N, C, OC, p);
  be.matmul_backward_into(dinp2, dw, db, ddout, dx, dwt, N, C, OC, p);
  r.out = g->get(out, r.out.size()), r.act = g->get(act, r.act.size()), r.dw = g->get(dw, r.dw.size());
  r.db = g->get(db, OC);
  const Vec a = g->get(dinp, r.dinp.size()), c = g->get(dinp2, r.dinp.size());
  for (size_t i = 0; i < a.size(); ++i) r.dinp[i] = a[i] + c[i];
  return r;
}

void forms_case(Precision p) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int N = 300, C = 48, OC = 80;
  Input x((size_t)N * C, 1, 1.0f, p), w((size_t)OC * C, 2, 0.2f, p);
  const Vec b = randn(OC, 3), dout = randn((size_t)N * OC, 4);
  const Result want = run(*cpu, nullptr, x, Form::fp32, w, Form::fp32, b, dout, N, C, OC, p);
  Result half_half;
  for (Form fx : {Form::fp32, Form::half, Form::both})
    for (Form fw : {Form::fp32, Form::half, Form::both}) {
      const std::string what = std::string(precision_name(p)) + " input " + form_name(fx) + ", weight " + form_name(fw);
      const Result got = run(*g.be, &g, x, fx, w, fw, b, dout, N, C, OC, p);
      expect_close_norm(what + ": out", got.out, want.out, 1e-2);
      expect_close_norm(what + ": gelu", got.act, want.act, 1e-2);
      expect_close_norm(what + ": dinp", got.dinp, want.dinp, 1e-2);
      expect_close_norm(what + ": dweight", got.dw, want.dw, 1e-2);
      expect_close(what + ": dbias", got.db, want.db);  // column sums in fp32 on both sides
      if (fx == Form::half && fw == Form::half) half_half = got;
      if (fx == Form::both && fw == Form::both) {  // the same 16-bit inputs as 16-bit only: the same bits
        EXPECT_EQ(got.out, half_half.out) << what;
        EXPECT_EQ(got.dinp, half_half.dinp) << what;
        EXPECT_EQ(got.dw, half_half.dw) << what;
      }
    }
}

TEST(CudaLinear, EveryOperandFormBf16) { forms_case(Precision::bf16); }
TEST(CudaLinear, EveryOperandFormFp16) { forms_case(Precision::fp16); }

// An fp32 op refuses an input that comes only in 16 bits (it has no precision to read it in).
TEST(CudaLinear, Fp32OpRefusesHalfOnlyInput) {
  NEED_GPU(g);
  const int N = 4, C = 8, OC = 8;
  Input x((size_t)N * C, 1, 1.0f, Precision::bf16), w((size_t)OC * C, 2, 0.2f, Precision::bf16);
  Vec out((size_t)N * OC);
  EXPECT_THROW(g.be->matmul_forward(g.put(out), x.on(g, Form::half), w.on(g, Form::fp32), nullptr, N, C, OC,
                                    Precision::fp32),
               hpct::Error);
}

// A bias on 16-bit inputs goes into the GEMM (cuBLASLt's BIAS epilogue: bias_gemm.hpp) where cuBLASLt
// offers an algorithm, else the GEMM and a bias pass; either way out = inp W^T + b. Against the CPU
// (1e-2 of the norm, as above) and against the same device's product without the bias plus the
// bias added on the host (1e-4 + 1e-4, as test_ops_backend_cuda's fp32 matmul: the two calls may
// pick GEMM algorithms that sum the 48-50 products in other orders). Aligned, and with every
// pointer one element off (2-byte 16-bit inputs, 4-byte fp32 output and bias: the plan must assume
// no more, or fall back); an OC and a C that are not multiples of 8 (rows not 16-byte aligned).
void bias_case(Precision p, int C, int OC, int shift) {
  NEED_GPU(g);
  g.shift = shift;
  auto cpu = cpu_ops();
  const int N = 300;
  Input x((size_t)N * C, 11, 1.0f, p), w((size_t)OC * C, 12, 0.2f, p);
  const Vec b = randn(OC, 13);
  Vec want((size_t)N * OC), plain((size_t)N * OC);
  cpu->matmul_forward(want.data(), x.f.data(), w.f.data(), b.data(), N, C, OC, p);
  const Operand dx = x.on(g, Form::half), dw = w.on(g, Form::half);
  float* out = g.put(Vec((size_t)N * OC, std::nanf("")));
  float* out0 = g.put(Vec((size_t)N * OC, std::nanf("")));
  g.be->matmul_forward(out, dx, dw, g.put(b), N, C, OC, p);
  g.be->matmul_forward(out0, dx, dw, nullptr, N, C, OC, p);
  const Vec got = g.get(out, want.size()), none = g.get(out0, want.size());
  for (int r = 0; r < N; ++r)
    for (int o = 0; o < OC; ++o) plain[(size_t)r * OC + o] = none[(size_t)r * OC + o] + b[o];
  const std::string what = std::string(precision_name(p)) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
                           (shift ? " unaligned" : "");
  expect_close_norm(what + ": against the CPU", got, want, 1e-2);
  expect_close(what + ": against the product plus the bias", got, plain, 1e-4, 1e-4);
}

TEST(CudaLinear, BiasInTheGemm) {
  for (Precision p : {Precision::bf16, Precision::fp16})
    for (int shift : {0, 1}) {
      bias_case(p, 48, 80, shift);
      bias_case(p, 50, 77, shift);
    }
}

}  // namespace

namespace {

void expect_rounding_of(const std::string& what, const Vec& got, const Vec& want, Precision p) {
  expect_close(what, got, want, p == Precision::bf16 ? 1.0 / 64 : 1.0 / 512, 1e-6);
}

void norm_outputs_case(Precision p, int C) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int N = 300;
  const size_t n = (size_t)N * C;
  const std::string what = std::string(precision_name(p)) + " C=" + std::to_string(C);
  Vec a = randn(n, 1, 2.0f), b = randn(n, 2), w = randn(C, 3), bias = randn(C, 4);
  for (auto& x : b) x += 3.0f;
  for (int kind = 0; kind < 4; ++kind) {  // layernorm, rmsnorm, residual + layernorm, residual + rmsnorm
    const bool rms = kind % 2 == 1, residual = kind >= 2;
    const std::string k = what + (residual ? " residual " : " ") + (rms ? "rmsnorm" : "layernorm");
    Vec res(n), out(n), mean(N), rstd(N);
    float* d_res = g.put(res);
    float* d_mean = g.put(mean);
    float* d_rstd = g.put(rstd);
    uint16_t* d_out = half_buffer(g, n);
    const Output o = Output::half(d_out, p);
    const float *d_a = g.put(a), *d_b = g.put(b), *d_w = g.put(w), *d_bias = g.put(bias);
    if (kind == 0) {
      cpu->layernorm_forward(out.data(), mean.data(), rstd.data(), a.data(), w.data(), bias.data(), N, C);
      g.be->layernorm_forward(o, d_mean, d_rstd, d_a, d_w, d_bias, N, C);
    } else if (kind == 1) {
      cpu->rmsnorm_forward(out.data(), rstd.data(), a.data(), w.data(), N, C);
      g.be->rmsnorm_forward(o, d_rstd, d_a, d_w, N, C);
    } else if (kind == 2) {
      cpu->residual_layernorm_forward(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                                      bias.data(), N, C);
      g.be->residual_layernorm_forward(d_res, o, d_mean, d_rstd, d_a, d_b, d_w, d_bias, N, C);
    } else {
      cpu->residual_rmsnorm_forward(res.data(), out.data(), rstd.data(), a.data(), b.data(), w.data(), N, C);
      g.be->residual_rmsnorm_forward(d_res, o, d_rstd, d_a, d_b, d_w, N, C);
    }
    expect_rounding_of(k + " out", widened(g, d_out, n, p), out, p);
    expect_close(k + " rstd", g.get(d_rstd, N), rstd, 1e-4, 1e-5);
    if (!rms) expect_close(k + " mean", g.get(d_mean, N), mean, 1e-4, 1e-5);
    if (residual) expect_close(k + " res", g.get(d_res, n), res, 0, 0);  // one addition: exact
  }
}

void activation_outputs_case(Precision p, int width) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int N = 257, C = 64;
  const size_t n = (size_t)N * width;
  const std::string what = std::string(precision_name(p)) + " width " + std::to_string(width);
  // fc + bias + GELU: act is the rounding of GELU of the device's own pre.
  Vec inp = randn((size_t)N * C, 1), w = randn((size_t)width * C, 2, 0.2f), bias = randn(width, 3);
  float* d_pre = g.put(Vec(n));
  uint16_t* d_act = half_buffer(g, n);
  g.be->matmul_gelu_forward(d_pre, Output::half(d_act, p), g.put(inp), g.put(w), g.put(bias), nullptr, N, C, width,
                            p);
  const Vec gp = g.get(d_pre, n);
  Vec want(n);
  cpu->gelu_forward(want.data(), gp.data(), n);
  expect_rounding_of(what + " matmul_gelu act", widened(g, d_act, n, p), want, p);
  // GELU alone, its input left as it was.
  const Vec x = randn(n, 4, 2.0f);
  float* d_x = g.put(x);
  uint16_t* d_g = half_buffer(g, n);
  g.be->gelu_forward(Output::half(d_g, p), d_x, n);
  cpu->gelu_forward(want.data(), x.data(), n);
  expect_rounding_of(what + " gelu", widened(g, d_g, n, p), want, p);
  EXPECT_EQ(g.get(d_x, n), x) << what << ": gelu changed its input";
  // SwiGLU on rows of [gate | up].
  const Vec gu = randn(2 * n, 5);
  uint16_t* d_s = half_buffer(g, n);
  g.be->swiglu_forward(Output::half(d_s, p), g.put(gu), (size_t)N, width);
  cpu->swiglu_forward(want.data(), gu.data(), (size_t)N, width);
  expect_rounding_of(what + " swiglu", widened(g, d_s, n, p), want, p);
}

void attention_output_case(Precision p, bool fused) {
  NEED_GPU(g);
  g.be->allow_fused_attention(fused);
  const int B = 2, T = 64, C = 128, NH = 2;
  const AttentionUse use;
  if (fused && !g.be->attention_kernel(B, T, C, NH, p, use).fused) GTEST_SKIP() << "no fused kernel for this shape";
  const size_t n = (size_t)B * T * C;
  const Vec qkv = randn(3 * n, 1);
  const float* d_qkv = g.put(qkv);
  float* d_att = g.put(Vec(g.be->attention_state_floats(B, T, C, NH, p, use)));
  float* d_out = g.put(Vec(n));
  g.be->attention_forward(d_out, d_att, d_qkv, B, T, C, NH, p, nullptr, nullptr, use);
  const Vec out = g.get(d_out, n);
  uint16_t* d_out16 = half_buffer(g, n);
  g.be->attention_forward(Output::half(d_out16, p), d_att, d_qkv, B, T, C, NH, p, nullptr, nullptr, use);
  std::vector<uint16_t> want(n), got(n);
  to_half(out.data(), want.data(), n, p);
  g.be->copy_to_host(got.data(), d_out16, n * sizeof(uint16_t));
  EXPECT_EQ(got, want) << precision_name(p) << (fused ? " fused" : " materialised") << ": not the fp32 output rounded";
}

}  // namespace

TEST(CudaHalfOutputs, NormsBf16) {
  norm_outputs_case(Precision::bf16, 768);  // the 4-wide stores
  norm_outputs_case(Precision::bf16, 70);
}
TEST(CudaHalfOutputs, NormsFp16) { norm_outputs_case(Precision::fp16, 1024); }
TEST(CudaHalfOutputs, ActivationsBf16) {
  activation_outputs_case(Precision::bf16, 96);
  activation_outputs_case(Precision::bf16, 37);
}
TEST(CudaHalfOutputs, ActivationsFp16) { activation_outputs_case(Precision::fp16, 96); }
TEST(CudaHalfOutputs, AttentionFused) { attention_output_case(Precision::bf16, true); }
TEST(CudaHalfOutputs, AttentionMaterialised) {
  attention_output_case(Precision::bf16, false);
  attention_output_case(Precision::fp16, false);
}
