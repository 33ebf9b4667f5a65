// Unit tests of hpct::kernels: every forward against a scalar double-precision reference written
// here, every backward against central finite differences.
//
// What it is: the correctness net under the CPU kernels, with small odd sizes (B=2, T=5, C=12,
// NH=3, V=17, Vp=20) so that a swapped index or stride shows up. What it is not: a benchmark.
// Trade-off: the finite differences run the DOUBLE reference forward (eps = 1e-3), so their own
// error (~eps^2 truncation, ~1e-13 rounding) is far below fp32's, and the tolerances below measure
// the fp32 kernels alone; the price is a second implementation of every op, kept naive on purpose.
//
// The loss for a backward check is L = sum(out * R) with a fixed random R, so dL/dout = R is what
// the backward receives. Gradients start from random values, not zero: the kernels must ADD.
//
// Tolerances, |kernel - reference| <= atol + rtol * |reference|; "headroom" is tolerance / worst
// error seen on this machine (recorded per check as a test property in --gtest_output=json):
//   check                                 atol     rtol     headroom  why this size
//   gemm fp32                             1e-5     1e-5     x39       K <= 9 products, fp32 sums
//   gemm bf16/fp16 vs rounded inputs      1e-5     1e-5     x113      products of rounded values are
//                                                                     exact in fp32, only sums round
//   gemm bf16/fp16 vs exact inputs        2u * alpha * sum|a||b|      the rounding of both factors,
//                                         (u = 2^-8 bf16, 2^-11 fp16) a hard bound
//   encoder fwd / bwd                     1e-6     1e-6     x5        one fp32 add per element
//   layernorm fwd (out, mean, rstd)       1e-5     1e-5     x18       fp32 sums over C
//   layernorm bwd (dinp, dw, db)          1e-5     1e-5     x4        dw/db sum 150 rows in fp32
//   matmul fwd / bwd (fp32)               1e-5     1e-5     x39       sgemm, K <= 13
//   matmul bf16 / fp16 vs fp32 matmul     1e-2 / 2e-3 of max|ref|   x3 / x5   input rounding
//   attention fwd (out)                   1e-6     1e-6     x13       exp_simd is ~1.5 ulp
//   attention probabilities               1e-6     1e-5     x48
//   attention bwd (dqkv)                  2e-6     2e-6     x11       GEMM chains through softmax
//   attention bf16 / fp16 vs fp32         1.5e-2 / 2e-3 of max|ref| x4 / x4   input rounding
//   gelu fwd / bwd                        1e-6     1e-5     x13       exp_simd instead of tanh
//   softmax_cross_entropy loss / dlogits  1e-6     1e-6     x37       double normaliser
//   adamw (3 steps)                       1e-6     1e-5     x112      fp32 update of O(1) values
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/ops.hpp"
#include "hpct/kernels/optim.hpp"

using namespace hpct::kernels;

namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

// BackendScope alive for the whole test program, as an application's main would hold it.
class KernelEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { scope_ = std::make_unique<BackendScope>(); }
  void TearDown() override { scope_.reset(); }

 private:
  std::unique_ptr<BackendScope> scope_;
};
[[maybe_unused]] const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new KernelEnvironment);

Vec randn(size_t n, uint64_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(mean, stddev);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}
DVec to_double(const Vec& v) { return DVec(v.begin(), v.end()); }
double dot(const DVec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences in double of loss(x) at every `stride`-th element (others NaN = unchecked).
DVec numeric_grad(DVec x, const std::function<double(const DVec&)>& loss, size_t stride = 1, double eps = 1e-3) {
  DVec g(x.size(), std::nan(""));
  for (size_t i = 0; i < x.size(); i += stride) {
    const double keep = x[i];
    x[i] = keep + eps;
    const double lp = loss(x);
    x[i] = keep - eps;
    const double lm = loss(x);
    x[i] = keep;
    g[i] = (lp - lm) / (2 * eps);
  }
  return g;
}

// Checks got[i] against want[i] (NaN in want: not checked) and reports the worst miss.
void expect_near_all(const std::string& what, const Vec& got, const DVec& want, double atol, double rtol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  size_t checked = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) continue;
    ++checked;
    const double err = std::fabs(got[i] - want[i]);
    worst = std::max(worst, err / (atol + rtol * std::fabs(want[i])));
    if (!(err <= atol + rtol * std::fabs(want[i])) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (error " << err << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << checked << " out of tolerance";
  EXPECT_GT(checked, 0u) << what;
  ::testing::Test::RecordProperty(what + "_worst_error_over_tolerance", std::to_string(worst));
}

// Gradient check: the kernel added (after - before) to a gradient that held `before`.
void expect_grad(const std::string& what, const Vec& after, const Vec& before, const DVec& fd, double atol,
                 double rtol) {
  Vec added(after.size());
  for (size_t i = 0; i < after.size(); ++i) added[i] = after[i] - before[i];
  expect_near_all(what, added, fd, atol, rtol);
}

// ---- scalar double references -------------------------------------------------------------

DVec ref_gemm(bool ta, bool tb, int M, int N, int K, double alpha, const DVec& A, int lda, const DVec& B, int ldb,
              double beta, const DVec& C, int ldc) {
  DVec out = C;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += A[ta ? k * lda + i : i * lda + k] * B[tb ? j * ldb + k : k * ldb + j];
      out[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * C[i * ldc + j]);
    }
  return out;
}

DVec ref_encoder(const DVec& wte, const DVec& wpe, const std::vector<int32_t>& tok, int B, int T, int C) {
  DVec out((size_t)B * T * C);
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c) out[bt * C + c] = wte[tok[bt] * C + c] + wpe[(bt % T) * C + c];
  return out;
}

DVec ref_layernorm(const DVec& x, const DVec& w, const DVec& b, int N, int C, DVec* mean = nullptr,
                   DVec* rstd = nullptr) {
  DVec out((size_t)N * C);
  for (int i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[i * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
    v /= C;
    const double rs = 1 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c) out[i * C + c] = (x[i * C + c] - m) * rs * w[c] + b[c];
    if (mean) (*mean)[i] = m;
    if (rstd) (*rstd)[i] = rs;
  }
  return out;
}

DVec ref_matmul(const DVec& x, const DVec& w, const DVec* bias, int N, int C, int OC) {
  DVec out((size_t)N * OC);
  for (int i = 0; i < N; ++i)
    for (int o = 0; o < OC; ++o) {
      double s = bias ? (*bias)[o] : 0.0;
      for (int c = 0; c < C; ++c) s += x[i * C + c] * w[o * C + c];
      out[i * OC + o] = s;
    }
  return out;
}

DVec ref_attention(const DVec& qkv, int B, int T, int C, int NH, DVec* att = nullptr) {
  const int HS = C / NH;
  DVec out((size_t)B * T * C);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        DVec p(T, 0.0);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double s = 0;
          for (int d = 0; d < HS; ++d)
            s += qkv[(b * T + t) * 3 * C + h * HS + d] * qkv[(b * T + j) * 3 * C + C + h * HS + d];
          p[j] = s / std::sqrt((double)HS);
          mx = std::max(mx, p[j]);
        }
        double z = 0;
        for (int j = 0; j <= t; ++j) z += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j <= t; ++j) p[j] /= z;
        for (int d = 0; d < HS; ++d) {
          double o = 0;
          for (int j = 0; j <= t; ++j) o += p[j] * qkv[(b * T + j) * 3 * C + 2 * C + h * HS + d];
          out[(b * T + t) * C + h * HS + d] = o;
        }
        if (att)
          for (int j = 0; j < T; ++j) (*att)[((size_t)(b * NH + h) * T + t) * T + j] = p[j];
      }
  return out;
}

double ref_gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

DVec ref_cross_entropy(const DVec& logits, const std::vector<int32_t>& tgt, int N, int V, int Vp) {
  DVec loss(N, 0.0);
  for (int i = 0; i < N; ++i) {
    if (tgt[i] < 0) continue;
    double mx = -1e300, z = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, logits[i * Vp + j]);
    for (int j = 0; j < V; ++j) z += std::exp(logits[i * Vp + j] - mx);
    loss[i] = std::log(z) - (logits[i * Vp + tgt[i]] - mx);
  }
  return loss;
}

// Independent bit-level roundings for the gemm checks (round to nearest even).
float round_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xffff0000u);
}
float round_fp16(float f) { return (float)(ieee_half)f; }

}  // namespace

// ---- backend ---------------------------------------------------------------------------------

TEST(Backend, DescriptionAndNestedScopes) {
  const std::string d = backend_description();
  EXPECT_NE(d.find("Kokkos"), std::string::npos) << d;
  EXPECT_NE(d.find("OpenBLAS"), std::string::npos) << d;
  RecordProperty("backend", d);
  std::printf("backend: %s\n", d.c_str());
  { BackendScope inner; }  // ref-counted: the environment's scope keeps Kokkos alive
  Vec x = {1, 2};
  scale(x.data(), 2.0f, 2);
  EXPECT_EQ(x[1], 4.0f);
}

// ---- gemm ------------------------------------------------------------------------------------

TEST(Gemm, AllTransposesAndPrecisionsWithPaddedStrides) {
  const int M = 7, N = 5, K = 9, pad = 3;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
        const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
        const Vec A = randn((size_t)(ta ? K : M) * lda, 1), B = randn((size_t)(tb ? N : K) * ldb, 2);
        const Vec C0 = randn((size_t)M * ldc, 3);
        Vec C = C0;
        gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), ldc, p);
        const std::string what = std::string("gemm ") + (ta ? "T" : "N") + (tb ? "T" : "N") + " " + precision_name(p);
        // Against the reference on the same rounded inputs: tight.
        auto round = [p](const Vec& v) {
          DVec r(v.size());
          for (size_t i = 0; i < v.size(); ++i)
            r[i] = p == Precision::bf16 ? round_bf16(v[i]) : p == Precision::fp16 ? round_fp16(v[i]) : v[i];
          return r;
        };
        DVec want = ref_gemm(ta, tb, M, N, K, 0.5, round(A), lda, round(B), ldb, 2.0, to_double(C0), ldc);
        // Padding columns of C must be untouched.
        for (int i = 0; i < M; ++i)
          for (int j = N; j < ldc; ++j) want[i * ldc + j] = C0[i * ldc + j];
        expect_near_all(what + " vs rounded inputs", C, want, 1e-5, 1e-5);
        // Against exact inputs: the error is what rounding both factors of each product allows,
        // 2u * alpha * sum |a||b| (unit roundoff u = 2^-8 for bf16, 2^-11 for fp16), no more.
        const DVec exact = ref_gemm(ta, tb, M, N, K, 0.5, to_double(A), lda, to_double(B), ldb, 2.0, to_double(C0), ldc);
        DVec absA(A.size()), absB(B.size());
        for (size_t i = 0; i < A.size(); ++i) absA[i] = std::fabs(A[i]);
        for (size_t i = 0; i < B.size(); ++i) absB[i] = std::fabs(B[i]);
        const DVec mag = ref_gemm(ta, tb, M, N, K, 0.5, absA, lda, absB, ldb, 0.0, DVec(C0.size(), 0.0), ldc);
        const double u = p == Precision::fp32 ? 0.0 : p == Precision::bf16 ? 0x1p-8 : 0x1p-11;
        int bad = 0;
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < N; ++j) {
            const double bound = 2.01 * u * mag[i * ldc + j] + 1e-5 * (1 + std::fabs(exact[i * ldc + j]));
            if (!(std::fabs(C[i * ldc + j] - exact[i * ldc + j]) <= bound) && bad++ < 3)
              ADD_FAILURE() << what << " vs exact inputs at (" << i << "," << j << "): got " << C[i * ldc + j]
                            << ", want " << exact[i * ldc + j] << " +- " << bound;
          }
      }
}

TEST(Gemm, Bf16RoundsToNearestEven) {
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is a tie that rounds to even (1.0); 1 + 3 * 2^-8 is a tie
  // that rounds up to 1 + 2^-6 (truncation would give 1 + 2^-7); 1 + 2^-8 + 2^-20 rounds up.
  const float b = 1.0f;
  const std::pair<float, float> cases[] = {{1.0f + 0x1p-8f, 1.0f},
                                           {1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},
                                           {1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f},
                                           {-(1.0f + 3 * 0x1p-8f), -(1.0f + 0x1p-6f)}};
  for (auto [a, want] : cases) {
    float c = 0;
    gemm(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1, Precision::bf16);
    EXPECT_EQ(c, want) << "a = " << a;
    gemm(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1, Precision::fp32);
    EXPECT_EQ(c, a);
  }
}

TEST(Gemm, Fp16RoundsAndOverflowsToInf) {
  const float one = 1.0f;
  float c = 0;
  float a = 1.0f + 0x1p-11f;  // a tie in half (10 mantissa bits): rounds to even, 1.0
  gemm(false, false, 1, 1, 1, 1.0f, &a, 1, &one, 1, 0.0f, &c, 1, Precision::fp16);
  EXPECT_EQ(c, 1.0f);
  a = 65504.0f;  // the largest half
  gemm(false, false, 1, 1, 1, 1.0f, &a, 1, &one, 1, 0.0f, &c, 1, Precision::fp16);
  EXPECT_EQ(c, 65504.0f);
  // 1e5-valued inputs are beyond half's range: the product must be inf, and all_finite must see it.
  Vec A(4 * 3, 1e5f), B(3 * 2, 1.0f), C(4 * 2, 0.0f);
  gemm(false, false, 4, 2, 3, 1.0f, A.data(), 3, B.data(), 2, 0.0f, C.data(), 2, Precision::fp16);
  for (float x : C) EXPECT_TRUE(std::isinf(x)) << x;
  EXPECT_FALSE(all_finite(C.data(), C.size()));
  gemm(false, false, 4, 2, 3, 1.0f, A.data(), 3, B.data(), 2, 0.0f, C.data(), 2, Precision::fp32);
  EXPECT_TRUE(all_finite(C.data(), C.size()));
}

TEST(Gemm, BetaZeroIgnoresGarbageAndStridesAreNotConfused) {
  // beta = 0 must overwrite C even if it holds NaN; and the same (M, N, K) with another ldc must
  // not reuse a cached oneDNN primitive built for the first ldc.
  const int M = 4, N = 3, K = 5;
  const Vec A = randn(M * K, 30), B = randn(K * N, 31);
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    for (int ldc : {N, N + 2}) {
      Vec C((size_t)M * ldc, std::nanf(""));
      gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), ldc, p);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) EXPECT_TRUE(std::isfinite(C[i * ldc + j])) << precision_name(p) << " ldc " << ldc;
      for (int i = 0; i < M; ++i)
        for (int j = N; j < ldc; ++j) EXPECT_TRUE(std::isnan(C[i * ldc + j])) << "padding written, ldc " << ldc;
    }
}

TEST(Gemm, BadArgumentsThrow) {
  Vec A(20), B(20), C(20);
  EXPECT_THROW(gemm(false, false, 4, 4, 4, 1, A.data(), 3, B.data(), 4, 0, C.data(), 4), hpct::Error);  // lda < K
  EXPECT_THROW(gemm(false, true, 4, 4, 4, 1, A.data(), 4, B.data(), 3, 0, C.data(), 4), hpct::Error);   // ldb < K
  EXPECT_THROW(gemm(false, false, 4, 4, 4, 1, A.data(), 4, B.data(), 4, 0, C.data(), 3), hpct::Error);  // ldc < N
  EXPECT_THROW(gemm(false, false, -1, 4, 4, 1, A.data(), 4, B.data(), 4, 0, C.data(), 4), hpct::Error);
  // K = 0 is an empty sum: C = beta * C.
  Vec D = {1, 2, 3, 4};
  gemm(false, false, 2, 2, 0, 1, nullptr, 1, nullptr, 2, 0.5f, D.data(), 2);
  EXPECT_EQ(D, (Vec{0.5f, 1, 1.5f, 2}));
}

// ---- encoder ---------------------------------------------------------------------------------

TEST(Encoder, ForwardAndBackward) {
  const int B = 2, T = 5, C = 12, V = 17, maxT = 7;  // maxT > T: rows of wpe past T get no gradient
  const std::vector<int32_t> tok = {3, 0, 16, 3, 7, 1, 1, 2, 9, 3};
  const Vec wte = randn(V * C, 4), wpe = randn(maxT * C, 5), R = randn(B * T * C, 6);
  Vec out(B * T * C);
  encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  expect_near_all("encoder out", out, ref_encoder(to_double(wte), to_double(wpe), tok, B, T, C), 1e-6, 1e-6);

  const Vec dwte0 = randn(V * C, 7), dwpe0 = randn(maxT * C, 8);
  Vec dwte = dwte0, dwpe = dwpe0;
  encoder_backward(dwte.data(), dwpe.data(), R.data(), tok.data(), B, T, C);
  const DVec dwte_fd = numeric_grad(to_double(wte), [&](const DVec& w) {
    return dot(ref_encoder(w, to_double(wpe), tok, B, T, C), R);
  });
  const DVec dwpe_fd = numeric_grad(to_double(wpe), [&](const DVec& w) {
    return dot(ref_encoder(to_double(wte), w, tok, B, T, C), R);
  });
  expect_grad("encoder dwte", dwte, dwte0, dwte_fd, 1e-6, 1e-6);
  expect_grad("encoder dwpe", dwpe, dwpe0, dwpe_fd, 1e-6, 1e-6);
  // No dwte (a frozen word embedding): dwpe alone, the same sums, with and without given positions.
  const std::vector<int32_t> pos = {0, 1, 2, 3, 4, 0, 1, 0, 1, 2};
  for (const int32_t* p : {(const int32_t*)nullptr, pos.data()}) {
    Vec full_te = dwte0, full_pe = dwpe0, alone = dwpe0;
    encoder_backward(full_te.data(), full_pe.data(), R.data(), tok.data(), B, T, C, p);
    encoder_backward(nullptr, alone.data(), R.data(), tok.data(), B, T, C, p);
    EXPECT_EQ(alone, full_pe) << (p ? "positions given" : "positions 0..T-1");
  }

  std::vector<int32_t> bad = tok;
  bad[4] = -2;
  EXPECT_THROW(encoder_forward(out.data(), bad.data(), wte.data(), wpe.data(), B, T, C), hpct::Error);
  EXPECT_THROW(encoder_backward(dwte.data(), dwpe.data(), R.data(), bad.data(), B, T, C), hpct::Error);
}

// ---- layernorm -------------------------------------------------------------------------------

TEST(LayerNorm, ForwardAndBackward) {
  const int N = 10, C = 12;
  // A mean far from 0 and a small spread exercise the two-pass variance.
  const Vec x = randn(N * C, 9, 0.7f, 3.0f), w = randn(C, 10), b = randn(C, 11), R = randn(N * C, 12);
  Vec out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  DVec rmean(N), rrstd(N);
  expect_near_all("layernorm out", out, ref_layernorm(to_double(x), to_double(w), to_double(b), N, C, &rmean, &rrstd),
                  1e-5, 1e-5);
  expect_near_all("layernorm mean", mean, rmean, 1e-5, 1e-5);
  expect_near_all("layernorm rstd", rstd, rrstd, 1e-5, 1e-5);

  const Vec dx0 = randn(N * C, 13), dw0 = randn(C, 14), db0 = randn(C, 15);
  Vec dx = dx0, dw = dw0, db = db0;
  layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  const DVec xd = to_double(x), wd = to_double(w), bd = to_double(b);
  expect_grad("layernorm dinp", dx, dx0,
              numeric_grad(xd, [&](const DVec& v) { return dot(ref_layernorm(v, wd, bd, N, C), R); }), 1e-5, 1e-5);
  expect_grad("layernorm dweight", dw, dw0,
              numeric_grad(wd, [&](const DVec& v) { return dot(ref_layernorm(xd, v, bd, N, C), R); }), 1e-5, 1e-5);
  expect_grad("layernorm dbias", db, db0,
              numeric_grad(bd, [&](const DVec& v) { return dot(ref_layernorm(xd, wd, v, N, C), R); }), 1e-5, 1e-5);
}

TEST(LayerNorm, BackwardOverManyRowChunks) {
  // More rows than one partial-sum chunk holds, so dweight/dbias are summed across chunks.
  const int N = 150, C = 20;
  const Vec x = randn(N * C, 16), w = randn(C, 17), b = randn(C, 18), R = randn(N * C, 19);
  Vec out(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  const DVec xd = to_double(x), wd = to_double(w), bd = to_double(b);
  const Vec zero(C, 0.0f);
  expect_grad("layernorm dweight (chunks)", dw, zero,
              numeric_grad(wd, [&](const DVec& v) { return dot(ref_layernorm(xd, v, bd, N, C), R); }), 1e-5, 1e-5);
  expect_grad("layernorm dbias (chunks)", db, zero,
              numeric_grad(bd, [&](const DVec& v) { return dot(ref_layernorm(xd, wd, v, N, C), R); }), 1e-5, 1e-5);
}

// ---- matmul ----------------------------------------------------------------------------------

TEST(Matmul, ForwardAndBackward) {
  const int N = 10, C = 12, OC = 13;
  const Vec x = randn(N * C, 20), w = randn(OC * C, 21), b = randn(OC, 22), R = randn(N * OC, 23);
  const DVec xd = to_double(x), wd = to_double(w), bd = to_double(b);
  Vec out(N * OC, std::nanf(""));  // forward must not read out
  matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
  expect_near_all("matmul out", out, ref_matmul(xd, wd, &bd, N, C, OC), 1e-5, 1e-5);
  matmul_forward(out.data(), x.data(), w.data(), nullptr, N, C, OC);
  expect_near_all("matmul out (no bias)", out, ref_matmul(xd, wd, nullptr, N, C, OC), 1e-5, 1e-5);

  const Vec dx0 = randn(N * C, 24), dw0 = randn(OC * C, 25), db0 = randn(OC, 26);
  Vec dx = dx0, dw = dw0, db = db0;
  matmul_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, C, OC);
  expect_grad("matmul dinp", dx, dx0,
              numeric_grad(xd, [&](const DVec& v) { return dot(ref_matmul(v, wd, &bd, N, C, OC), R); }), 1e-5, 1e-5);
  expect_grad("matmul dweight", dw, dw0,
              numeric_grad(wd, [&](const DVec& v) { return dot(ref_matmul(xd, v, &bd, N, C, OC), R); }), 1e-5, 1e-5);
  expect_grad("matmul dbias", db, db0,
              numeric_grad(bd, [&](const DVec& v) { return dot(ref_matmul(xd, wd, &v, N, C, OC), R); }), 1e-5, 1e-5);

  // dinp and dbias may be skipped; dweight must come out the same.
  Vec dw2 = dw0;
  matmul_backward(nullptr, dw2.data(), nullptr, R.data(), x.data(), w.data(), N, C, OC);
  EXPECT_EQ(dw2, dw);
}

TEST(Matmul, LowPrecisionStaysCloseToFp32) {
  const int N = 33, C = 24, OC = 40;
  const Vec x = randn(N * C, 27), w = randn(OC * C, 28, 0.2f), b = randn(OC, 29), R = randn(N * OC, 30);
  Vec ref(N * OC), dx_ref(N * C), dw_ref(OC * C), db_ref(OC);
  matmul_forward(ref.data(), x.data(), w.data(), b.data(), N, C, OC);
  matmul_backward(dx_ref.data(), dw_ref.data(), db_ref.data(), R.data(), x.data(), w.data(), N, C, OC);
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    const double tol = p == Precision::bf16 ? 1e-2 : 2e-3;  // relative to the output scale
    Vec out(N * OC), dx(N * C), dw(OC * C), db(OC);
    matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC, p);
    matmul_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, C, OC, p);
    auto scale_of = [](const Vec& v) {
      double m = 0;
      for (float e : v) m = std::max(m, (double)std::fabs(e));
      return m;
    };
    const std::string name = precision_name(p);
    expect_near_all("matmul out " + name, out, to_double(ref), tol * scale_of(ref), 0);
    expect_near_all("matmul dinp " + name, dx, to_double(dx_ref), tol * scale_of(dx_ref), 0);
    expect_near_all("matmul dweight " + name, dw, to_double(dw_ref), tol * scale_of(dw_ref), 0);
    EXPECT_EQ(db, db_ref) << "dbias is summed in fp32 whatever the GEMM precision";
  }
}

// ---- attention -------------------------------------------------------------------------------

namespace {
// Forward against the reference (out and the saved probabilities), backward against FD of the
// reference at every `stride`-th entry of qkv.
void check_attention(int B, int T, int C, int NH, size_t stride, uint64_t seed) {
  const Vec qkv = randn((size_t)B * T * 3 * C, seed, 0.8f), R = randn((size_t)B * T * C, seed + 1);
  const DVec qkvd = to_double(qkv);
  Vec out((size_t)B * T * C), att((size_t)B * NH * T * T, std::nanf(""));
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  DVec ratt(att.size());
  const std::string tag = " (T=" + std::to_string(T) + ")";
  expect_near_all("attention out" + tag, out, ref_attention(qkvd, B, T, C, NH, &ratt), 1e-6, 1e-6);
  expect_near_all("attention probabilities" + tag, att, ratt, 1e-6, 1e-5);  // includes the zero upper triangle

  const Vec dqkv0 = randn(qkv.size(), seed + 2);
  Vec dqkv = dqkv0;
  attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_grad("attention dqkv" + tag, dqkv, dqkv0,
              numeric_grad(qkvd, [&](const DVec& v) { return dot(ref_attention(v, B, T, C, NH), R); }, stride), 2e-6,
              2e-6);
}
}  // namespace

TEST(Attention, ForwardAndBackward) { check_attention(2, 5, 12, 3, 1, 31); }

TEST(Attention, LongerThanOneCausalBlock) {
  // T beyond the 128-row causal block: later blocks see all earlier keys. Every 13th entry of qkv
  // (q, k and v of tokens in both blocks) is checked against finite differences.
  check_attention(1, 150, 12, 3, 13, 41);
}

TEST(Attention, LowPrecisionStaysCloseToFp32) {
  const int B = 2, T = 9, C = 16, NH = 2;
  const Vec qkv = randn((size_t)B * T * 3 * C, 51), R = randn((size_t)B * T * C, 52);
  Vec ref((size_t)B * T * C), att((size_t)B * NH * T * T), dref(qkv.size());
  attention_forward(ref.data(), att.data(), qkv.data(), B, T, C, NH);
  attention_backward(dref.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    const double tol = p == Precision::bf16 ? 1.5e-2 : 2e-3;  // relative to the largest value
    Vec out(ref.size()), d(dref.size());
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, p);
    attention_backward(d.data(), R.data(), qkv.data(), att.data(), B, T, C, NH, p);
    double mo = 0, md = 0;
    for (float e : ref) mo = std::max(mo, (double)std::fabs(e));
    for (float e : dref) md = std::max(md, (double)std::fabs(e));
    expect_near_all(std::string("attention out ") + precision_name(p), out, to_double(ref), tol * mo, 0);
    expect_near_all(std::string("attention dqkv ") + precision_name(p), d, to_double(dref), tol * md, 0);
  }
}

TEST(Attention, HeadsMustDivideChannels) {
  Vec qkv(3 * 10), out(10), att(4);
  EXPECT_THROW(attention_forward(out.data(), att.data(), qkv.data(), 1, 1, 10, 3), hpct::Error);
  EXPECT_THROW(attention_backward(qkv.data(), out.data(), qkv.data(), att.data(), 1, 1, 10, 3), hpct::Error);
}

// ---- gelu, residual --------------------------------------------------------------------------

TEST(Gelu, ForwardAndBackward) {
  // Spread wide (tails near +-10 and values near 0) and an odd length (a SIMD remainder).
  Vec x = randn(37, 32, 3.0f);
  x[0] = 0.0f;
  x[1] = 1e-4f;
  x[2] = -9.5f;
  x[3] = 12.0f;
  const size_t n = x.size();
  const Vec R = randn(n, 33);
  Vec out(n);
  gelu_forward(out.data(), x.data(), n);
  DVec want(n);
  for (size_t i = 0; i < n; ++i) want[i] = ref_gelu(x[i]);
  expect_near_all("gelu out", out, want, 1e-6, 1e-5);

  const Vec dx0 = randn(n, 34);
  Vec dx = dx0;
  gelu_backward(dx.data(), x.data(), R.data(), n);
  expect_grad("gelu dinp", dx, dx0, numeric_grad(to_double(x), [&](const DVec& v) {
                double s = 0;
                for (size_t i = 0; i < n; ++i) s += ref_gelu(v[i]) * R[i];
                return s;
              }),
              1e-6, 1e-5);
}

TEST(Gelu, LongBuffersCrossChunks) {
  // Longer than one SIMD chunk: every element must be computed exactly once.
  const size_t n = 20000 + 7;
  const Vec x = randn(n, 35, 2.0f);
  Vec out(n, std::nanf("")), dx(n, 0.0f);
  const Vec ones(n, 1.0f);
  gelu_forward(out.data(), x.data(), n);
  gelu_backward(dx.data(), x.data(), ones.data(), n);
  gelu_backward(dx.data(), x.data(), ones.data(), n);  // accumulates: twice the derivative
  for (size_t i = 0; i < n; i += 997) {
    EXPECT_NEAR(out[i], ref_gelu(x[i]), 1e-5 * (1 + std::fabs(ref_gelu(x[i]))));
    const double h = 1e-4, deriv = (ref_gelu(x[i] + h) - ref_gelu(x[i] - h)) / (2 * h);
    EXPECT_NEAR(dx[i], 2 * deriv, 1e-4);
  }
  EXPECT_TRUE(all_finite(out.data(), n));
}

TEST(Residual, ForwardInPlace) {
  const Vec a = randn(9, 36), b = randn(9, 37);
  Vec out(9);
  residual_forward(out.data(), a.data(), b.data(), 9);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  Vec c = b;  // out aliasing an input, as the model does
  residual_forward(c.data(), a.data(), c.data(), 9);
  EXPECT_EQ(c, out);
}

// ---- softmax + cross-entropy -----------------------------------------------------------------

TEST(SoftmaxCrossEntropy, ForwardAndBackwardWithPaddingAndIgnore) {
  const int N = 5, V = 17, Vp = 20;
  Vec logits = randn(N * Vp, 38, 2.0f);
  for (int j = 0; j < Vp; ++j) logits[4 * Vp + j] += 1000.0f;  // a row that overflows without max subtraction
  for (int i = 0; i < N; ++i)
    for (int j = V; j < Vp; ++j) logits[i * Vp + j] = 50.0f;  // padding garbage that must not count
  const std::vector<int32_t> tgt = {3, 16, -1, 0, 9};
  const float dloss = 0.7f;
  Vec work = logits, losses(N, std::nanf(""));
  softmax_cross_entropy(work.data(), losses.data(), tgt.data(), dloss, N, V, Vp);
  const DVec ld = to_double(logits);
  expect_near_all("cross-entropy losses", losses, ref_cross_entropy(ld, tgt, N, V, Vp), 1e-6, 1e-6);
  // dlogits vs FD of dloss * sum(losses), over every column: padding and the ignored row get 0.
  const DVec fd = numeric_grad(ld, [&](const DVec& v) {
    double s = 0;
    for (double l : ref_cross_entropy(v, tgt, N, V, Vp)) s += l;
    return dloss * s;
  });
  expect_near_all("cross-entropy dlogits", work, fd, 1e-6, 1e-6);
  for (int i = 0; i < N; ++i)
    for (int j = V; j < Vp; ++j) EXPECT_EQ(work[i * Vp + j], 0.0f) << "padding column " << j << " of row " << i;
  for (int j = 0; j < Vp; ++j) EXPECT_EQ(work[2 * Vp + j], 0.0f) << "ignored row, column " << j;
  EXPECT_EQ(losses[2], 0.0f);
}

TEST(SoftmaxCrossEntropy, LongRowsAndBadTargets) {
  // A GPT-2-sized row (V = 50257, Vp = 50304) through the SIMD loops: gradient rows sum to 0.
  const int N = 2, V = 50257, Vp = 50304;
  Vec logits = randn((size_t)N * Vp, 39, 3.0f);
  const std::vector<int32_t> tgt = {50256, 17};
  Vec losses(N);
  const DVec want = ref_cross_entropy(to_double(logits), tgt, N, V, Vp);
  softmax_cross_entropy(logits.data(), losses.data(), tgt.data(), 1.0f, N, V, Vp);
  expect_near_all("cross-entropy losses (V=50257)", losses, want, 1e-6, 1e-6);
  for (int i = 0; i < N; ++i) {
    double s = 0;
    for (int j = 0; j < Vp; ++j) s += logits[(size_t)i * Vp + j];
    EXPECT_NEAR(s, 0.0, 1e-4);
  }
  // A target >= V throws before anything is written.
  Vec small = randn(2 * 5, 40), keep = small, l(2);
  const std::vector<int32_t> bad = {1, 4};
  EXPECT_THROW(softmax_cross_entropy(small.data(), l.data(), bad.data(), 1.0f, 2, 4, 5), hpct::Error);
  EXPECT_EQ(small, keep);
  EXPECT_THROW(softmax_cross_entropy(small.data(), l.data(), bad.data(), 1.0f, 2, 6, 5), hpct::Error);  // Vp < V
}

// ---- optimizer and reductions ----------------------------------------------------------------

TEST(AdamW, MatchesScalarReferenceOverThreeSteps) {
  const size_t n = 13;
  Vec p = randn(n, 41), m(n, 0.0f), v(n, 0.0f);
  DVec rp = to_double(p), rm(n, 0), rv(n, 0);
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
  for (int step = 1; step <= 3; ++step) {
    const Vec g = randn(n, 100 + step);
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, step, gs);
    for (size_t i = 0; i < n; ++i) {
      const double gi = (double)g[i] * gs;
      rm[i] = b1 * rm[i] + (1 - b1) * gi;
      rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
      const double mh = rm[i] / (1 - std::pow((double)b1, step)), vh = rv[i] / (1 - std::pow((double)b2, step));
      rp[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * rp[i]);
    }
  }
  expect_near_all("adamw param", p, rp, 1e-6, 1e-5);
  expect_near_all("adamw m", m, rm, 1e-6, 1e-5);
  expect_near_all("adamw v", v, rv, 1e-6, 1e-5);
  EXPECT_THROW(adamw_update(p.data(), p.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, 0, gs), hpct::Error);
}

TEST(Reductions, SumOfSquaresAllFiniteScale) {
  const Vec x = {1, -2, 3};
  EXPECT_DOUBLE_EQ(sum_of_squares(x.data(), 3), 14.0);
  EXPECT_EQ(sum_of_squares(x.data(), 0), 0.0);
  // Long enough for several chunks, accumulated in double: exact for these values.
  Vec big(50001, 0.5f);
  EXPECT_DOUBLE_EQ(sum_of_squares(big.data(), big.size()), 50001 * 0.25);
  EXPECT_TRUE(all_finite(big.data(), big.size()));
  big[40000] = std::numeric_limits<float>::max();  // finite, though its square overflows fp32
  EXPECT_TRUE(all_finite(big.data(), big.size()));
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    big[49999] = bad;
    EXPECT_FALSE(all_finite(big.data(), big.size())) << bad;
    big[49999] = 0.5f;
  }
  EXPECT_TRUE(all_finite(nullptr, 0));
  Vec y = {2, 4, -8};
  scale(y.data(), 0.5f, 3);
  EXPECT_EQ(y, (Vec{1, 2, -4}));
}

// --log-num-zeros-in-grad's count: +0 and -0 count, denormals and NaN do not; 16-bit alike.
TEST(Optim, CountZeros) {
  const std::vector<float> x = {0.0f, -0.0f, 1e-45f, 1.0f, NAN, 0.0f};
  EXPECT_EQ(count_zeros(x.data(), x.size()), 3.0);
  EXPECT_EQ(count_zeros(x.data(), 0), 0.0);
  const std::vector<uint16_t> h = {0x0000, 0x8000, 0x0001, 0x3f80, 0x7fc0, 0x8001};
  EXPECT_EQ(count_zeros_half(h.data(), h.size()), 2.0);
}
