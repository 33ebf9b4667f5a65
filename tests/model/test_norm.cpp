// model/norm.hpp: the norm component, LayerNorm and RMSNorm. Its tensors as declared (names,
// adjacency, initialisation; RMSNorm has no bias), its forward against the formula in double, its
// backward against finite differences.
#include "hpct/model/norm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "hpct/core/rng.hpp"
#include "finite_differences.hpp"
#include "hpct/kernels/backend.hpp"

using namespace hpct;
using namespace hpct::model;

namespace {

TEST(Norm, DeclaresItsTensors) {
  ParamLayout L;
  L.begin_block("layers.0");
  L.add("layers.0.other", {3}, false, {}, InitSpec::zeros());
  const NormTensors t = Norm::declare(L, "layers.0.input_layernorm", 8, {-1, 2, 0, 1}, 0, NormKind::layernorm);
  const auto& v = L.tensors();
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[1].name, "layers.0.input_layernorm.weight");
  EXPECT_EQ(v[2].name, "layers.0.input_layernorm.bias");
  EXPECT_EQ(v[1].numel, 8u);  // a replica under tensor parallelism
  EXPECT_EQ(v[1].init.kind, InitSpec::Kind::ones);
  EXPECT_EQ(v[2].init.kind, InitSpec::Kind::zeros);
  EXPECT_FALSE(v[1].weight_decay);
  EXPECT_EQ(t.weight, 3u);
  EXPECT_EQ(t.bias, 11u);
  const NormTensors r = Norm::declare(L, "final_layernorm", 8, {-1, 2, 0, 1}, 0, NormKind::rmsnorm);
  ASSERT_EQ(v.size(), 4u);  // the weight only
  EXPECT_EQ(v[3].name, "final_layernorm.weight");
  EXPECT_EQ(v[3].init.kind, InitSpec::Kind::ones);
  EXPECT_EQ(r.weight, 19u);
  EXPECT_EQ(r.bias, NormTensors::none);
  float block[32] = {};
  EXPECT_EQ(NormWeights::at(block, r).bias, nullptr);
}

struct Case {
  int R = 3, C = 5;
  std::vector<float> w, b, x;
  Case() {
    Rng rng(5);
    auto fill = [&](std::vector<float>& v, size_t n, double mean) {
      v.resize(n);
      for (auto& e : v) e = static_cast<float>(mean + rng.normal() * 0.5);
    };
    fill(w, C, 1.0), fill(b, C, 0.0), fill(x, R * C, 0.3);
  }
  NormKind kind = NormKind::layernorm;
  NormWeights weights() const { return {w.data(), kind == NormKind::layernorm ? b.data() : nullptr}; }
};

double loss_of(const Norm& n, const Case& k) {  // sum of out * (index + 1)
  std::vector<float> out(k.x.size()), mean(k.R), rstd(k.R);  // (RMSNorm leaves mean alone)
  n.forward(k.weights(), k.x.data(), out.data(), {mean.data(), rstd.data()}, k.R);
  double l = 0;
  for (size_t i = 0; i < out.size(); ++i) l += double(out[i]) * double(i + 1);
  return l;
}

void forward_backward(NormKind kind) {
  auto ops = kernels::cpu_ops();
  Case k;
  k.kind = kind;
  const bool ln = kind == NormKind::layernorm;
  const Norm n(*ops, k.C, kind);
  std::vector<float> out(k.x.size()), mean(k.R), rstd(k.R);
  n.forward(k.weights(), k.x.data(), out.data(), {ln ? mean.data() : nullptr, rstd.data()}, k.R);
  // In double (eps 1e-5, GPT-2's and Llama's), relative 1e-5: fp32 sums of 5 terms.
  for (int r = 0; r < k.R; ++r) {
    double m = 0, var = 0;
    if (ln) {
      for (int c = 0; c < k.C; ++c) m += k.x[r * k.C + c];
      m /= k.C;
    }
    for (int c = 0; c < k.C; ++c) var += (k.x[r * k.C + c] - m) * (k.x[r * k.C + c] - m);  // RMSNorm: mean(x^2)
    const double rs = 1 / std::sqrt(var / k.C + 1e-5);
    EXPECT_NEAR(rstd[r], rs, 1e-5 * rs);
    for (int c = 0; c < k.C; ++c) {
      const double ref = (k.x[r * k.C + c] - m) * rs * k.w[c] + (ln ? k.b[c] : 0.0);
      EXPECT_NEAR(out[r * k.C + c], ref, 1e-5 * (1 + std::fabs(ref)));
    }
  }
  std::vector<float> dout(out.size()), dx(k.x.size(), 0.0f), gw(k.C, 0.0f), gb(k.C, 0.0f);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(i + 1);
  n.backward(k.weights(), {gw.data(), ln ? gb.data() : nullptr}, k.x.data(), {ln ? mean.data() : nullptr, rstd.data()},
             dout.data(), dx.data(), k.R);
  auto check = [&](std::vector<float>& v, const std::vector<float>& grad, const char* what) {
    test::expect_gradient(v, grad, [&] { return loss_of(n, k); }, what);  // finite_differences.hpp
  };
  check(k.x, dx, "x");
  check(k.w, gw, "weight");
  if (ln) check(k.b, gb, "bias");
}

TEST(Norm, LayerNormForwardBackward) { forward_backward(NormKind::layernorm); }
TEST(Norm, RmsNormForwardBackward) { forward_backward(NormKind::rmsnorm); }

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kernels::BackendScope backend;
  return RUN_ALL_TESTS();
}
