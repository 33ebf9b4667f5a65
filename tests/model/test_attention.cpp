// model/attention.hpp: the self-attention component every layer uses. Its tensors as declared
// (names, shapes, the q|k|v stride-3 split, initialisation), its forward against a plain causal
// attention in double (with and without rotary positions on all or half of each head's channels),
// its backward against finite differences, and the hooks (LoRA's) called around each linear.
#include "hpct/model/attention.hpp"

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

TEST(Attention, DeclaresItsTensors) {
  ParamLayout L;
  L.begin_block("layers.0");
  L.add("layers.0.other", {3}, false, {}, InitSpec::zeros());
  const Partition qkv{0, 2, 1, 3}, row{1, 2, 1, 1}, rep{-1, 2, 1, 1};
  const AttentionTensors t = Attention::declare(L, "layers.0.attention.", 8, {qkv, row, rep}, InitSpec::normal(0.02),
                                                InitSpec::normal(0.01), 0);
  const auto& v = L.tensors();
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[1].name, "layers.0.attention.query_key_value.weight");
  EXPECT_EQ(v[1].shape, (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(v[1].numel, 12u * 8);  // this rank's half of each of q, k and v
  EXPECT_EQ(v[1].part.stride, 3);
  EXPECT_EQ(v[2].name, "layers.0.attention.query_key_value.bias");
  EXPECT_EQ(v[2].numel, 12u);
  EXPECT_EQ(v[3].name, "layers.0.attention.dense.weight");
  EXPECT_EQ(v[3].part.dim, 1);
  EXPECT_EQ(v[4].name, "layers.0.attention.dense.bias");
  EXPECT_EQ(v[4].numel, 8u);  // a replica
  EXPECT_EQ(v[1].init.std, 0.02);
  EXPECT_EQ(v[3].init.std, 0.01);
  EXPECT_EQ(v[2].init.kind, InitSpec::Kind::zeros);
  EXPECT_EQ(v[4].init.kind, InitSpec::Kind::zeros);
  EXPECT_EQ(t.qkvw, 3u);
  EXPECT_EQ(t.qkvb, 3u + 96);
  EXPECT_EQ(t.projw, 3u + 96 + 12);
  EXPECT_EQ(t.projb, 3u + 96 + 12 + 32);
  // --disable-bias-linear: the weights only
  ParamLayout N;
  N.begin_block("layers.0");
  const AttentionTensors nb = Attention::declare(N, "layers.0.attention.", 8, {qkv, row, rep}, InitSpec::normal(0.02),
                                                 InitSpec::normal(0.01), 0, false);
  ASSERT_EQ(N.tensors().size(), 2u);
  EXPECT_EQ(N.tensors()[1].name, "layers.0.attention.dense.weight");
  EXPECT_EQ(nb.qkvb, AttentionTensors::none);
  float block[256] = {};
  EXPECT_EQ(AttentionWeights::at(block, nb).projb, nullptr);
  EXPECT_EQ(AttentionGrads::at(block, nb).qkvb, nullptr);
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

// kv: key/value heads (grouped-query attention when fewer than NH; 0: NH).
struct Case {
  int B = 2, T = 3, C = 16, NH = 4, KV = 4;
  Rotary rotary;  // dims 0: none
  std::vector<float> qkvw, qkvb, projw, projb, x;
  explicit Case(int kv = 0) : KV(kv > 0 ? kv : NH) {
    Rng rng(11);
    auto fill = [&](std::vector<float>& v, size_t n) {
      v.resize(n);
      for (auto& e : v) e = static_cast<float>(rng.normal() * 0.5);
    };
    fill(qkvw, Q() * C), fill(qkvb, Q()), fill(projw, C * C), fill(projb, C), fill(x, B * T * C);
  }
  int d() const { return C / NH; }
  int Q() const { return C + 2 * KV * d(); }  // a qkv row: q, KV key heads, KV value heads
  int N() const { return B * T; }
  AttentionWeights w() const { return {qkvw.data(), qkvb.data(), projw.data(), projb.data()}; }
};

// Causal multi-head attention in double: q, k, v are the sections of x qkv^T + b (q: NH heads, k and
// v: KV heads each), head h the channels [h*d, (h+1)*d) of its section, query head h reading
// key/value head h / (NH/KV) (HF's repeat_kv); with rotary positions, q's and k's channel pairs (i,
// i + rot/2) of each head rotated by t * theta^(-2i/rot) (GPT-NeoX's rotate-half); out =
// concat(softmax(q k^T / sqrt(d)) v) dense^T + b.
std::vector<double> reference(const Case& k) {
  const int C = k.C, d = k.d(), Q = k.Q(), G = k.NH / k.KV;
  std::vector<double> qkv(k.N() * Q), y(k.N() * C), out(k.N() * C);
  for (int r = 0; r < k.N(); ++r)
    for (int o = 0; o < Q; ++o) {
      double s = k.qkvb[o];
      for (int c = 0; c < C; ++c) s += double(k.x[r * C + c]) * k.qkvw[o * C + c];
      qkv[r * Q + o] = s;
    }
  if (const int rot = k.rotary.dims; rot > 0)
    for (int r = 0; r < k.N(); ++r)
      for (int h = 0; h < k.NH + k.KV; ++h)  // the query heads, then the key heads after them
          for (int i = 0; i < rot / 2; ++i) {
            double* x = &qkv[r * Q + h * d];
            const double ang = (r % k.T) * std::pow(double(k.rotary.theta), -2.0 * i / rot);
            const double a = x[i], b = x[i + rot / 2];
            x[i] = a * std::cos(ang) - b * std::sin(ang);
            x[i + rot / 2] = b * std::cos(ang) + a * std::sin(ang);
          }
  for (int b = 0; b < k.B; ++b)
    for (int h = 0; h < k.NH; ++h)
      for (int t = 0; t < k.T; ++t) {
        const double* q = &qkv[(b * k.T + t) * Q + h * d];
        const int kv = C + (h / G) * d;  // its key head's channels (values KV d further)
        std::vector<double> p(t + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= t; ++j) {
          const double* kk = &qkv[(b * k.T + j) * Q + kv];
          double s = 0;
          for (int e = 0; e < d; ++e) s += q[e] * kk[e];
          p[j] = s / std::sqrt(double(d));
          mx = std::max(mx, p[j]);
        }
        for (auto& e : p) sum += (e = std::exp(e - mx));
        for (int e = 0; e < d; ++e) {
          double s = 0;
          for (int j = 0; j <= t; ++j) s += p[j] / sum * qkv[(b * k.T + j) * Q + kv + k.KV * d + e];
          y[(b * k.T + t) * C + h * d + e] = s;
        }
      }
  for (int r = 0; r < k.N(); ++r)
    for (int c = 0; c < C; ++c) {
      double s = k.projb[c];
      for (int i = 0; i < C; ++i) s += y[r * C + i] * k.projw[c * C + i];
      out[r * C + c] = s;
    }
  return out;
}

struct Buffers {
  std::vector<float> qkv, att, y, out;
  explicit Buffers(const Case& k, const Attention& a)
      : qkv(a.inputs_floats(k.B, k.T)), att(a.state_floats(k.B, k.T)), y(k.N() * k.C), out(k.N() * k.C) {}
};

void run(const Attention& a, const Case& k, Buffers& s, LinearHooks* hooks) {
  a.mix(k.w(), k.x.data(), s.qkv.data(), s.att.data(), s.y.data(), k.B, k.T, nullptr, nullptr, nullptr, hooks);
  a.project(k.w(), s.y.data(), s.out.data(), k.N(), hooks);
}

double loss_of(const Attention& a, const Case& k) {  // sum of out * (1 + index % 5): every output weighs in
  Buffers s(k, a);
  run(a, k, s, nullptr);
  double l = 0;
  for (size_t i = 0; i < s.out.size(); ++i) l += double(s.out[i]) * double(1 + i % 5);
  return l;
}

void forward_backward_and_hooks(Rotary rotary, int kv = 0) {
  auto ops = kernels::cpu_ops();
  Case k(kv);
  k.rotary = rotary;
  const Attention a(*ops, kernels::Precision::fp32, k.C, k.NH, k.C, rotary, k.KV);
  ASSERT_EQ(a.qkv_width(), k.Q());
  Buffers s(k, a);
  Recorder rec;
  run(a, k, s, &rec);
  // Forward against the double reference: fp32 GEMMs and softmaxes of a few terms, relative 1e-5.
  const auto ref = reference(k);
  for (size_t i = 0; i < s.out.size(); ++i) EXPECT_NEAR(s.out[i], ref[i], 1e-5 * (1 + std::fabs(ref[i]))) << i;
  // Backward of loss = sum out_i (1 + i % 5): dout_i = 1 + i % 5 (weights that keep the loss small
  // enough for fp32 differences); dx is written whatever it held (NaN here).
  std::vector<float> dout(s.out.size()), dx(k.x.size(), std::nanf("")), dy(k.N() * k.C), dqkv(a.dqkv_floats(k.N()));
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(1 + i % 5);
  std::vector<float> gqkvw(k.qkvw.size(), 0.0f), gqkvb(k.qkvb.size(), 0.0f), gprojw(k.projw.size(), 0.0f),
      gprojb(k.C, 0.0f);
  a.backward(k.w(), {gqkvw.data(), gqkvb.data(), gprojw.data(), gprojb.data()}, k.x.data(), s.qkv.data(),
             s.att.data(), s.y.data(), dout.data(), dx.data(), k.B, k.T, dy.data(), dqkv.data(), nullptr, nullptr, &rec);
  EXPECT_EQ(rec.calls, (std::vector<std::string>{"f0:6", "f1:6", "b1:6", "b0:6"}));  // qkv, proj
  auto check = [&](std::vector<float>& v, const std::vector<float>& grad, const char* what) {
    test::expect_gradient(v, grad, [&] { return loss_of(a, k); }, what);  // finite_differences.hpp
  };
  check(k.x, dx, "x");
  check(k.qkvw, gqkvw, "query_key_value.weight");
  check(k.qkvb, gqkvb, "query_key_value.bias");
  check(k.projw, gprojw, "dense.weight");
  check(k.projb, gprojb, "dense.bias");
}

TEST(Attention, ForwardBackwardAndHooks) { forward_backward_and_hooks({}); }
// Rotary positions on every channel of the 4-wide heads, and on half of them (--rotary-percent
// 0.5); theta 10 so that 3 positions turn the pairs far enough to matter.
TEST(Attention, RotaryForwardBackwardAndHooks) { forward_backward_and_hooks({4, 10.0f}); }
TEST(Attention, PartialRotaryForwardBackwardAndHooks) { forward_backward_and_hooks({2, 10.0f}); }
// Grouped-query attention: 4 query heads on 2 key/value heads, and on 1 (multi-query), with rotary
// positions on the query and the key heads.
TEST(Attention, GroupedQueryForwardBackwardAndHooks) { forward_backward_and_hooks({2, 10.0f}, 2); }
TEST(Attention, MultiQueryForwardBackwardAndHooks) { forward_backward_and_hooks({}, 1); }

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kernels::BackendScope backend;
  return RUN_ALL_TESTS();
}
