// The MoE layer inside the whole model: backward against finite differences of the forward loss
// (the router's gradient through the combine weights, the aux and z losses, the experts, the
// residual MoE's coefficient), for top-1 with Random Token Selection and top-2, with tokens dropped.
// fp32, so the differences are taken at eps = 1e-2 and compared with 5e-3 + 3e-2 |fd| (the dense
// model's test tolerance: fp32 loss sums over 16 tokens carry ~1e-6 rounding, /2eps ~ 1e-4, plus
// O(eps^2) truncation). A routing decision that flips inside +-eps makes the loss jump; the test
// asserts that such jumps are rare (every route's expert and slot are compared, by hash, before and
// after each probe, and a probe that moved one is left out).
#include <gtest/gtest.h>

#include <cmath>

#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/moe_gate.hpp"
#include "hpct/model/gpt.hpp"
#include "staged_cpu_ops.hpp"

using namespace hpct;

namespace {
struct Variant {
  int topk;
  bool residual;
};

model::GptConfig tiny_moe(const Variant& v) {
  model::GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_heads = 2;
  c.max_seq_length = 8;
  c.vocab_size = 23;
  c.vocab_multiple = 8;
  c.init_std = 0.2;
  c.moe.num_experts = {4};
  c.moe.expert_interval = 2;  // layer 2 (1-based) is MoE
  c.moe.topk = v.topk;
  c.moe.residual = v.residual;
  c.moe.train_capacity_factor = c.moe.eval_capacity_factor = 0.75;  // drops tokens
  c.moe.min_capacity = 1;
  c.moe.second_expert_sampling = false;  // training and evaluation route alike
  c.moe.loss_coeff = 0.1;
  c.moe.z_loss_coeff = 0.05;
  return c;
}

// The loss forward_backward differentiates with dloss = 1: token losses + N (coeff aux + zc z).
double total_loss(model::Gpt& m, model::ParamStore& st, const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt,
                  int B, int T, std::vector<long long>* load) {
  m.reset_moe_stats();
  double l = m.forward_loss(st, tok.data(), tgt.data(), B, T);
  const auto& cfg = m.config().moe;
  if (load) load->clear();
  for (const auto& s : m.moe_stats()) {
    l += double(B) * T * (cfg.loss_coeff * s.aux_loss + cfg.z_loss_coeff * s.z_loss);
    if (load) load->push_back(static_cast<long long>(s.routing_hash));
  }
  return l;
}
}  // namespace

class MoeBackward : public ::testing::TestWithParam<Variant> {};

TEST_P(MoeBackward, MatchesFiniteDifferences) {
  const Variant v = GetParam();
  const int B = 2, T = 8;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 7 + 3) % 23, tgt[i] = (i * 5 + 1) % 23;
  model::Gpt m(tiny_moe(v), kernels::Precision::fp32, false);
  m.set_routing_seed(99);
  std::vector<float> p(m.layout().numel()), g(p.size(), 0.0f), dummy(p.size());
  m.init_params(p.data(), 42);
  model::FlatParamStore st(m.layout(), p.data(), g.data());
  m.forward_backward(st, tok.data(), tgt.data(), B, T, 1.0f);
  ASSERT_EQ(m.moe_stats().size(), 1u);
  EXPECT_GT(m.moe_stats()[0].dropped, 0) << "capacity factor 0.75 must drop routes";
  model::FlatParamStore fst(m.layout(), p.data(), dummy.data());
  std::vector<long long> load0, load;
  total_loss(m, fst, tok, tgt, B, T, &load0);
  int checked = 0, bad = 0, flips = 0, router = 0;
  for (const auto& t : m.layout().tensors()) {
    if (t.name.find("layers.1.") != 0 && t.name.find("embedding.word") != 0) continue;  // the MoE layer (and wte)
    const size_t step = std::max<size_t>(1, t.numel / 6);
    for (size_t k = 0; k < t.numel; k += step) {
      const size_t i = t.offset + k;
      if (t.name.find("word_embeddings") != std::string::npos && k / 16 >= 23) continue;  // padding rows
      const float keep = p[i], eps = 1e-2f;
      p[i] = keep + eps;
      double lp = total_loss(m, fst, tok, tgt, B, T, &load);
      bool same = load == load0;
      p[i] = keep - eps;
      double lm = total_loss(m, fst, tok, tgt, B, T, &load);
      same = same && load == load0;
      p[i] = keep;
      if (!same) {  // a route flipped inside the probe: the loss is not differentiable there
        ++flips;
        continue;
      }
      const double fd = (lp - lm) / (2 * eps);
      ++checked;
      if (t.name.find("router") != std::string::npos) ++router;
      if (std::fabs(fd - g[i]) > 5e-3 + 3e-2 * std::fabs(fd))
        if (bad++ < 8) ADD_FAILURE() << t.name << "[" << k << "] analytic " << g[i] << " fd " << fd;
    }
  }
  EXPECT_GT(checked, 60);
  EXPECT_GE(router, 4) << "the router's gradient must be checked";
  EXPECT_LE(flips, checked / 10);
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Gating, MoeBackward,
                         ::testing::Values(Variant{1, false}, Variant{2, false}, Variant{1, true}),
                         [](const auto& info) {
                           return "top" + std::to_string(info.param.topk) + (info.param.residual ? "_residual" : "");
                         });

// Recompute reruns the MoE forward in backward (routing, all of it): gradients bitwise equal. With
// communication-aware checkpointing the rerun replays from the kept routing, rows and outputs
// (and residual MoE's dense output): bitwise equal too, and it holds memory for them.
TEST(Moe, RecomputeGivesIdenticalGradients) {
  const int B = 2, T = 8;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 3 + 1) % 23, tgt[i] = (i * 11 + 2) % 23;
  for (bool residual : {false, true}) {
    std::vector<float> grads[3];
    double loss[3];
    for (int r = 0; r < 3; ++r) {
      model::GptConfig c = tiny_moe({1, residual});
      c.moe.noisy_gate_policy = "Jitter";  // noise too must be reproduced exactly
      model::Gpt m(c, kernels::Precision::fp32, r >= 1);
      m.set_communication_aware_checkpointing(r == 2);
      m.set_routing_seed(5);
      std::vector<float> p(m.layout().numel());
      grads[r].assign(p.size(), 0.0f);
      m.init_params(p.data(), 3);
      model::FlatParamStore st(m.layout(), p.data(), grads[r].data());
      loss[r] = m.forward_backward(st, tok.data(), tgt.data(), B, T, 0.5f);
      EXPECT_EQ(m.kept_for_replay_bytes() > 0, r == 2);
    }
    EXPECT_EQ(grads[0], grads[1]) << (residual ? "residual " : "") << "recompute";
    EXPECT_EQ(grads[0], grads[2]) << (residual ? "residual " : "") << "recompute with CAC";
    EXPECT_EQ(loss[0], loss[2]);
  }
}

// The gate runs on the backend (OpsBackend::moe_gate_*): on a device backend the only thing of the
// MoE layer that crosses to the host in a training step is the gate's summary, once per MoE layer's
// forward (the experts' row counts and the losses; drop_tokens false reads nothing more: its capacity
// is N), and nothing in backward. Checked on the staged backend (device paths, host memory):
// its blocking downloads and their bytes exactly (a dense step has none, and downloads only its token
// losses beside the backward: test_gpt), and the step's
// loss and gradients bitwise the CPU backend's, for top-1 with RTS, top-2, and no dropping.
TEST(Moe, TheGateStaysOnTheBackend) {
  const int B = 2, T = 8;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 5 + 2) % 23, tgt[i] = (i * 3 + 7) % 23;
  for (int variant = 0; variant < 3; ++variant) {
    model::GptConfig c = tiny_moe({variant == 1 ? 2 : 1, false});
    c.moe.drop_tokens = variant != 2;
    auto step = [&](kernels::OpsBackend* be) {
      model::Gpt m(c, kernels::Precision::fp32, false, be);
      m.set_routing_seed(17);
      std::vector<float> p(m.layout().numel()), g(p.size(), 0.0f);
      m.init_params(p.data(), 5);
      model::FlatParamStore st(m.layout(), p.data(), g.data());
      const double loss = m.forward_backward(st, tok.data(), tgt.data(), B, T, 1.0f);
      return std::make_pair(loss, g);
    };
    test::StagedCpuOps staged;
    staged.defer_transfers(true);
    const auto cpu = step(nullptr), dev = step(&staged);
    const std::string what = "variant " + std::to_string(variant);
    EXPECT_EQ(dev.first, cpu.first) << what;
    EXPECT_EQ(dev.second, cpu.second) << what;
    const int E = c.moe.num_experts[0];
    EXPECT_EQ(staged.blocking_downloads(), 1) << what << ": one MoE layer";
    const double summary = double(kernels::gate_summary_words(E)) * sizeof(int64_t);
    EXPECT_EQ(staged.bytes_to_host(), summary + B * T * sizeof(float)) << what << ": and the token losses";
  }
}

TEST(Moe, LayoutListsEveryExpertUnderItsGlobalIndex) {
  model::GptConfig c = tiny_moe({1, false});
  c.num_layers = 4;
  c.moe.num_experts = {2, 6};  // pyramid: layer 2 has 2 experts, layer 4 has 6
  const ParamLayout l = model::Gpt::layout_for(c);
  EXPECT_NO_THROW(l.find("layers.3.mlp.experts.5.dense_h_to_4h.weight"));
  EXPECT_NO_THROW(l.find("layers.1.mlp.router.weight"));
  EXPECT_THROW(l.find("layers.1.mlp.experts.2.dense_h_to_4h.weight"), Error);
  EXPECT_THROW(l.find("layers.3.mlp.dense_h_to_4h.weight"), Error);  // no dense MLP in a standard MoE layer
  EXPECT_EQ(l.blocks_of(ReduceGroup::expert).size(), 8u);
  EXPECT_EQ(l.find("layers.3.mlp.router.weight").shape, (std::vector<int64_t>{6, 16}));
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kernels::BackendScope backend;
  return RUN_ALL_TESTS();
}
