// Every kernel's forward against a scalar double reference, and every backward against central
// finite differences of L = sum(out * R) for a fixed random R. Small odd sizes catch indexing bugs.
//
// Tolerances (|analytic - fd| <= atol + rtol*|fd|), per op:
//   op                      eps    atol   rtol   why
//   encoder, residual       1e-2   1e-3   1e-3   linear: FD exact up to fp32 rounding of L
//   matmul (fp32)           1e-2   2e-3   5e-3   linear in each input
//   layernorm               1e-2   3e-3   2e-2   curvature of 1/sqrt(var) at eps^2
//   gelu                    1e-2   2e-3   1e-2   smooth, O(eps^2) truncation
//   attention               1e-2   3e-3   2e-2   softmax curvature
//   softmax_cross_entropy   1e-2   3e-3   2e-2   log-sum-exp curvature
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "hpct/kernels/ops.hpp"

using namespace hpct::kernels;
using Vec = std::vector<float>;

namespace {
Vec randn(size_t n, uint64_t seed, float s = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, s);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}
double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double)a[i] * b[i];
  return s;
}
// Checks grad (analytic dL/dx) against central differences of loss(x) at up to 60 entries.
void fd_check(const char* what, Vec& x, const Vec& grad, const std::function<double()>& loss, float eps, double atol,
              double rtol) {
  ASSERT_EQ(x.size(), grad.size());
  size_t stride = std::max<size_t>(1, x.size() / 60);
  int bad = 0;
  for (size_t i = 0; i < x.size(); i += stride) {
    float keep = x[i];
    x[i] = keep + eps;
    double lp = loss();
    x[i] = keep - eps;
    double lm = loss();
    x[i] = keep;
    double fd = (lp - lm) / (2.0 * eps);
    if (std::fabs(grad[i] - fd) > atol + rtol * std::fabs(fd)) {
      if (bad++ < 5) ADD_FAILURE() << what << "[" << i << "]: analytic " << grad[i] << " vs finite difference " << fd;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}
}  // namespace

TEST(Gemm, AllTransposesAndPrecisions) {
  const int M = 7, N = 5, K = 9;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
        Vec A = randn((size_t)M * K, 1), B = randn((size_t)K * N, 2), C = randn((size_t)M * N, 3), C0 = C;
        int lda = ta ? M : K, ldb = tb ? K : N;
        gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), N, p);
        double tol = p == Precision::fp32 ? 1e-5 : p == Precision::bf16 ? 3e-2 : 5e-3;  // input rounding 2^-8 / 2^-11
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < N; ++j) {
            double s = 0;
            for (int k = 0; k < K; ++k) s += (double)A[ta ? k * lda + i : i * lda + k] * B[tb ? j * ldb + k : k * ldb + j];
            double want = 0.5 * s + 2.0 * C0[i * N + j];
            EXPECT_NEAR(C[i * N + j], want, tol * (1 + std::fabs(want))) << "ta " << ta << " tb " << tb << " p " << (int)p;
          }
      }
}

TEST(Gemm, Bf16RoundsInputs) {
  // 1 + 2^-10 is not representable in bf16 (8 bits of mantissa): the product must see 1.0.
  float a = 1.0f + 1.0f / 1024, b = 1.0f, c = 0;
  gemm(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1, Precision::bf16);
  EXPECT_EQ(c, 1.0f);
  gemm(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1, Precision::fp32);
  EXPECT_EQ(c, a);
}

TEST(Gemm, Fp16OverflowsToInf) {
  float a = 1e5f, b = 1.0f, c = 0;
  gemm(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1, Precision::fp16);
  EXPECT_TRUE(std::isinf(c));
  EXPECT_FALSE(all_finite(&c, 1));
}

TEST(Encoder, ForwardAndBackward) {
  const int B = 2, T = 5, C = 6, V = 11;
  std::vector<int32_t> tok = {3, 0, 10, 3, 7, 1, 1, 2, 9, 4};
  Vec wte = randn(V * C, 4), wpe = randn(T * C, 5), R = randn(B * T * C, 6), out(B * T * C);
  encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c) EXPECT_FLOAT_EQ(out[bt * C + c], wte[tok[bt] * C + c] + wpe[(bt % T) * C + c]);
  Vec dwte(V * C), dwpe(T * C);
  encoder_backward(dwte.data(), dwpe.data(), R.data(), tok.data(), B, T, C);
  auto L = [&] { encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C); return dot(out, R); };
  fd_check("encoder dwte", wte, dwte, L, 1e-2f, 1e-3, 1e-3);
  fd_check("encoder dwpe", wpe, dwpe, L, 1e-2f, 1e-3, 1e-3);
}

TEST(LayerNorm, ForwardAndBackward) {
  const int N = 7, C = 12;
  Vec x = randn(N * C, 7), w = randn(C, 8), b = randn(C, 9), R = randn(N * C, 10), out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  for (int i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[i * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
    v /= C;
    for (int c = 0; c < C; ++c)
      EXPECT_NEAR(out[i * C + c], (x[i * C + c] - m) / std::sqrt(v + 1e-5) * w[c] + b[c], 1e-5);
  }
  Vec dx(N * C), dw(C), db(C);
  layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  auto L = [&] { layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C); return dot(out, R); };
  fd_check("layernorm dinp", x, dx, L, 1e-2f, 3e-3, 2e-2);
  fd_check("layernorm dweight", w, dw, L, 1e-2f, 3e-3, 2e-2);
  fd_check("layernorm dbias", b, db, L, 1e-2f, 3e-3, 2e-2);
}

TEST(Matmul, ForwardAndBackward) {
  const int N = 6, C = 5, OC = 7;
  Vec x = randn(N * C, 11), w = randn(OC * C, 12), b = randn(OC, 13), R = randn(N * OC, 14), out(N * OC);
  matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
  for (int i = 0; i < N; ++i)
    for (int o = 0; o < OC; ++o) {
      double s = b[o];
      for (int c = 0; c < C; ++c) s += (double)x[i * C + c] * w[o * C + c];
      EXPECT_NEAR(out[i * OC + o], s, 1e-5);
    }
  Vec dx(N * C), dw(OC * C), db(OC);
  matmul_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, C, OC);
  auto L = [&] { matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC); return dot(out, R); };
  fd_check("matmul dinp", x, dx, L, 1e-2f, 2e-3, 5e-3);
  fd_check("matmul dweight", w, dw, L, 1e-2f, 2e-3, 5e-3);
  fd_check("matmul dbias", b, db, L, 1e-2f, 2e-3, 5e-3);
}

TEST(Attention, ForwardAndBackward) {
  const int B = 2, T = 5, C = 12, NH = 3, HS = C / NH;
  Vec qkv = randn(B * T * 3 * C, 15, 0.7f), R = randn(B * T * C, 16), out(B * T * C), att(B * NH * T * T);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  // scalar reference
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> p(T, 0.0);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double s = 0;
          for (int d = 0; d < HS; ++d) s += (double)qkv[(b * T + t) * 3 * C + h * HS + d] * qkv[(b * T + j) * 3 * C + C + h * HS + d];
          p[j] = s / std::sqrt((double)HS);
          mx = std::max(mx, p[j]);
        }
        double z = 0;
        for (int j = 0; j <= t; ++j) z += (p[j] = std::exp(p[j] - mx));
        for (int d = 0; d < HS; ++d) {
          double o = 0;
          for (int j = 0; j <= t; ++j) o += p[j] / z * qkv[(b * T + j) * 3 * C + 2 * C + h * HS + d];
          EXPECT_NEAR(out[(b * T + t) * C + h * HS + d], o, 1e-5);
        }
        for (int j = t + 1; j < T; ++j) EXPECT_EQ(att[((b * NH + h) * T + t) * T + j], 0.0f);
      }
  Vec dqkv(B * T * 3 * C);
  attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  auto L = [&] { attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH); return dot(out, R); };
  fd_check("attention dqkv", qkv, dqkv, L, 1e-2f, 3e-3, 2e-2);
}

TEST(Gelu, ForwardAndBackward) {
  const size_t n = 37;
  Vec x = randn(n, 17, 2.0f), R = randn(n, 18), out(n), dx(n);
  gelu_forward(out.data(), x.data(), n);
  for (size_t i = 0; i < n; ++i) {
    double v = x[i];
    EXPECT_NEAR(out[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-5);
  }
  gelu_backward(dx.data(), x.data(), R.data(), n);
  auto L = [&] { gelu_forward(out.data(), x.data(), n); return dot(out, R); };
  fd_check("gelu dinp", x, dx, L, 1e-2f, 2e-3, 1e-2);
}

TEST(Residual, Forward) {
  Vec a = randn(9, 19), b = randn(9, 20), out(9);
  residual_forward(out.data(), a.data(), b.data(), 9);
  for (int i = 0; i < 9; ++i) EXPECT_FLOAT_EQ(out[i], a[i] + b[i]);
}

TEST(SoftmaxCrossEntropy, ForwardAndBackwardWithPaddingAndIgnore) {
  const int N = 4, V = 17, Vp = 20;
  Vec logits = randn(N * Vp, 21, 2.0f);
  std::vector<int32_t> tgt = {3, 16, -1, 0};
  const float dloss = 0.7f;
  Vec work = logits, losses(N);
  softmax_cross_entropy(work.data(), losses.data(), tgt.data(), dloss, N, V, Vp);
  for (int i = 0; i < N; ++i) {
    if (tgt[i] < 0) {
      EXPECT_EQ(losses[i], 0.0f);
      for (int j = 0; j < Vp; ++j) EXPECT_EQ(work[i * Vp + j], 0.0f);
      continue;
    }
    double mx = -1e300, z = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, (double)logits[i * Vp + j]);
    for (int j = 0; j < V; ++j) z += std::exp(logits[i * Vp + j] - mx);
    EXPECT_NEAR(losses[i], -(logits[i * Vp + tgt[i]] - mx - std::log(z)), 1e-5);
    for (int j = V; j < Vp; ++j) EXPECT_EQ(work[i * Vp + j], 0.0f) << "padding column " << j;
  }
  // FD of dloss * sum(losses) with respect to the real (non-padding) logits
  Vec grad = work;
  auto L = [&] {
    Vec w = logits, l(N);
    softmax_cross_entropy(w.data(), l.data(), tgt.data(), dloss, N, V, Vp);
    double s = 0;
    for (float x : l) s += x;
    return dloss * s;
  };
  fd_check("softmax_cross_entropy dlogits", logits, grad, L, 1e-2f, 3e-3, 2e-2);
}

TEST(AdamW, MatchesScalarReferenceOverThreeSteps) {
  const size_t n = 13;
  Vec p = randn(n, 22), m(n), v(n), ref = p;
  std::vector<double> rm(n, 0), rv(n, 0);
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
  for (int step = 1; step <= 3; ++step) {
    Vec g = randn(n, 100 + step);
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, step, gs);
    for (size_t i = 0; i < n; ++i) {
      double gi = (double)g[i] * gs;
      rm[i] = b1 * rm[i] + (1 - b1) * gi;
      rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
      double mh = rm[i] / (1 - std::pow((double)b1, step)), vh = rv[i] / (1 - std::pow((double)b2, step));
      ref[i] = (float)(ref[i] - lr * (mh / (std::sqrt(vh) + eps) + wd * ref[i]));
    }
  }
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], ref[i], 1e-6);
}

TEST(Reductions, SumOfSquaresAndFinite) {
  Vec x = {1, -2, 3};
  EXPECT_DOUBLE_EQ(sum_of_squares(x.data(), 3), 14.0);
  EXPECT_TRUE(all_finite(x.data(), 3));
  x[1] = NAN;
  EXPECT_FALSE(all_finite(x.data(), 3));
  Vec y = {2, 4};
  scale(y.data(), 0.5f, 2);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 2.0f);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  BackendScope backend;
  return RUN_ALL_TESTS();
}
