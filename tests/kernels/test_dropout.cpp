// Dropout kernels (kernels/dropout.hpp, ops.hpp): the token-row op and attention dropout.
//
// - The mask: the fraction dropped over 2^18 elements is p within 0.005 (binomial standard
//   deviation sqrt(p(1-p)/n) <= 0.001 at these p: five of them); kept elements are x * fp32(1/(1-p))
//   exactly; p = 0 leaves the buffer bitwise alone.
// - Layout independence: rows processed in two pieces with first_row set (as sequence parallelism
//   does) equal one call over all rows bitwise; another sample or site gives another mask.
// - Attention with dropout: forward against a double reference that uses the same mask bits
//   (|out - ref| <= 1e-6 + 1e-6 |ref|, the plain attention's tolerance: the mask only rescales
//   probabilities by an exact power-free constant); backward against central finite differences of
//   that reference (eps 1e-3, 2e-6 absolute and relative as for the plain attention: the gradient
//   goes through the same GEMM chain); the probabilities kept for backward are the undropped ones.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "hpct/kernels/ops.hpp"

using namespace hpct::kernels;

namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

class Env : public ::testing::Environment {
 public:
  void SetUp() override { scope_ = std::make_unique<BackendScope>(); }
  void TearDown() override { scope_.reset(); }

 private:
  std::unique_ptr<BackendScope> scope_;
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Env);

Vec randn(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

Dropout site(float p, uint64_t key, long long first_sample, int T) {
  Dropout d;
  d.p = p, d.key = key, d.first_sample = first_sample, d.T = T;
  return d;
}

// The double reference of causal attention with dropout on the probabilities (same mask bits).
DVec ref_attention(const DVec& qkv, int B, int T, int C, int NH, const Dropout& d) {
  const int HS = C / NH;
  DVec out((size_t)B * T * C);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        DVec p(T, 0.0);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double s = 0;
          for (int e = 0; e < HS; ++e) s += qkv[(b * T + t) * 3 * C + h * HS + e] * qkv[(b * T + j) * 3 * C + C + h * HS + e];
          p[j] = s / std::sqrt((double)HS);
          mx = std::max(mx, p[j]);
        }
        double z = 0;
        for (int j = 0; j <= t; ++j) z += (p[j] = std::exp(p[j] - mx));
        const uint64_t key = dropout_row_key(d.key, d.first_sample + b, dropout_attention_code(d.head0 + h, t));
        for (int j = 0; j <= t; ++j) p[j] = dropout_keep(key, j, d.threshold()) ? p[j] / z * d.scale() : 0.0;
        for (int e = 0; e < HS; ++e) {
          double o = 0;
          for (int j = 0; j <= t; ++j) o += p[j] * qkv[(b * T + j) * 3 * C + 2 * C + h * HS + e];
          out[(b * T + t) * C + h * HS + e] = o;
        }
      }
  return out;
}

}  // namespace

TEST(Dropout, DropsTheFractionAndRescalesTheRest) {
  const size_t rows = 1 << 12;
  const int C = 64;
  const Vec x = randn(rows * C, 1);
  for (float p : {0.05f, 0.1f, 0.3f, 0.5f, 0.9f}) {
    Vec y = x;
    dropout(y.data(), rows, C, site(p, 11, 0, 128));
    size_t dropped = 0, wrong = 0;
    const float s = 1.0f / (1.0f - p);
    for (size_t i = 0; i < y.size(); ++i) {
      if (y[i] == 0.0f) ++dropped;
      else if (y[i] != x[i] * s) ++wrong;
    }
    EXPECT_NEAR(double(dropped) / y.size(), p, 0.005) << "p=" << p;
    EXPECT_EQ(wrong, 0u) << "p=" << p;
  }
  Vec y = x;
  dropout(y.data(), rows, C, site(0.0f, 11, 0, 128));
  EXPECT_EQ(y, x) << "p = 0 must leave the buffer alone";
}

TEST(Dropout, MaskIsAFunctionOfSamplePositionAndSiteOnly) {
  const int B = 3, T = 10, C = 24;
  const Vec x = randn((size_t)B * T * C, 2);
  Vec whole = x, pieces = x, other_sample = x, other_site = x;
  const Dropout d = site(0.25f, 99, 40, T);
  dropout(whole.data(), (size_t)B * T, C, d);
  // Two pieces of 13 and 17 rows (not a multiple of T), as two sequence-parallel ranks.
  Dropout a = d, b = d;
  b.first_row = 13;
  dropout(pieces.data(), 13, C, a);
  dropout(pieces.data() + 13 * C, (size_t)B * T - 13, C, b);
  EXPECT_EQ(pieces, whole);
  // Sample 41 as the first row of a one-sample micro-batch: sample 1 of the batch above.
  Vec one(x.begin() + T * C, x.begin() + 2 * T * C);
  dropout(one.data(), T, C, site(0.25f, 99, 41, T));
  EXPECT_TRUE(std::equal(one.begin(), one.end(), whole.begin() + T * C)) << "a sample's mask depends on its batch";
  dropout(other_sample.data(), (size_t)B * T, C, site(0.25f, 99, 41, T));
  dropout(other_site.data(), (size_t)B * T, C, site(0.25f, 100, 40, T));
  EXPECT_NE(other_sample, whole);
  EXPECT_NE(other_site, whole);
}

TEST(Dropout, AttentionMatchesReferenceAndFiniteDifferences) {
  const int B = 2, T = 7, C = 12, NH = 3;
  Dropout d = site(0.3f, 5, 17, T);
  d.head0 = 3;  // as tensor-parallel rank 1 of 2 of a six-head model
  const Vec qkv = randn((size_t)B * T * 3 * C, 3), R = randn((size_t)B * T * C, 4);
  Vec out((size_t)B * T * C), att((size_t)B * NH * T * T), plain_out = out, plain_att = att;
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, Precision::fp32, &d);
  attention_forward(plain_out.data(), plain_att.data(), qkv.data(), B, T, C, NH, Precision::fp32, nullptr);
  EXPECT_EQ(att, plain_att) << "att must keep the undropped probabilities";
  EXPECT_NE(out, plain_out) << "nothing was dropped";
  const DVec qd(qkv.begin(), qkv.end());
  const DVec ref = ref_attention(qd, B, T, C, NH, d);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-6 + 1e-6 * std::fabs(ref[i])) << i;
  const Vec g0 = randn(qkv.size(), 5);  // backward accumulates
  Vec g = g0;
  attention_backward(g.data(), R.data(), qkv.data(), att.data(), B, T, C, NH, Precision::fp32, &d);
  auto loss = [&](const DVec& v) {
    const DVec o = ref_attention(v, B, T, C, NH, d);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * R[i];
    return s;
  };
  int checked = 0;
  for (size_t i = 0; i < qd.size(); i += 3) {
    DVec v = qd;
    const double eps = 1e-3;
    v[i] = qd[i] + eps;
    const double lp = loss(v);
    v[i] = qd[i] - eps;
    const double fd = (lp - loss(v)) / (2 * eps);
    ASSERT_NEAR(g[i] - g0[i], fd, 2e-6 + 2e-6 * std::fabs(fd)) << "dqkv[" << i << "]";
    ++checked;
  }
  EXPECT_GT(checked, 150);
}
