// The CUDA OpsBackend against the CPU one, op by op, on random inputs: every GPT op the model
// calls, with the shapes that reach each kernel's edges (several row chunks of the column sums,
// ignored targets and padding columns, more than one head and batch row). Backward ops start from
// non-zero gradients, so accumulation (+=) is checked too. Without a CUDA device every test is
// SKIPPED. Tolerance: 1e-4 relative + 1e-5 absolute in fp32 (summation orders differ); the bf16
// matmul 1e-2 of the norm (cuBLAS is allowed, not forced, to round its inputs as the CPU does).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/ops.hpp"
#include "hpct/kernels/optim.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "cuda_test_util.hpp"

using namespace hpct::kernels;
using namespace hpct::kernels::test;  // cuda_test_util.hpp

namespace {

[[maybe_unused]] const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new BackendEnv);

// cuDNN up to 9.15.0 takes only sequence lengths that are multiples of 128 (the backend says so):
// those cases are skipped there, naming the version.
#define SKIP_IF_OLD_CUDNN(k) \
  if (!(k).fused && (k).what.find("multiple of 128") != std::string::npos) GTEST_SKIP() << (k).what

}  // namespace

// pos: per-token positions (documents packed in a sample), or nullptr for 0..T-1.
void encoder_case(const std::vector<int32_t>* pos) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int B = 2, T = 5, C = 12, V = 17;
  std::vector<int32_t> tok = {3, 16, 0, 3, 3, 9, 1, 16, 2, 3};  // repeats: the atomic scatter
  Vec wte = randn(V * C, 1), wpe = randn(T * C, 2), dout = randn(B * T * C, 3);
  Vec out(B * T * C), dwte = randn(V * C, 4), dwpe = randn(T * C, 5);
  Vec dwte0 = dwte, dwpe0 = dwpe;
  const int32_t* hp = pos ? pos->data() : nullptr;
  cpu->encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, hp);
  cpu->encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, hp);
  float* d_out = g.put(Vec(B * T * C));
  float* d_dwte = g.put(dwte0);
  float* d_dwpe = g.put(dwpe0);
  const int32_t* d_tok = g.put(tok);
  const int32_t* d_pos = pos ? g.put(*pos) : nullptr;
  g.be->encoder_forward(d_out, d_tok, g.put(wte), g.put(wpe), B, T, C, d_pos);
  g.be->encoder_backward(d_dwte, d_dwpe, g.put(dout), d_tok, B, T, C, d_pos);
  expect_close("encoder out", g.get(d_out, out.size()), out);
  expect_close("encoder dwte", g.get(d_dwte, dwte.size()), dwte);
  expect_close("encoder dwpe", g.get(d_dwpe, dwpe.size()), dwpe);
  // No dwte (a frozen word embedding): dwpe alone.
  float* d_alone = g.put(dwpe0);
  g.be->encoder_backward(nullptr, d_alone, g.put(dout), d_tok, B, T, C, d_pos);
  expect_close("encoder dwpe without dwte", g.get(d_alone, dwpe.size()), dwpe);
}
TEST(CudaOps, Encoder) { encoder_case(nullptr); }
TEST(CudaOps, EncoderWithDocumentPositions) {
  const std::vector<int32_t> pos = {0, 1, 0, 1, 2, 0, 0, 1, 2, 3};  // repeats: the atomic scatter
  encoder_case(&pos);
}

TEST(CudaOps, LayerNormOverSeveralRowChunks) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int N = 600, C = 70;  // 3 chunks of 256 rows in the column sums, a partial column tile
  Vec inp = randn(N * C, 1, 2.0f), w = randn(C, 2), b = randn(C, 3), dout = randn(N * C, 4);
  Vec out(N * C), mean(N), rstd(N), dinp = randn(N * C, 5), dw = randn(C, 6), db = randn(C, 7);
  float* d_inp = g.put(inp);
  float* d_w = g.put(w);
  float* d_out = g.put(out);
  float* d_mean = g.put(mean);
  float* d_rstd = g.put(rstd);
  float* d_dinp = g.put(dinp);
  float* d_dw = g.put(dw);
  float* d_db = g.put(db);
  cpu->layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  cpu->layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(), rstd.data(),
                          N, C);
  g.be->layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, g.put(b), N, C);
  g.be->layernorm_backward(d_dinp, d_dw, d_db, g.put(dout), d_inp, d_w, d_mean, d_rstd, N, C);
  expect_close("layernorm out", g.get(d_out, out.size()), out);
  expect_close("layernorm dinp", g.get(d_dinp, dinp.size()), dinp);
  expect_close("layernorm dweight", g.get(d_dw, C), dw);
  expect_close("layernorm dbias", g.get(d_db, C), db);
}

// Rotary positions on the device against the CPU's: 2 x 50 rows, 4 heads of 16 with 12 rotated,
// explicit positions up to 4000 (angles to 4000 rad: fp32 sin/cos and powf against the CPU's
// double-rounded frequencies differ by ~1e-4 there), forward then inverse (which must restore).
TEST(CudaOps, Rope) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int B = 2, T = 50, C = 64, NH = 4, rot = 12;
  Vec qkv = randn((size_t)B * T * 3 * C, 1);
  std::vector<int32_t> pos(B * T);
  for (int i = 0; i < B * T; ++i) pos[i] = (i * 83) % 4001;
  float* d = g.put(qkv);
  const int32_t* dp = g.put(pos);
  Vec ref = qkv;
  cpu->rope(ref.data(), B, T, C, NH, NH, rot, 10000.0f, pos.data(), false);
  g.be->rope(d, B, T, C, NH, NH, rot, 10000.0f, dp, false);
  expect_close("rope forward", g.get(d, qkv.size()), ref, 1e-3, 1e-3);
  g.be->rope(d, B, T, C, NH, NH, rot, 10000.0f, dp, true);
  expect_close("rope inverse restores", g.get(d, qkv.size()), qkv, 1e-5, 1e-5);
}

// Grouped-query attention's widening and its reduction on the device against the CPU's: 90 rows,
// 8 query heads of 6 on 2 key/value heads (sums of 4 in fp32: default tolerances).
TEST(CudaOps, ExpandAndReduceKv) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int R = 90, C = 48, NH = 8, KV = 2, W = C + 2 * KV * (C / NH);
  Vec inp = randn((size_t)R * W, 1), wide((size_t)R * 3 * C), dwide = randn((size_t)R * 3 * C, 2), dinp((size_t)R * W);
  float* d_in = g.put(inp);
  float* d_wide = g.put(wide);
  float* d_dinp = g.put(dinp);
  cpu->expand_kv(wide.data(), inp.data(), R, C, NH, KV);
  cpu->reduce_kv(dinp.data(), dwide.data(), R, C, NH, KV);
  g.be->expand_kv(d_wide, d_in, R, C, NH, KV);
  g.be->reduce_kv(d_dinp, g.put(dwide), R, C, NH, KV);
  expect_close("expand_kv", g.get(d_wide, wide.size()), wide);
  expect_close("reduce_kv", g.get(d_dinp, dinp.size()), dinp);
}

// SwiGLU on the device against the CPU's: 300 rows of [gate | up], F = 50; expf against the CPU's
// exp and one product per element: default tolerances.
TEST(CudaOps, SwiGlu) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int R = 300, F = 50;
  Vec inp = randn((size_t)R * 2 * F, 1, 2.0f), dout = randn((size_t)R * F, 2), out((size_t)R * F),
      dinp = randn((size_t)R * 2 * F, 3);
  float* d_inp = g.put(inp);
  float* d_out = g.put(out);
  float* d_dinp = g.put(dinp);
  cpu->swiglu_forward(out.data(), inp.data(), R, F);
  cpu->swiglu_backward(dinp.data(), inp.data(), dout.data(), R, F);
  g.be->swiglu_forward(d_out, d_inp, R, F);
  g.be->swiglu_backward(d_dinp, d_inp, g.put(dout), R, F);
  expect_close("swiglu out", g.get(d_out, out.size()), out);
  expect_close("swiglu dinp", g.get(d_dinp, dinp.size()), dinp);
}

// RMSNorm on the device against the CPU's, with LayerNorm's sizes, inputs and tolerances.
TEST(CudaOps, RmsNormOverSeveralRowChunks) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int N = 600, C = 70;
  Vec inp = randn(N * C, 1, 2.0f), w = randn(C, 2), dout = randn(N * C, 4);
  Vec out(N * C), rstd(N), dinp = randn(N * C, 5), dw = randn(C, 6);
  float* d_inp = g.put(inp);
  float* d_w = g.put(w);
  float* d_out = g.put(out);
  float* d_rstd = g.put(rstd);
  float* d_dinp = g.put(dinp);
  float* d_dw = g.put(dw);
  cpu->rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C);
  cpu->rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N, C);
  g.be->rmsnorm_forward(d_out, d_rstd, d_inp, d_w, N, C);
  g.be->rmsnorm_backward(d_dinp, d_dw, g.put(dout), d_inp, d_w, d_rstd, N, C);
  expect_close("rmsnorm out", g.get(d_out, out.size()), out);
  expect_close("rmsnorm rstd", g.get(d_rstd, N), rstd);
  expect_close("rmsnorm dinp", g.get(d_dinp, dinp.size()), dinp);
  expect_close("rmsnorm dweight", g.get(d_dw, C), dw);
}

void matmul_case(Precision p) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int N = 300, C = 48, OC = 80;
  Vec inp = randn(N * C, 1), w = randn(OC * C, 2, 0.2f), b = randn(OC, 3), dout = randn(N * OC, 4);
  Vec out(N * OC), dinp = randn(N * C, 5), dw = randn(OC * C, 6), db = randn(OC, 7);
  float* d_inp = g.put(inp);
  float* d_w = g.put(w);
  float* d_out = g.put(out);
  float* d_dinp = g.put(dinp);
  float* d_dw = g.put(dw);
  float* d_db = g.put(db);
  cpu->matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, C, OC, p);
  cpu->matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC, p);
  g.be->matmul_forward(d_out, d_inp, d_w, g.put(b), N, C, OC, p);
  g.be->matmul_backward(d_dinp, d_dw, d_db, g.put(dout), d_inp, d_w, N, C, OC, p);
  if (p == Precision::fp32) {
    expect_close("matmul out", g.get(d_out, out.size()), out, 1e-4, 1e-4);
    expect_close("matmul dinp", g.get(d_dinp, dinp.size()), dinp, 1e-4, 1e-4);
    expect_close("matmul dweight", g.get(d_dw, dw.size()), dw, 1e-4, 1e-4);
  } else {  // bf16 rounding of the inputs is ~2^-9 relative per product: 1e-2 of the norm is ample
    expect_close_norm("matmul out", g.get(d_out, out.size()), out, 1e-2);
    expect_close_norm("matmul dinp", g.get(d_dinp, dinp.size()), dinp, 1e-2);
    expect_close_norm("matmul dweight", g.get(d_dw, dw.size()), dw, 1e-2);
  }
  expect_close("matmul dbias", g.get(d_db, OC), db);  // summed in fp32 on both sides
}
// Sums of 48 (forward), 80 (dinp) and 300 (dweight) products of O(1) values: in fp32 the absolute
// term covers outputs near zero; in bf16 the comparison is norm-wise (cuBLAS is allowed, not forced,
// to round its inputs as the CPU does, and element errors grow with the products summed).
TEST(CudaOps, MatmulFp32) { matmul_case(Precision::fp32); }
TEST(CudaOps, MatmulBf16) { matmul_case(Precision::bf16); }

// drop: attention dropout on both backends (the same mask bits: dropout.hpp is shared code);
// key_start: per-document attention (each query's first key), or nullptr.
void attention_case(const Dropout* drop, const std::vector<int32_t>* key_start = nullptr) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int B = 2, T = 9, C = 24, NH = 3;
  Vec qkv = randn(B * T * 3 * C, 1), dout = randn(B * T * C, 2);
  Vec out(B * T * C), att(B * NH * T * T), dqkv = randn(B * T * 3 * C, 3);
  float* d_qkv = g.put(qkv);
  float* d_out = g.put(out);
  float* d_att = g.put(att);
  float* d_dqkv = g.put(dqkv);
  const int32_t* hk = key_start ? key_start->data() : nullptr;
  const int32_t* d_ks = key_start ? g.put(*key_start) : nullptr;
  const AttentionUse use{drop ? drop->p : 0.0f, key_start != nullptr};
  ASSERT_EQ(g.be->attention_state_floats(B, T, C, NH, Precision::fp32, use), att.size());  // fp32: materialised
  cpu->attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, Precision::fp32, drop, hk, use);
  cpu->attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), {}, B, T, C, NH, Precision::fp32, drop, use);
  g.be->attention_forward(d_out, d_att, d_qkv, B, T, C, NH, Precision::fp32, drop, d_ks, use);
  g.be->attention_backward(d_dqkv, g.put(dout), d_qkv, d_att, {}, B, T, C, NH, Precision::fp32, drop, use);
  expect_close("attention out", g.get(d_out, out.size()), out);
  expect_close("attention probabilities (zero outside each row's keys)", g.get(d_att, att.size()), att);
  expect_close("attention dqkv", g.get(d_dqkv, dqkv.size()), dqkv);
}
TEST(CudaOps, CausalAttention) { attention_case(nullptr); }
TEST(CudaOps, CausalAttentionWithDropout) {
  Dropout d;
  d.p = 0.3f, d.key = 77, d.first_sample = 5, d.T = 9, d.head0 = 2;
  attention_case(&d);
}
// Documents of 3, 4 and 2 tokens in sample 0, of 9 in sample 1; with dropout too.
TEST(CudaOps, PerDocumentAttention) {
  const std::vector<int32_t> ks = {0, 0, 0, 3, 3, 3, 3, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  attention_case(nullptr, &ks);
  Dropout d;
  d.p = 0.3f, d.key = 77, d.first_sample = 5, d.T = 9, d.head0 = 2;
  attention_case(&d, &ks);
}

// cuDNN's fused attention (bf16 / fp16) against the CPU's materialised kernel in fp32 on the same
// 16-bit-rounded q, k, v and dout. Tolerances, norm-wise: the fused kernel rounds P to 16 bits
// before P V and its output to 16 bits (each ~2^-9 relative in bf16, 2^-12 in fp16), so 1e-2 of
// the output's norm; the backward also multiplies 16-bit dS and P, then rounds dq, dk, dv, so 2e-2.
// dqkv starts nonzero: the op accumulates into it (the contract), checked with the sum.
// key_start: per-document attention (each query's first key), or nullptr.
void fused_case(Precision p, int B, int T, int NH, int HS, const std::vector<int32_t>* key_start = nullptr) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int C = NH * HS;
  const AttentionUse use{0.0f, key_start != nullptr};
  const AttentionKernel k = g.be->attention_kernel(B, T, C, NH, p, use);
  SKIP_IF_OLD_CUDNN(k);
  ASSERT_TRUE(k.fused) << k.what;
  const size_t N = (size_t)B * T, state = g.be->attention_state_floats(B, T, C, NH, p, use);
  // The state grows with T, the probabilities with T^2: at T = 1024 the fused one is a third or less
  // (about 2 x head size / T of them; the decision above stands for every T).
  EXPECT_LT(g.be->attention_state_floats(B, 1024, C, NH, p, use), (size_t)B * NH * 1024 * 1024 / 3);
  auto rounded = [&](Vec v) {
    std::vector<uint16_t> h(v.size());
    to_half(v.data(), h.data(), v.size(), p);
    from_half(h.data(), v.data(), v.size(), p);
    return v;
  };
  const Vec qkv = rounded(randn(N * 3 * C, 11)), dout = rounded(randn(N * C, 12)), dqkv0 = randn(N * 3 * C, 13);
  Vec out(N * C), att(N * NH * T), dqkv = dqkv0;
  const int32_t* hk = key_start ? key_start->data() : nullptr;
  cpu->attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, Precision::fp32, nullptr, hk, {});
  cpu->attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), {}, B, T, C, NH, Precision::fp32, nullptr, {});
  BackendBuffer d_state(*g.be, state * sizeof(float));
  float* d_out = g.put(Vec(N * C));
  float* d_dqkv = g.put(dqkv0);
  const float* d_qkv = g.put(qkv);
  const int32_t* d_ks = key_start ? g.put(*key_start) : nullptr;
  g.be->attention_forward(d_out, d_state.as<float>(), d_qkv, B, T, C, NH, p, nullptr, d_ks, use);
  g.be->attention_backward(d_dqkv, g.put(dout), d_qkv, d_state.as<float>(), {}, B, T, C, NH, p, nullptr, use);
  expect_close_norm("fused attention out", g.get(d_out, out.size()), out, 1e-2);
  Vec grad = g.get(d_dqkv, dqkv.size()), want = dqkv;
  for (size_t i = 0; i < grad.size(); ++i) grad[i] -= dqkv0[i], want[i] -= dqkv0[i];
  expect_close_norm("fused attention dqkv (accumulated)", grad, want, 2e-2);
}
TEST(CudaOps, FusedAttentionBf16) { fused_case(Precision::bf16, 2, 128, 2, 64); }
TEST(CudaOps, FusedAttentionFp16OddLength) { fused_case(Precision::fp16, 1, 100, 3, 32); }
TEST(CudaOps, FusedAttentionBf16Head128) { fused_case(Precision::bf16, 2, 256, 4, 128); }
// Documents of 40, 60 and 28 tokens in sample 0, one of 128 in sample 1 (the backward reads the
// keys the forward kept in its state).
TEST(CudaOps, FusedAttentionPerDocument) {
  std::vector<int32_t> ks;
  for (int t = 0; t < 128; ++t) ks.push_back(t < 40 ? 0 : t < 100 ? 40 : 100);
  for (int t = 0; t < 128; ++t) ks.push_back(0);
  fused_case(Precision::bf16, 2, 128, 2, 64, &ks);
}
// What the fused kernel leaves to the materialised one: fp32 and head sizes it does not take; each
// says why, and its state is the T x T probabilities.
TEST(CudaOps, FusedAttentionRefusals) {
  NEED_GPU(g);
  const int B = 2, T = 16, NH = 2;
  struct Case {
    int C;
    Precision p;
    AttentionUse use;
    const char* why;
  };
  for (const Case& c : {Case{64, Precision::fp32, {}, "fp32"}, Case{2 * 12, Precision::bf16, {}, "head size 12"},
                        Case{2 * 12, Precision::bf16, {0.1f, true}, "head size 12"}}) {
    const AttentionKernel k = g.be->attention_kernel(B, T, c.C, NH, c.p, c.use);
    EXPECT_FALSE(k.fused) << c.why;
    EXPECT_NE(k.what.find(c.why), std::string::npos) << k.what;
    EXPECT_EQ(g.be->attention_state_floats(B, T, c.C, NH, c.p, c.use), (size_t)B * NH * T * T) << c.why;
  }
  g.be->allow_fused_attention(false);
  EXPECT_FALSE(g.be->attention_kernel(B, T, 64, NH, Precision::bf16, {}).fused);
}

// The fused kernel's attention dropout (cuDNN's generator, so not the CPU's mask): with v the
// identity (head size = T), each output row is that query's row of dropped probabilities, so the
// mask is read off the forward: above the diagonal 0; on and below it either 0 (dropped) or the
// CPU's probability / (1 - p) (kept, within fp16's rounding: 1e-2 relative + 1e-4). Dropped: a
// fraction p of the 33024 causal entries, within 5 binomial standard deviations (+-0.012 at p 0.25).
// The same Dropout twice gives the same output bitwise; another key another mask. Backward: the
// CPU's gradients with that mask (dV = Pd^T dO, dP = dO v^T * mask / (1 - p), the softmax backward,
// dq and dk), within the fused case's 2e-2 of the norm: so the backward regenerates the forward's
// mask. Evaluation (no Dropout, same declared use) is the undropped attention.
TEST(CudaOps, FusedAttentionDropout) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int B = 2, T = 128, NH = 2, HS = 128, C = NH * HS;
  const size_t N = (size_t)B * T;
  const float drop_p = 0.25f;
  const AttentionUse use{drop_p, false};
  const Precision p = Precision::fp16;
  const AttentionKernel k = g.be->attention_kernel(B, T, C, NH, p, use);
  SKIP_IF_OLD_CUDNN(k);
  ASSERT_TRUE(k.fused) << k.what;
  Vec qkv = randn(N * 3 * C, 21, 0.5f);
  for (size_t t = 0; t < N; ++t)  // v: the identity, per head (token j's row is e_j)
    for (int h = 0; h < NH; ++h)
      for (int d = 0; d < HS; ++d) qkv[t * 3 * C + 2 * C + h * HS + d] = (d == (int)(t % T)) ? 1.0f : 0.0f;
  {
    std::vector<uint16_t> hq(qkv.size());
    to_half(qkv.data(), hq.data(), qkv.size(), p);
    from_half(hq.data(), qkv.data(), qkv.size(), p);
  }
  Vec dout = randn(N * C, 22), probs(N * NH * T), plain(N * C);
  {
    std::vector<uint16_t> hd(dout.size());
    to_half(dout.data(), hd.data(), dout.size(), p);
    from_half(hd.data(), dout.data(), dout.size(), p);
  }
  cpu->attention_forward(plain.data(), probs.data(), qkv.data(), B, T, C, NH, Precision::fp32, nullptr, nullptr, {});
  Dropout d;
  d.p = drop_p, d.key = 99, d.first_sample = 40, d.T = T;
  const size_t state = g.be->attention_state_floats(B, T, C, NH, p, use);
  BackendBuffer s1(*g.be, state * sizeof(float)), s2(*g.be, state * sizeof(float));
  const float* d_qkv = g.put(qkv);
  float* o1 = g.put(Vec(N * C));
  float* o2 = g.put(Vec(N * C));
  g.be->attention_forward(o1, s1.as<float>(), d_qkv, B, T, C, NH, p, &d, nullptr, use);
  g.be->attention_forward(o2, s2.as<float>(), d_qkv, B, T, C, NH, p, &d, nullptr, use);
  const Vec out = g.get(o1, N * C), again = g.get(o2, N * C);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], again[i]) << "the same Dropout, element " << i;
  // The mask, read off the output: out[b, i, h, j] = P[b, h, i, j] * mask / (1 - p).
  std::vector<char> keep(N * NH * T, 0);
  size_t causal = 0, dropped = 0, bad = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i)
        for (int j = 0; j < T; ++j) {
          const float got = out[((size_t)b * T + i) * C + h * HS + j];
          const size_t e = (((size_t)b * NH + h) * T + i) * T + j;
          const float want = probs[e] / (1.0f - drop_p);
          if (j > i) {
            bad += got != 0.0f;
            continue;
          }
          ++causal;
          if (std::fabs(got) < 0.5f * want) {
            ++dropped;
            bad += got != 0.0f;
          } else {
            keep[e] = 1;
            bad += !(std::fabs(got - want) <= 1e-2f * want + 1e-4f);
          }
        }
  EXPECT_EQ(bad, 0u) << "entries neither 0 nor the kept probability";
  const double frac = double(dropped) / double(causal), sd = std::sqrt(drop_p * (1 - drop_p) / double(causal));
  EXPECT_NEAR(frac, drop_p, 5 * sd) << dropped << " of " << causal << " dropped";
  Dropout other = d;
  other.key = 100;
  g.be->attention_forward(o2, s2.as<float>(), d_qkv, B, T, C, NH, p, &other, nullptr, use);
  const Vec third = g.get(o2, N * C);
  size_t differ = 0;
  for (size_t i = 0; i < out.size(); ++i) differ += out[i] != third[i];
  EXPECT_GT(differ, out.size() / 10) << "another key should draw another mask";
  // Backward with the forward's Dropout against the CPU's with the mask read above.
  float* d_dqkv = g.put(Vec(N * 3 * C));
  g.be->attention_backward(d_dqkv, g.put(dout), d_qkv, s1.as<float>(), {}, B, T, C, NH, p, &d, use);
  const Vec grad = g.get(d_dqkv, N * 3 * C);
  Vec want(N * 3 * C, 0.0f);
  const float scale = 1.0f / std::sqrt((float)HS), inv = 1.0f / (1.0f - drop_p);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      auto P = [&](int i, int j) { return probs[(((size_t)b * NH + h) * T + i) * T + j]; };
      auto M = [&](int i, int j) { return (float)keep[(((size_t)b * NH + h) * T + i) * T + j]; };
      auto row = [&](int t, int part) { return ((size_t)b * T + t) * 3 * C + part * C + h * HS; };
      auto dO = [&](int i, int c) { return dout[((size_t)b * T + i) * C + h * HS + c]; };
      std::vector<float> dS((size_t)T * T, 0.0f);
      for (int i = 0; i < T; ++i) {
        double D = 0;
        for (int j = 0; j <= i; ++j) D += dO(i, j) * M(i, j) * inv * P(i, j);  // dP = dO v^T * mask / (1-p), v = I
        for (int j = 0; j <= i; ++j) dS[(size_t)i * T + j] = P(i, j) * (dO(i, j) * M(i, j) * inv - (float)D);
      }
      for (int j = 0; j < T; ++j)
        for (int c = 0; c < HS; ++c) {
          double dv = 0;
          for (int i = j; i < T; ++i) dv += P(i, j) * M(i, j) * inv * dO(i, c);
          want[row(j, 2) + c] = (float)dv;
        }
      for (int i = 0; i < T; ++i)
        for (int c = 0; c < HS; ++c) {
          double dq = 0, dk = 0;
          for (int j = 0; j < T; ++j) {
            dq += dS[(size_t)i * T + j] * qkv[row(j, 1) + c];
            dk += dS[(size_t)j * T + i] * qkv[row(j, 0) + c];
          }
          want[row(i, 0) + c] = scale * (float)dq;
          want[row(i, 1) + c] = scale * (float)dk;
        }
    }
  for (int part = 0; part < 3; ++part) {
    Vec gp, wp;
    for (size_t t = 0; t < N; ++t)
      for (int c = 0; c < C; ++c) gp.push_back(grad[t * 3 * C + part * C + c]), wp.push_back(want[t * 3 * C + part * C + c]);
    expect_close_norm(part == 0 ? "dq with dropout" : part == 1 ? "dk with dropout" : "dv with dropout", gp, wp, 2e-2);
  }
  // Evaluation: no Dropout, the same declared use.
  g.be->attention_forward(o2, s2.as<float>(), d_qkv, B, T, C, NH, p, nullptr, nullptr, use);
  expect_close_norm("evaluation (no dropout)", g.get(o2, N * C), plain, 1e-2);
}

// Token-row dropout: the same elements dropped and the same products on both backends (bitwise).
TEST(CudaOps, DropoutRowsBitwise) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const size_t rows = 37;
  const int C = 48;
  Vec x = randn(rows * C, 5), y = x;
  Dropout d;
  d.p = 0.1f, d.key = 123, d.first_sample = 1000, d.T = 8, d.first_row = 3;
  float* d_x = g.put(x);
  cpu->dropout(y.data(), rows, C, d);
  g.be->dropout(d_x, rows, C, d);
  const Vec got = g.get(d_x, x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], y[i]) << "element " << i;
}

TEST(CudaOps, GeluAndResidual) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const size_t n = 1000;
  Vec x = randn(n, 1, 2.0f), y = randn(n, 2), dout = randn(n, 3), out(n), sum(n), dinp = randn(n, 4);
  float* d_x = g.put(x);
  float* d_out = g.put(out);
  float* d_sum = g.put(sum);
  float* d_dinp = g.put(dinp);
  cpu->gelu_forward(out.data(), x.data(), n);
  cpu->gelu_backward(dinp.data(), x.data(), dout.data(), n);
  cpu->residual_forward(sum.data(), x.data(), y.data(), n);
  g.be->gelu_forward(d_out, d_x, n);
  g.be->gelu_backward(d_dinp, d_x, g.put(dout), n);
  g.be->residual_forward(d_sum, d_x, g.put(y), n);
  expect_close("gelu out", g.get(d_out, n), out);
  expect_close("gelu dinp", g.get(d_dinp, n), dinp);
  expect_close("residual", g.get(d_sum, n), sum);
}

TEST(CudaOps, SoftmaxCrossEntropyWithIgnoredTargetAndPadding) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int N = 5, V = 50, Vp = 64;
  Vec logits = randn(N * Vp, 1, 3.0f), losses(N);
  std::vector<int32_t> tgt = {7, -1, 49, 0, 23};
  float* d_logits = g.put(logits);
  float* d_losses = g.put(losses);
  cpu->softmax_cross_entropy(logits.data(), losses.data(), tgt.data(), 0.25f, N, V, Vp);
  g.be->softmax_cross_entropy(d_logits, d_losses, g.put(tgt), 0.25f, N, V, Vp);
  expect_close("losses", g.get(d_losses, N), losses);
  expect_close("dlogits", g.get(d_logits, logits.size()), logits);
}

// The vocab-parallel pieces (tp_ops.hpp): a slice's rows with out-of-slice ids as zeros and their
// gradient (repeats: the atomic scatter), positions added to a rank's rows, and the cross entropy's
// three passes over a slice whose last columns are padding, with an ignored row. The sums between
// the passes are the caller's; one rank's slice is a whole cross entropy on its own.
TEST(CudaOps, VocabSliceRowsAndCrossEntropy) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int N = 10, C = 6, first = 8, count = 8, T = 5;
  std::vector<int32_t> ids = {3, 9, 15, 9, 16, 8, 0, 12, 9, 7}, pos = {0, 1, 2, 0, 1, 2, 3, 0, 1, 0};
  Vec part = randn(count * C, 1), dout = randn(N * C, 2), dpart = randn(count * C, 3), wpe = randn(T * C, 4);
  Vec rows(N * C), dpart0 = dpart;
  cpu->vocab_rows(rows.data(), part.data(), ids.data(), N, C, first, count);
  cpu->vocab_rows_backward(dpart.data(), dout.data(), ids.data(), N, C, first, count);
  float* d_rows = g.put(Vec(N * C, 7.0f));  // every element written, zeros included
  float* d_dpart = g.put(dpart0);
  const int32_t* d_ids = g.put(ids);
  g.be->vocab_rows(d_rows, g.put(part), d_ids, N, C, first, count);
  g.be->vocab_rows_backward(d_dpart, g.put(dout), d_ids, N, C, first, count);
  expect_close("vocab rows", g.get(d_rows, rows.size()), rows);
  expect_close("vocab rows backward", g.get(d_dpart, dpart.size()), dpart);
  const int32_t *none = nullptr, *given = pos.data();
  for (const int32_t* p : {none, given}) {  // positions t % T, then given ones
    Vec out = rows;
    cpu->add_position_rows(out.data(), wpe.data(), p, 3, 6, T, C);
    float* d_out = g.put(rows);
    g.be->add_position_rows(d_out, g.put(wpe), p ? g.put(pos) : nullptr, 3, 6, T, C);
    expect_close(p ? "given positions" : "positions t % T", g.get(d_out, out.size()), out);
  }
  const int R = 5, vl = 40, vstart = 80, V = 110;  // real columns [0, 30) of the slice
  const int valid = V - vstart;
  Vec logits = randn(R * vl, 5, 3.0f), mx(R), losses(R);
  std::vector<int32_t> tgt = {85, -1, 109, 3, 80};  // in the slice, ignored, last real, elsewhere, first
  std::vector<double> sums(2 * R);
  float* d_logits = g.put(logits);
  float* d_mx = g.put(mx);
  float* d_losses = g.put(losses);
  double* d_sums = g.put(sums);
  const int32_t* d_tgt = g.put(tgt);
  cpu->vocab_ce_max(mx.data(), logits.data(), R, vl, valid);
  cpu->vocab_ce_sums(sums.data(), logits.data(), mx.data(), tgt.data(), R, vl, vstart, valid);
  cpu->vocab_ce_finish(logits.data(), losses.data(), mx.data(), sums.data(), tgt.data(), 0.25f, R, vl, vstart, valid,
                       true);
  g.be->vocab_ce_max(d_mx, d_logits, R, vl, valid);
  g.be->vocab_ce_sums(d_sums, d_logits, d_mx, d_tgt, R, vl, vstart, valid);
  g.be->vocab_ce_finish(d_logits, d_losses, d_mx, d_sums, d_tgt, 0.25f, R, vl, vstart, valid, true);
  expect_close("row maxima", g.get(d_mx, R), mx);
  std::vector<double> got(2 * R);
  g.be->copy_to_host(got.data(), d_sums, got.size() * sizeof(double));
  for (int i = 0; i < 2 * R; ++i) EXPECT_NEAR(got[i], sums[i], 1e-5 * std::max(1.0, std::fabs(sums[i]))) << "sum " << i;
  expect_close("slice losses", g.get(d_losses, R), losses);
  expect_close("slice dlogits", g.get(d_logits, logits.size()), logits);
}

// Every 16-bit pattern, widened on the GPU and by kernels::from_half on the CPU: bitwise equal (fp16
// NaNs need only stay NaN: the payload may differ between the two conversions).
TEST(CudaOps, WidenHalfEveryPattern) {
  NEED_GPU(g);
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  const uint16_t* d_all = g.put(all);
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    Vec want(all.size());
    from_half(all.data(), want.data(), all.size(), p);
    float* d_out = g.put(Vec(all.size()));
    g.be->widen_half(d_out, d_all, all.size(), p);
    Vec got = g.get(d_out, all.size());
    size_t bad = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      if (std::isnan(want[i])) bad += !std::isnan(got[i]) || (p == Precision::bf16 && std::memcmp(&got[i], &want[i], 4) != 0);
      else bad += std::memcmp(&got[i], &want[i], 4) != 0;
    }
    EXPECT_EQ(bad, 0u) << precision_name(p);
  }
}

// The 16-bit gradient accumulator (ZeRO-Offload keeps it on the GPU over micro-steps): every 16-bit
// pattern as the accumulator, plus fp32 addends of every scale (and inf, NaN, fp16 overflow), on the
// GPU and by kernels::accumulate_half on the CPU: bitwise equal, so the GPU's accumulation over
// micro-steps is the host engine's. NaNs need only stay NaN: the GPU's fp32 addition returns its
// canonical NaN where the CPU's keeps the operand's payload (seen on an H200: the 505 NaN sums of
// the bf16 run were the only differences).
TEST(CudaOps, AccumulateHalfEveryPattern) {
  NEED_GPU(g);
  std::vector<uint16_t> acc(65536 * 2);
  Vec add(acc.size());
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> scale(-30, 30);
  for (size_t i = 0; i < acc.size(); ++i) {
    acc[i] = static_cast<uint16_t>(i);
    add[i] = std::ldexp(mant(rng), scale(rng));
  }
  add[7] = INFINITY, add[8] = -INFINITY, add[9] = NAN, add[10] = 70000.0f, add[11] = -1e30f;
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    std::vector<uint16_t> want = acc;
    accumulate_half(add.data(), want.data(), want.size(), p);
    uint16_t* d_acc = g.put(acc);
    g.be->accumulate_half(d_acc, g.put(add), acc.size(), p);
    std::vector<uint16_t> got(acc.size());
    g.be->copy_to_host(got.data(), d_acc, got.size() * sizeof(uint16_t));
    Vec wf(want.size()), gf(got.size());
    from_half(want.data(), wf.data(), want.size(), p);
    from_half(got.data(), gf.data(), got.size(), p);
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      bad += std::isnan(wf[i]) ? !std::isnan(gf[i]) : got[i] != want[i];
    EXPECT_EQ(bad, 0u) << precision_name(p);
  }
}

// The MoE layer's row moves and mixes (moe_ops.hpp): top-2 routes with some dropped (pos -1), a
// token with both routes dropped, and C not a multiple of the warp.
TEST(CudaOps, MoeGatherCombineAndBackwards) {
  NEED_GPU(g)
  auto cpu = cpu_ops();
  const int N = 37, K = 2, C = 45;
  std::vector<int32_t> pos(N * K, -1), order;
  for (int i = 0; i < N * K; ++i)
    if (!(i % 5 == 3 || i / K == 7)) order.push_back(i);
  const int S = static_cast<int>(order.size());
  std::shuffle(order.begin(), order.end(), std::mt19937(5));  // rows in another order than the routes
  std::vector<int32_t> source(S);
  for (int p = 0; p < S; ++p) pos[order[p]] = p, source[p] = order[p] / K;
  const Vec x = randn((size_t)N * C, 1), y = randn((size_t)S * C, 2), w = randn((size_t)N * K, 3),
            dout = randn((size_t)N * C, 4), dx0 = randn((size_t)N * C, 5);

  Vec send(S * C);
  cpu->gather_rows(send.data(), x.data(), source.data(), S, C);
  float* dsend = g.put(Vec(S * C));
  g.be->gather_rows(dsend, g.put(x), g.put(source), S, C);
  expect_close("gather_rows", g.get(dsend, S * C), send, 0, 0);
  // scatter_rows puts them back (gather_rows' inverse: random-LTD's kept rows); untouched rows stay.
  std::vector<int32_t> distinct(N);
  std::iota(distinct.begin(), distinct.end(), 0);
  std::shuffle(distinct.begin(), distinct.end(), std::mt19937(9));
  distinct.resize(N / 2);
  Vec back = dx0;
  cpu->scatter_rows(back.data(), x.data(), distinct.data(), distinct.size(), C);
  float* dback = g.put(dx0);
  g.be->scatter_rows(dback, g.put(x), g.put(distinct), distinct.size(), C);
  expect_close("scatter_rows", g.get(dback, N * C), back, 0, 0);

  Vec out(N * C);
  cpu->moe_combine(out.data(), y.data(), pos.data(), w.data(), N, K, C);
  float* dout_g = g.put(Vec(N * C, 7.0f));
  const int32_t* dpos = g.put(pos);
  const float *dy_in = g.put(y), *dw = g.put(w);
  g.be->moe_combine(dout_g, dy_in, dpos, dw, N, K, C);
  expect_close("moe_combine", g.get(dout_g, N * C), out);
  for (int c = 0; c < C; ++c) EXPECT_EQ(out[7 * C + c], 0.0f);  // both routes dropped

  Vec dy(S * C, 0.0f), dwt(N * K, 9.0f);
  cpu->moe_combine_backward(dy.data(), dwt.data(), dout.data(), y.data(), pos.data(), w.data(), N, K, C);
  float *ddy = g.put(Vec(S * C, 0.0f)), *ddw = g.put(Vec(N * K, 9.0f));
  g.be->moe_combine_backward(ddy, ddw, g.put(dout), dy_in, dpos, dw, N, K, C);
  expect_close("moe_combine_backward dy", g.get(ddy, S * C), dy);
  expect_close("moe_combine_backward dweight", g.get(ddw, N * K), dwt);

  Vec dx = dx0;
  cpu->moe_dispatch_backward(dx.data(), y.data(), pos.data(), N, K, C);
  float* ddx = g.put(dx0);
  g.be->moe_dispatch_backward(ddx, dy_in, dpos, N, K, C);
  expect_close("moe_dispatch_backward", g.get(ddx, N * C), dx);
}

TEST(CudaOps, MultiplyAndResidualMix) {
  NEED_GPU(g)
  auto cpu = cpu_ops();
  const int N = 29, C = 70;
  const size_t n = (size_t)N * C;
  const Vec a = randn(n, 11), b = randn(n, 12), acc0 = randn(n, 13), coef0 = randn((size_t)N * 2, 14, 3.0f),
            dout = randn(n, 15);
  Vec prod(n), acc = acc0;
  cpu->multiply(prod.data(), a.data(), b.data(), n, false);
  cpu->multiply(acc.data(), a.data(), b.data(), n, true);
  const float *da = g.put(a), *db = g.put(b);
  float *dprod = g.put(Vec(n)), *dacc = g.put(acc0);
  g.be->multiply(dprod, da, db, n, false);
  g.be->multiply(dacc, da, db, n, true);
  expect_close("multiply", g.get(dprod, n), prod);
  expect_close("multiply accumulate", g.get(dacc, n), acc);

  Vec out(n), coef = coef0;
  cpu->residual_mix(out.data(), coef.data(), a.data(), b.data(), N, C);
  float *dmix = g.put(Vec(n)), *dcoef = g.put(coef0);
  g.be->residual_mix(dmix, dcoef, da, db, N, C);
  expect_close("residual_mix out", g.get(dmix, n), out);
  expect_close("residual_mix coef", g.get(dcoef, (size_t)N * 2), coef);

  Vec dmoe(n), ddense(n), dlog((size_t)N * 2);
  cpu->residual_mix_backward(dmoe.data(), ddense.data(), dlog.data(), dout.data(), coef.data(), a.data(), b.data(), N, C);
  float *gm = g.put(Vec(n)), *gd = g.put(Vec(n)), *gl = g.put(Vec((size_t)N * 2));
  g.be->residual_mix_backward(gm, gd, gl, g.put(dout), dcoef, da, db, N, C);
  expect_close("residual_mix_backward dmoe", g.get(gm, n), dmoe);
  expect_close("residual_mix_backward ddense", g.get(gd, n), ddense);
  expect_close("residual_mix_backward dlogits", g.get(gl, (size_t)N * 2), dlog);
}

TEST(CudaOps, CopyOnTheDevice) {
  NEED_GPU(g)
  const Vec a = randn(1000, 21);
  float *src = g.put(a), *dst = g.put(Vec(1000, 0.0f));
  g.be->copy(dst + 10, src + 20, 500 * sizeof(float));
  const Vec got = g.get(dst, 1000);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(got[i], i >= 10 && i < 510 ? a[i + 10] : 0.0f) << i;
}

// The optimizer step on the device (OpsBackend::adamw: one multi-tensor launch) against the host's
// adamw_runs on the same runs: runs of odd lengths (a tile's tail, a run shorter than a warp, an
// empty run), fp32 and 16-bit gradients, with and without the 16-bit copy, weight decay per run, two
// steps (the second reuses the uploaded table of runs), and the state norms. Tolerance: the GPU may
// contract a*b + c into an FMA where the host rounds twice, so each update differs by a few ulps of
// fp32: 1e-6 relative + 1e-7 absolute on masters and moments after two steps; the 16-bit copies
// then agree except where such an ulp crosses a rounding boundary (at most 1 in 1000 elements,
// by one 16-bit ulp).
TEST(CudaOps, AdamwRunsMatchTheHost) {
  NEED_GPU(g);
  const std::vector<size_t> sizes = {4096 * 3 + 17, 5, 0, 70000, 4096};
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    const bool half = p != Precision::fp32;
    struct Host {
      Vec param, grad, m, v;
      std::vector<uint16_t> g16, p16;
    };
    std::vector<Host> host(sizes.size());
    std::vector<AdamwRun> hruns(sizes.size()), druns(sizes.size());
    for (size_t k = 0; k < sizes.size(); ++k) {
      Host& h = host[k];
      const size_t n = sizes[k];
      h.param = randn(n, 100 + k, 0.5f);
      h.grad = randn(n, 200 + k, 1e-2f);
      h.m = Vec(n, 0.0f), h.v = Vec(n, 0.0f);
      if (half) {
        h.g16.resize(n), h.p16.resize(n);
        to_half(h.grad.data(), h.g16.data(), n, p);
      }
      AdamwRun r;
      r.n = n;
      r.weight_decay = k % 2 ? 0.1f : 0.0f;
      r.norms = k != 3;
      druns[k] = r;
      r.param = h.param.data(), r.m = h.m.data(), r.v = h.v.data();
      if (half) r.grad16 = h.g16.data(), r.param16 = k == 1 ? nullptr : h.p16.data();
      else r.grad = h.grad.data();
      hruns[k] = r;
      AdamwRun& d = druns[k];
      d.param = g.put(h.param), d.m = g.put(h.m), d.v = g.put(h.v);
      if (half) d.grad16 = g.put(h.g16), d.param16 = k == 1 ? nullptr : g.put(h.p16);
      else d.grad = g.put(h.grad);
    }
    AdamwArgs a;
    a.lr = 1e-3f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.grad_scale = 0.5f, a.precision = p;
    double hs[3] = {0, 0, 0}, ds[3] = {0, 0, 0};
    for (int step = 1; step <= 2; ++step) {
      a.step = step;
      adamw_runs(hruns.data(), hruns.size(), a, hs);
      g.be->adamw(druns.data(), druns.size(), a, ds);
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      const std::string what = std::string(precision_name(p)) + " run " + std::to_string(k);
      expect_close((what + " master").c_str(), g.get(druns[k].param, sizes[k]), host[k].param, 1e-6, 1e-7);
      expect_close((what + " exp_avg").c_str(), g.get(druns[k].m, sizes[k]), host[k].m, 1e-6, 1e-9);
      expect_close((what + " exp_avg_sq").c_str(), g.get(druns[k].v, sizes[k]), host[k].v, 1e-6, 1e-12);
      if (half && druns[k].param16) {
        std::vector<uint16_t> got(sizes[k]);
        g.be->copy_to_host(got.data(), druns[k].param16, got.size() * sizeof(uint16_t));
        size_t off = 0;
        for (size_t i = 0; i < got.size(); ++i)
          off += got[i] != host[k].p16[i] && std::abs(int(got[i]) - int(host[k].p16[i])) != 1 ? 1000 : got[i] != host[k].p16[i];
        EXPECT_LE(off, got.size() / 1000) << what << ": 16-bit copies that differ (by more than one ulp: x1000)";
      }
    }
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(ds[i], hs[i], 1e-5 * hs[i]) << precision_name(p) << " state norm " << i;
  }
}

// Sums of squares (the gradient norm) in double, over sizes that leave partial blocks, fp32 and
// 16-bit, against the host; twice, for the same bits (a fixed order, unlike atomics). 1e-12
// relative: both sum in double, in different orders.
TEST(CudaOps, SumOfSquaresIsDeterministic) {
  NEED_GPU(g);
  for (size_t n : {size_t(1), size_t(1000), size_t(3u << 20) + 5}) {
    Vec x = randn(n, n, 3.0f);
    const float* d = g.put(x);
    const double want = sum_of_squares(x.data(), n), got = g.be->sum_squares(d, n);
    EXPECT_NEAR(got, want, 1e-12 * want) << n;
    EXPECT_EQ(got, g.be->sum_squares(d, n)) << n << ": run to run";
    for (Precision p : {Precision::bf16, Precision::fp16}) {
      std::vector<uint16_t> h(n);
      to_half(x.data(), h.data(), n, p);
      const double w16 = sum_of_squares_half(h.data(), n, p), g16 = g.be->sum_squares_half(g.put(h), n, p);
      EXPECT_NEAR(g16, w16, 1e-12 * w16) << precision_name(p) << " " << n;
    }
  }
  EXPECT_EQ(g.be->sum_squares(nullptr, 0), 0.0);
  Vec bad = {1.0f, INFINITY, 2.0f};
  EXPECT_FALSE(std::isfinite(g.be->sum_squares(g.put(bad), bad.size()))) << "an overflow must show in the norm";
}

// Zero counts (--log-num-zeros-in-grad) equal the host's exactly, fp32 and 16-bit, +0 and -0, at
// sizes that leave partial blocks.
TEST(CudaOps, CountZerosIsTheHosts) {
  NEED_GPU(g);
  for (size_t n : {size_t(1), size_t(1000), size_t(3u << 20) + 5}) {
    Vec x = randn(n, n + 1, 1.0f);
    for (size_t i = 0; i < n; i += 3) x[i] = (i % 2) ? -0.0f : 0.0f;
    const double want = count_zeros(x.data(), n);
    EXPECT_EQ(g.be->count_zeros(g.put(x), n), want) << n;
    std::vector<uint16_t> h(n);
    to_half(x.data(), h.data(), n, Precision::bf16);
    EXPECT_EQ(g.be->count_zeros_half(g.put(h), n), count_zeros_half(h.data(), n)) << n;
  }
  EXPECT_EQ(g.be->count_zeros(nullptr, 0), 0.0);
}

// The 16-bit conversions the engine uses: narrow_half bitwise kernels::to_half and add_half bitwise
// kernels::add_half over every 16-bit pattern (NaNs need only stay NaN, as above).
TEST(CudaOps, NarrowAndAddHalfEveryPattern) {
  NEED_GPU(g);
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<uint16_t> rev(all.rbegin(), all.rend());
  Vec x = randn(all.size(), 5, 100.0f);
  x[3] = INFINITY, x[4] = NAN, x[5] = 70000.0f, x[6] = 1e-30f;
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    std::vector<uint16_t> want(all.size()), got(all.size());
    to_half(x.data(), want.data(), x.size(), p);
    uint16_t* d = g.put(std::vector<uint16_t>(all.size()));
    g.be->narrow_half(d, g.put(x), x.size(), p);
    g.be->copy_to_host(got.data(), d, got.size() * sizeof(uint16_t));
    Vec nf(got.size());
    from_half(got.data(), nf.data(), got.size(), p);
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += std::isnan(x[i]) ? !std::isnan(nf[i]) : got[i] != want[i];
    EXPECT_EQ(bad, 0u) << precision_name(p) << " narrow_half";
    want = all;
    add_half(rev.data(), want.data(), want.size(), p);
    uint16_t* acc = g.put(all);
    g.be->add_half(acc, g.put(rev), all.size(), p);
    g.be->copy_to_host(got.data(), acc, got.size() * sizeof(uint16_t));
    Vec wf(want.size()), gf(got.size());
    from_half(want.data(), wf.data(), want.size(), p);
    from_half(got.data(), gf.data(), got.size(), p);
    bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += std::isnan(wf[i]) ? !std::isnan(gf[i]) : got[i] != want[i];
    EXPECT_EQ(bad, 0u) << precision_name(p) << " add_half";
  }
}
