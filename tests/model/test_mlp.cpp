// model/mlp.hpp: the feed-forward component every dense layer, residual MoE and expert uses, GELU
// and SwiGLU. Its tensors as declared (names, shapes, splits, initialisation), its forward against a
// plain loop, its backward against finite differences, and the hooks (LoRA's) around each linear.
#include "hpct/model/mlp.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hpct/core/rng.hpp"
#include "finite_differences.hpp"
#include "hpct/kernels/backend.hpp"

using namespace hpct;
using namespace hpct::model;

namespace {

TEST(Mlp, DeclaresItsTensors) {
  ParamLayout L;
  L.begin_block("layers.0");
  L.add("layers.0.other", {3}, false, {}, InitSpec::zeros());
  const size_t base = 0;
  const Partition col{0, 2, 1, 1}, row{1, 2, 1, 1}, rep{-1, 2, 1, 1};
  const MlpTensors t = Mlp::declare(L, "layers.0.mlp.", 8, 32, {col, row, rep}, InitSpec::normal(0.02),
                                    InitSpec::normal(0.01), base, MlpKind::gelu);
  const auto& v = L.tensors();
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[1].name, "layers.0.mlp.dense_h_to_4h.weight");
  EXPECT_EQ(v[1].shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(v[1].numel, 16u * 8);  // this rank's half of the rows
  EXPECT_EQ(v[2].name, "layers.0.mlp.dense_h_to_4h.bias");
  EXPECT_EQ(v[3].name, "layers.0.mlp.dense_4h_to_h.weight");
  EXPECT_EQ(v[3].part.dim, 1);
  EXPECT_EQ(v[4].name, "layers.0.mlp.dense_4h_to_h.bias");
  EXPECT_EQ(v[4].numel, 8u);  // a replica
  EXPECT_EQ(v[1].init.std, 0.02);
  EXPECT_EQ(v[3].init.std, 0.01);
  EXPECT_EQ(v[2].init.kind, InitSpec::Kind::zeros);
  EXPECT_EQ(v[4].init.kind, InitSpec::Kind::zeros);
  EXPECT_EQ(t.fcw, 3u);
  EXPECT_EQ(t.fcb, 3u + 128);
  EXPECT_EQ(t.projw, 3u + 128 + 16);
  EXPECT_EQ(t.projb, 3u + 128 + 16 + 128);
  // SwiGLU: fc holds gate and up (2F rows), split by those sections (stride 2); fc2 as GELU's.
  ParamLayout G;
  G.begin_block("layers.0");
  const MlpTensors g = Mlp::declare(G, "layers.0.mlp.", 8, 32, {col, row, rep}, InitSpec::normal(0.02),
                                    InitSpec::normal(0.01), 0, MlpKind::swiglu);
  const auto& gv = G.tensors();
  ASSERT_EQ(gv.size(), 4u);
  EXPECT_EQ(gv[0].shape, (std::vector<int64_t>{64, 8}));
  EXPECT_EQ(gv[0].part.stride, 2);
  EXPECT_EQ(gv[0].numel, 32u * 8);  // this rank's half of gate and of up
  EXPECT_EQ(gv[1].shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(gv[1].part.stride, 2);
  EXPECT_EQ(gv[2].shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(g.projw, 256u + 32);
}

struct Recorder final : LinearHooks {
  std::vector<std::string> calls;
  bool fc_active = true;  // false: the MLP may fuse fc with its GELU and not call this hook there
  bool active(Linear w) const override { return w != fc || fc_active; }
  void forward(Linear w, kernels::Operand, float*, int rows) override { calls.push_back("f" + std::to_string(w) + ":" + std::to_string(rows)); }
  void backward(Linear w, kernels::Operand, const float*, float*, int rows) override {
    calls.push_back("b" + std::to_string(w) + ":" + std::to_string(rows));
  }
};

struct Case {
  int C = 4, F = 6, R = 3;
  MlpKind kind = MlpKind::gelu;
  int W() const { return kind == MlpKind::swiglu ? 2 * F : F; }  // fc's output width
  std::vector<float> fcw, fcb, projw, projb, x;
  Case() {
    Rng rng(7);
    auto fill = [&](std::vector<float>& v, size_t n) {
      v.resize(n);
      for (auto& e : v) e = static_cast<float>(rng.normal() * 0.5);
    };
    fill(fcw, 2 * F * C), fill(fcb, 2 * F), fill(projw, C * F), fill(projb, C), fill(x, R * C);  // room for SwiGLU's
  }
  MlpWeights w() const { return {fcw.data(), fcb.data(), projw.data(), projb.data()}; }
};

// out = act(x fc^T + b) fc2^T + b2 in double: GELU's tanh form (GPT-2's), or SwiGLU's silu(gate) *
// up with gate = fc's rows 0..F-1 and up = rows F..2F-1.
std::vector<double> reference(const Case& k) {
  std::vector<double> out(k.R * k.C);
  for (int r = 0; r < k.R; ++r) {
    std::vector<double> pre(k.W()), h(k.F);
    for (int f = 0; f < k.W(); ++f) {
      double s = k.fcb[f];
      for (int c = 0; c < k.C; ++c) s += double(k.x[r * k.C + c]) * k.fcw[f * k.C + c];
      pre[f] = s;
    }
    for (int f = 0; f < k.F; ++f) {
      const double s = pre[f];
      h[f] = k.kind == MlpKind::swiglu ? s / (1 + std::exp(-s)) * pre[k.F + f]
                                       : 0.5 * s * (1 + std::tanh(std::sqrt(2 / M_PI) * (s + 0.044715 * s * s * s)));
    }
    for (int c = 0; c < k.C; ++c) {
      double s = k.projb[c];
      for (int f = 0; f < k.F; ++f) s += h[f] * k.projw[c * k.F + f];
      out[r * k.C + c] = s;
    }
  }
  return out;
}

double loss_of(const Mlp& m, const Case& k) {  // sum of out * (index + 1): every output weighs in
  std::vector<float> fch(k.R * k.W()), act(k.R * k.F), out(k.R * k.C);
  m.forward(k.w(), k.x.data(), fch.data(), act.data(), out.data(), k.R, k.F, nullptr);
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += double(out[i]) * double(i + 1);
  return s;
}

void forward_backward_and_hooks(MlpKind kind) {
  auto ops = kernels::cpu_ops();
  Case k;
  k.kind = kind;
  const Mlp m(*ops, kernels::Precision::fp32, k.C, kind);
  EXPECT_EQ(m.fc_width(k.F), k.W());
  // Forward against the double loop: fp32 GEMMs of 4-6 terms, relative 1e-5.
  std::vector<float> fch(k.R * k.W()), act(k.R * k.F), out(k.R * k.C);
  Recorder rec;
  m.forward(k.w(), k.x.data(), fch.data(), act.data(), out.data(), k.R, k.F, &rec);
  const auto ref = reference(k);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 1e-5 * (1 + std::fabs(ref[i]))) << i;
  // Backward of loss = sum out_i (i + 1): dout_i = i + 1.
  std::vector<float> dout(out.size()), dx(k.x.size(), std::nanf("")), dfch(fch.size()), dact(fch.size());
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(i + 1);
  std::vector<float> gfcw(k.fcw.size(), 0.0f), gfcb(k.fcb.size(), 0.0f), gprojw(k.projw.size(), 0.0f), gprojb(k.C, 0.0f);
  m.backward(k.w(), {gfcw.data(), gfcb.data(), gprojw.data(), gprojb.data()}, k.x.data(), fch.data(), act.data(),
             dout.data(), dx.data(), k.R, dfch.data(), dact.data(), k.F, &rec);
  EXPECT_EQ(rec.calls, (std::vector<std::string>{"f2:3", "f3:3", "b3:3", "b2:3"}));  // fc, fc2
  auto check = [&](std::vector<float>& v, const std::vector<float>& grad, const char* what) {
    test::expect_gradient(v, grad, [&] { return loss_of(m, k); }, what);  // finite_differences.hpp
  };
  check(k.x, dx, "x");
  check(k.fcw, gfcw, "fc.weight");
  check(k.fcb, gfcb, "fc.bias");
  check(k.projw, gprojw, "fc2.weight");
  check(k.projb, gprojb, "fc2.bias");
}

TEST(Mlp, GeluForwardBackwardAndHooks) { forward_backward_and_hooks(MlpKind::gelu); }

// Nothing beside fc (no LoRA there): GELU's MLP runs fc, its bias and GELU as one op
// (OpsBackend::matmul_gelu_forward) and calls no hook for fc; the result is the unfused route's.
// On the CPU the fused op is that composite, so bitwise; the CUDA kernel is checked against it in
// test_fusions_cuda.
TEST(Mlp, GeluFusedWhenNothingRunsBesideFc) {
  auto ops = kernels::cpu_ops();
  Case k;
  const Mlp m(*ops, kernels::Precision::fp32, k.C, MlpKind::gelu);
  std::vector<float> fch(k.R * k.W()), act(k.R * k.F), out(k.R * k.C);
  std::vector<float> fch2 = fch, act2 = act, out2 = out;
  Recorder hooked, idle;
  idle.fc_active = false;
  m.forward(k.w(), k.x.data(), fch.data(), act.data(), out.data(), k.R, k.F, &hooked);
  m.forward(k.w(), k.x.data(), fch2.data(), act2.data(), out2.data(), k.R, k.F, &idle);
  EXPECT_EQ(hooked.calls, (std::vector<std::string>{"f2:3", "f3:3"}));
  EXPECT_EQ(idle.calls, (std::vector<std::string>{"f3:3"}));
  EXPECT_EQ(fch, fch2);
  EXPECT_EQ(act, act2);
  EXPECT_EQ(out, out2);
}
TEST(Mlp, SwiGluForwardBackwardAndHooks) { forward_backward_and_hooks(MlpKind::swiglu); }

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kernels::BackendScope backend;
  return RUN_ALL_TESTS();
}
