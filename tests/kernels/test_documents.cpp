// Documents packed in one sample (ops.hpp): per-document attention (key_start, Megatron's
// --reset-attention-mask) and per-token positions in the embedding (--reset-position-ids).
//
// - Attention: forward against a double reference in which query t sees keys key_start[t]..t
//   (|out - ref| <= 1e-6 + 1e-6 |ref|, as the plain attention's test: the same GEMM chain), the saved
//   probabilities zero outside those keys; backward (which reads no key_start: the zeros in att
//   carry the mask) against central finite differences of the reference (eps 1e-3, 2e-6 absolute and
//   relative, as for the plain attention), over documents that cross the 128-row block of the CPU
//   kernel too. And the property that makes packing correct: each document of a packed sample gets
//   the output and the gradient it gets alone in a sample of its own (1e-6: the same sums, grouped
//   differently by the GEMMs).
// - Embedding: positions index the table's rows; backward (rows collide when documents repeat
//   positions) against finite differences of a double reference: 1e-5 absolute (the gradient is
//   read as a difference of float accumulators of size ~1, and a linear map's FD is exact).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/ops.hpp"

using namespace hpct::kernels;

namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;
using Ids = std::vector<int32_t>;

class Env : public ::testing::Environment {
 public:
  void SetUp() override { scope_ = std::make_unique<BackendScope>(); }
  void TearDown() override { scope_.reset(); }

 private:
  std::unique_ptr<BackendScope> scope_;
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Env);

Vec randn(size_t n, unsigned seed, float sd = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sd);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// The first position of each token's document, from document lengths per sample.
Ids key_starts(const std::vector<std::vector<int>>& docs) {
  Ids ks;
  for (const auto& sample : docs) {
    int start = 0;
    for (int len : sample) {
      for (int i = 0; i < len; ++i) ks.push_back(start);
      start += len;
    }
  }
  return ks;
}

DVec ref_attention(const DVec& qkv, int B, int T, int C, int NH, const Ids& ks, DVec* att = nullptr) {
  const int HS = C / NH;
  DVec out((size_t)B * T * C);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const int lo = ks[b * T + t];
        DVec p(T, 0.0);
        double mx = -1e300;
        for (int j = lo; j <= t; ++j) {
          double s = 0;
          for (int d = 0; d < HS; ++d)
            s += qkv[((size_t)b * T + t) * 3 * C + h * HS + d] * qkv[((size_t)b * T + j) * 3 * C + C + h * HS + d];
          p[j] = s / std::sqrt((double)HS);
          mx = std::max(mx, p[j]);
        }
        double z = 0;
        for (int j = lo; j <= t; ++j) z += (p[j] = std::exp(p[j] - mx));
        for (int j = lo; j <= t; ++j) p[j] /= z;
        for (int d = 0; d < HS; ++d) {
          double o = 0;
          for (int j = lo; j <= t; ++j) o += p[j] * qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * HS + d];
          out[((size_t)b * T + t) * C + h * HS + d] = o;
        }
        if (att)
          for (int j = 0; j < T; ++j) (*att)[((size_t)(b * NH + h) * T + t) * T + j] = p[j];
      }
  return out;
}

void check_documents(int T, const std::vector<std::vector<int>>& docs, size_t stride, unsigned seed) {
  const int B = (int)docs.size(), C = 12, NH = 3;
  const Ids ks = key_starts(docs);
  ASSERT_EQ(ks.size(), (size_t)B * T);
  const Vec qkv = randn((size_t)B * T * 3 * C, seed, 0.8f), R = randn((size_t)B * T * C, seed + 1);
  const DVec qd(qkv.begin(), qkv.end());
  Vec out((size_t)B * T * C), att((size_t)B * NH * T * T, std::nanf(""));
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, Precision::fp32, nullptr, ks.data());
  DVec ratt(att.size());
  const DVec ref = ref_attention(qd, B, T, C, NH, ks, &ratt);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-6 + 1e-6 * std::fabs(ref[i])) << "out " << i;
  for (size_t i = 0; i < att.size(); ++i) {
    if (ratt[i] == 0.0) {
      ASSERT_EQ(att[i], 0.0f) << "att " << i << " is outside its row's document";
    }
    ASSERT_NEAR(att[i], ratt[i], 1e-6 + 1e-5 * ratt[i]) << "att " << i;
  }
  const Vec g0 = randn(qkv.size(), seed + 2);  // backward accumulates
  Vec g = g0;
  attention_backward(g.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  auto loss = [&](const DVec& v) {
    const DVec o = ref_attention(v, B, T, C, NH, ks);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * R[i];
    return s;
  };
  for (size_t i = 0; i < qd.size(); i += stride) {
    DVec v = qd;
    const double eps = 1e-3;
    v[i] = qd[i] + eps;
    const double lp = loss(v);
    v[i] = qd[i] - eps;
    const double fd = (lp - loss(v)) / (2 * eps);
    ASSERT_NEAR(g[i] - g0[i], fd, 2e-6 + 2e-6 * std::fabs(fd)) << "dqkv[" << i << "]";
  }
}

}  // namespace

TEST(DocumentAttention, ReferenceAndFiniteDifferences) {
  check_documents(9, {{3, 4, 2}, {1, 1, 7}, {9}}, 1, 11);
}

TEST(DocumentAttention, DocumentsAcrossTheCausalBlock) {
  // The CPU kernel works in blocks of 128 query rows: a document from row 100 to 149 spans two.
  check_documents(150, {{100, 50}}, 17, 21);
}

TEST(DocumentAttention, EachDocumentAsIfAlone) {
  const int C = 16, NH = 2, T = 12;
  const std::vector<int> lens = {5, 4, 3};
  const Ids ks = key_starts({lens});
  const Vec qkv = randn((size_t)T * 3 * C, 31), dout = randn((size_t)T * C, 32);
  Vec out((size_t)T * C), att((size_t)NH * T * T), dqkv(qkv.size(), 0.0f);
  attention_forward(out.data(), att.data(), qkv.data(), 1, T, C, NH, Precision::fp32, nullptr, ks.data());
  attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), 1, T, C, NH);
  int start = 0;
  for (int len : lens) {
    const Vec q(qkv.begin() + (size_t)start * 3 * C, qkv.begin() + (size_t)(start + len) * 3 * C);
    const Vec d(dout.begin() + (size_t)start * C, dout.begin() + (size_t)(start + len) * C);
    Vec o((size_t)len * C), a((size_t)NH * len * len), dq(q.size(), 0.0f);
    attention_forward(o.data(), a.data(), q.data(), 1, len, C, NH);
    attention_backward(dq.data(), d.data(), q.data(), a.data(), 1, len, C, NH);
    for (size_t i = 0; i < o.size(); ++i)
      ASSERT_NEAR(out[(size_t)start * C + i], o[i], 1e-6 + 1e-6 * std::fabs(o[i])) << "document at " << start;
    for (size_t i = 0; i < dq.size(); ++i)
      ASSERT_NEAR(dqkv[(size_t)start * 3 * C + i], dq[i], 1e-6 + 1e-6 * std::fabs(dq[i])) << "document at " << start;
    start += len;
  }
}

TEST(DocumentAttention, KeyStartMustBeInsideTheRow) {
  const int T = 4, C = 6, NH = 2;
  Vec qkv((size_t)T * 3 * C, 0.1f), out((size_t)T * C), att((size_t)NH * T * T);
  for (const Ids& bad : {Ids{0, 0, 3, 0}, Ids{0, -1, 0, 0}})
    EXPECT_THROW(attention_forward(out.data(), att.data(), qkv.data(), 1, T, C, NH, Precision::fp32, nullptr, bad.data()),
                 hpct::Error);
}

TEST(DocumentPositions, EmbeddingForwardAndBackward) {
  const int B = 2, T = 6, C = 8, V = 11, maxT = 7;
  const Ids tok = {3, 0, 10, 3, 7, 1, 1, 2, 9, 3, 3, 4};
  const Ids pos = {0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5};  // documents of 3, 2, 1 tokens; one of 6
  const Vec wte = randn((size_t)V * C, 4), wpe = randn((size_t)maxT * C, 5), R = randn((size_t)B * T * C, 6);
  auto ref = [&](const DVec& e, const DVec& p) {
    DVec o((size_t)B * T * C);
    for (int i = 0; i < B * T; ++i)
      for (int c = 0; c < C; ++c) o[(size_t)i * C + c] = e[(size_t)tok[i] * C + c] + p[(size_t)pos[i] * C + c];
    return o;
  };
  const DVec we(wte.begin(), wte.end()), wp(wpe.begin(), wpe.end());
  Vec out((size_t)B * T * C);
  encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, pos.data());
  const DVec want = ref(we, wp);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-6) << i;
  const Vec dwte0 = randn(wte.size(), 7), dwpe0 = randn(wpe.size(), 8);
  Vec dwte = dwte0, dwpe = dwpe0;
  encoder_backward(dwte.data(), dwpe.data(), R.data(), tok.data(), B, T, C, pos.data());
  auto fd = [&](const DVec& x, bool table_is_wte, size_t i) {
    DVec v = x;
    const double eps = 1e-3;
    auto loss = [&](const DVec& y) {
      const DVec o = table_is_wte ? ref(y, wp) : ref(we, y);
      double s = 0;
      for (size_t k = 0; k < o.size(); ++k) s += o[k] * R[k];
      return s;
    };
    v[i] += eps;
    const double lp = loss(v);
    v[i] -= 2 * eps;
    return (lp - loss(v)) / (2 * eps);
  };
  for (size_t i = 0; i < wte.size(); ++i) ASSERT_NEAR(dwte[i] - dwte0[i], fd(we, true, i), 1e-5) << "dwte " << i;
  for (size_t i = 0; i < wpe.size(); ++i) ASSERT_NEAR(dwpe[i] - dwpe0[i], fd(wp, false, i), 1e-5) << "dwpe " << i;
  Ids bad = pos;
  bad[3] = -1;
  EXPECT_THROW(encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, bad.data()), hpct::Error);
}
