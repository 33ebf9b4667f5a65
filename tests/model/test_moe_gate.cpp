// The MoE gate against hand-worked routings (capacity, drop order, RTS, top-2 placement and
// renormalisation), hand-computed aux and z losses, and its backward against central differences of
// a double-precision re-implementation of the forward with the choices and keep masks held fixed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/model/moe_gate.hpp"

using namespace hpct;
using namespace hpct::model;

namespace {

GateConfig gate(int E, int k) {
  GateConfig c;
  c.num_experts = E;
  c.topk = k;
  return c;
}

double sigmoid(double d) { return 1.0 / (1.0 + std::exp(-d)); }

std::vector<double> softmax_row(const std::vector<float>& x, int n, int E) {
  std::vector<double> p(E);
  double s = 0;
  for (int e = 0; e < E; ++e) s += p[e] = std::exp(double(x[n * E + e]));
  for (double& v : p) v /= s;
  return p;
}

std::vector<float> random_logits(int N, int E, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(N) * E);
  for (float& v : x) v = static_cast<float>(scale * rng.normal());
  return x;
}

}  // namespace

TEST(MoeGate, CapacityTable) {
  struct Row {
    int tokens, E, k;
    double cf;
    int min_cap, expect;
  };
  const Row rows[] = {
      {64, 8, 1, 1.0, 4, 8},     // S/E
      {64, 8, 2, 1.0, 4, 16},    // k = 2 doubles it
      {64, 8, 1, 1.25, 4, 10},   // factor
      {100, 16, 1, 1.0, 4, 7},   // ceil(6.25)
      {10, 3, 2, 1.0, 0, 7},     // ceil(6.67)
      {7, 4, 1, 0.01, 0, 1},     // ceil(0.0175)
      {10, 4, 1, 1.0, 4, 4},     // ceil(2.5) = 3 raised to min_capacity
      {2, 2, 1, 1.0, 4, 2},      // fewer tokens than min_capacity: clamped to tokens (DS would assert)
      {8, 2, 2, 2.0, 4, 8},      // k*cf*S/E = 16 > S: clamped to tokens (DS #5353)
      {64, 8, 1, 1e30, 4, 64},   // absurd factor: clamp, no int overflow
      {0, 4, 1, 1.0, 4, 0},      // no tokens
  };
  for (const Row& r : rows) {
    GateConfig c = gate(r.E, r.k);
    c.capacity_factor = r.cf;
    c.min_capacity = r.min_cap;
    EXPECT_EQ(moe_capacity(r.tokens, c), r.expect)
        << "tokens " << r.tokens << " E " << r.E << " k " << r.k << " cf " << r.cf << " min " << r.min_cap;
  }
}

TEST(MoeGate, Top1DropsByPositionWithoutRts) {
  // Experts wanted: 0 1 0 0 1 1; capacity 2 drops the third claimant of each (tokens 3 and 5).
  const std::vector<float> x = {2, 0, 0, 1, 1, 0, 3, 0, 0, 2, 0, 3};  // (6, 2)
  GateConfig c = gate(2, 1);
  c.use_rts = false;
  Routing r = select_experts(x.data(), 6, c, 7, /*training=*/true);
  assign_slots(r, 2, c, 7, true);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1, 0, 0, 1, 1}));
  EXPECT_EQ(r.slot, (std::vector<int32_t>{0, 0, 1, -1, 1, -1}));
  const double w[] = {sigmoid(2), sigmoid(1), sigmoid(1), 0, sigmoid(2), 0};  // raw prob, not renormalised
  for (int n = 0; n < 6; ++n) EXPECT_NEAR(r.weight[n], w[n], 1e-7) << n;
  EXPECT_EQ(r.demand, (std::vector<int32_t>{3, 3}));
  EXPECT_EQ(r.load, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(r.dropped, 2);
  EXPECT_EQ(r.capacity, 2);
}

TEST(MoeGate, Top1RtsKeepsHighestPriorities) {
  const int N = 16, E = 2, C = 3;
  const uint64_t seed = 1234;
  const std::vector<float> x = random_logits(N, E, 99);
  GateConfig c = gate(E, 1);  // use_rts = true
  Routing r = select_experts(x.data(), N, c, seed, true);
  assign_slots(r, C, c, seed, true);
  bool differs_from_position = false;
  for (int e = 0; e < E; ++e) {
    std::vector<int> want;  // tokens routed to e
    for (int n = 0; n < N; ++n)
      if (r.expert[n] == e) want.push_back(n);
    ASSERT_GT(static_cast<int>(want.size()), C) << "expert " << e << ": pick logits that overflow it";
    std::vector<int> by_prio = want;
    std::sort(by_prio.begin(), by_prio.end(),
              [&](int a, int b) { return rts_priority(seed, a) > rts_priority(seed, b); });
    std::vector<int> kept(by_prio.begin(), by_prio.begin() + C);
    std::sort(kept.begin(), kept.end());
    if (kept != std::vector<int>(want.begin(), want.begin() + C)) differs_from_position = true;
    int next_slot = 0;
    for (int n : want) {
      if (std::find(kept.begin(), kept.end(), n) != kept.end()) {
        EXPECT_EQ(r.slot[n], next_slot++) << "token " << n;  // slots in token order among the kept
        EXPECT_EQ(r.weight[n], r.probs[n * E + e]);
      } else {
        EXPECT_EQ(r.slot[n], -1) << "token " << n;
        EXPECT_EQ(r.weight[n], 0.f);
      }
    }
    EXPECT_EQ(r.load[e], C);
  }
  EXPECT_TRUE(differs_from_position) << "seed gives the positional choice; the test would not see RTS";
  EXPECT_EQ(r.dropped, N - E * C);
  for (int n = 0; n < N; ++n) {
    EXPECT_GT(rts_priority(seed, n), 0.0);
    EXPECT_LT(rts_priority(seed, n), 1.0);
  }
}

TEST(MoeGate, TokenRoutingIndependentOfBatchSize) {
  // Noise on (RSample for top-1, 2nd-expert sampling for top-2): token n's draws depend on (seed, n) only.
  const int E = 4;
  const uint64_t seed = 5;
  const std::vector<float> x = random_logits(8, E, 3, 0.3);  // small logits: the noise decides often
  for (int k = 1; k <= 2; ++k) {
    GateConfig c = gate(E, k);
    c.noise = GateNoise::rsample;
    Routing r4 = select_experts(x.data(), 4, c, seed, true);
    Routing r8 = select_experts(x.data(), 8, c, seed, true);
    assign_slots(r4, 8, c, seed, true);
    assign_slots(r8, 8, c, seed, true);
    EXPECT_EQ(r4.dropped, 0);
    EXPECT_EQ(r8.dropped, 0);
    for (int i = 0; i < 4 * k; ++i) {
      EXPECT_EQ(r4.expert[i], r8.expert[i]) << "k " << k << " route " << i;
      EXPECT_EQ(r4.weight[i], r8.weight[i]) << "k " << k << " route " << i;
      // A second choice queues behind ALL first choices of its expert, later tokens' included (DS).
      int later_firsts = 0;
      if (i % k == 1)
        for (int n = 4; n < 8; ++n) later_firsts += r8.expert[n * k] == r8.expert[i];
      EXPECT_EQ(r4.slot[i] + later_firsts, r8.slot[i]) << "k " << k << " route " << i;
    }
  }
}

TEST(MoeGate, Top2FirstChoicesFirstDropByPositionRenormalise) {
  // (first, second) = (0,1) (0,2) (1,2) (2,1) (0,1); first choices per expert 3, 1, 1; capacity 2.
  // Token 2's first choice (expert 1) takes slot 0 before token 0's second choice, which gets slot 1.
  const std::vector<float> x = {3, 2, 0, 3, 0, 2, 0, 3, 2, 0, 2, 3, 3, 2, 0};  // (5, 3)
  GateConfig c = gate(3, 2);
  Routing r = select_experts(x.data(), 5, c, 11, /*training=*/false);  // no sampling: 2nd-largest logit
  assign_slots(r, 2, c, 11, false);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1, 0, 2, 1, 2, 2, 1, 0, 1}));
  EXPECT_EQ(r.slot, (std::vector<int32_t>{0, 1, 1, 1, 0, -1, 0, -1, -1, -1}));
  const float w[] = {float(sigmoid(1)), float(sigmoid(-1)), float(sigmoid(1)), float(sigmoid(-1)), 1, 0, 1, 0, 0, 0};
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(r.weight[i], w[i], 1e-7) << "route " << i;
  EXPECT_EQ(r.weight[4], 1.f);  // second route dropped: the first takes the whole weight, exactly
  EXPECT_EQ(r.weight[6], 1.f);
  EXPECT_EQ(r.demand, (std::vector<int32_t>{3, 4, 3}));
  EXPECT_EQ(r.load, (std::vector<int32_t>{2, 2, 2}));
  EXPECT_EQ(r.dropped, 4);
}

TEST(MoeGate, NoiseOnlyInTraining) {
  const int N = 64, E = 4;
  const uint64_t seed = 77;
  const std::vector<float> x = random_logits(N, E, 8, 0.5);
  // top-1 RSample
  GateConfig c1 = gate(E, 1);
  c1.noise = GateNoise::rsample;
  Routing eval = select_experts(x.data(), N, c1, seed, false);
  Routing train = select_experts(x.data(), N, c1, seed, true);
  int changed = 0;
  for (int n = 0; n < N; ++n) {
    const float* row = &x[n * E];
    EXPECT_EQ(eval.expert[n], std::max_element(row, row + E) - row) << n;
    int want = 0;
    for (int e = 1; e < E; ++e)
      if (row[e] + gate_gumbel(seed, n, e) > row[want] + gate_gumbel(seed, n, want)) want = e;
    EXPECT_EQ(train.expert[n], want) << n;
    changed += train.expert[n] != eval.expert[n];
  }
  EXPECT_GT(changed, 0);
  // top-2 second-expert sampling; the first choice never samples
  GateConfig c2 = gate(E, 2);
  GateConfig c2_off = c2;
  c2_off.second_expert_sampling = false;
  Routing eval2 = select_experts(x.data(), N, c2, seed, false);
  Routing train2 = select_experts(x.data(), N, c2, seed, true);
  Routing off2 = select_experts(x.data(), N, c2_off, seed, true);
  changed = 0;
  for (int n = 0; n < N; ++n) {
    std::vector<int> order(E);
    for (int e = 0; e < E; ++e) order[e] = e;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return x[n * E + a] > x[n * E + b]; });
    EXPECT_EQ(eval2.expert[n * 2], order[0]);
    EXPECT_EQ(train2.expert[n * 2], order[0]);
    EXPECT_EQ(eval2.expert[n * 2 + 1], order[1]) << n;
    EXPECT_EQ(off2.expert[n * 2 + 1], order[1]) << n;
    int want = -1;
    for (int e = 0; e < E; ++e)
      if (e != order[0] && (want < 0 || x[n * E + e] + gate_gumbel(seed, n, e) > x[n * E + want] + gate_gumbel(seed, n, want)))
        want = e;
    EXPECT_EQ(train2.expert[n * 2 + 1], want) << n;
    changed += train2.expert[n * 2 + 1] != order[1];
  }
  EXPECT_GT(changed, 0);
}

TEST(MoeGate, AuxAndZLossByHand) {
  // top-1: first choices 0 0 1 0, so ce = (3/4, 1/4); aux = E * sum me*ce, before any drop.
  const std::vector<float> x1 = {1, 0, 2, 0, 0, 0.5f, 3, 0};  // (4, 2)
  GateConfig c1 = gate(2, 1);
  Routing r1 = select_experts(x1.data(), 4, c1, 0, true);
  assign_slots(r1, 1, c1, 0, true);
  ASSERT_GT(r1.dropped, 0);
  const double me0 = (sigmoid(1) + sigmoid(2) + sigmoid(-0.5) + sigmoid(3)) / 4;
  EXPECT_NEAR(r1.aux_loss, 2 * (me0 * 0.75 + (1 - me0) * 0.25), 1e-7);
  double z = 0;
  for (int n = 0; n < 4; ++n) {
    const double lse = std::log(std::exp(double(x1[2 * n])) + std::exp(double(x1[2 * n + 1])));
    z += lse * lse / 4;
  }
  EXPECT_NEAR(r1.z_loss, z, 1e-6);

  // top-2 (the routing of Top2FirstChoicesFirst...): ce from FIRST choices only = (3/5, 1/5, 1/5);
  // aux = E*E*mean(me*ce) = E * sum me*ce. A k-hot ce would give a different value.
  const std::vector<float> x2 = {3, 2, 0, 3, 0, 2, 0, 3, 2, 0, 2, 3, 3, 2, 0};  // (5, 3)
  GateConfig c2 = gate(3, 2);
  Routing r2 = select_experts(x2.data(), 5, c2, 0, false);
  std::vector<double> me(3, 0.0);
  double z2 = 0;
  for (int n = 0; n < 5; ++n) {
    const std::vector<double> p = softmax_row(x2, n, 3);
    double s = 0;
    for (int e = 0; e < 3; ++e) {
      me[e] += p[e] / 5;
      s += std::exp(double(x2[n * 3 + e]));
    }
    z2 += std::log(s) * std::log(s) / 5;
  }
  const double ce[] = {0.6, 0.2, 0.2};
  EXPECT_NEAR(r2.aux_loss, 3 * (me[0] * ce[0] + me[1] * ce[1] + me[2] * ce[2]), 1e-7);
  EXPECT_NEAR(r2.z_loss, z2, 1e-6);
}

namespace {
// The forward loss in double for FIXED choices and keep masks (those of r), as a function of the logits.
double reference_loss(const std::vector<double>& x, const Routing& r, const std::vector<float>& dw, double aux_c,
                      double z_c) {
  const int N = r.N, E = r.E, k = r.k;
  std::vector<double> me(E, 0.0), ce(E, 0.0);
  double loss = 0, z = 0;
  for (int n = 0; n < N; ++n) {
    double mx = x[n * E], s = 0;
    for (int e = 1; e < E; ++e) mx = std::max(mx, x[n * E + e]);
    std::vector<double> p(E);
    for (int e = 0; e < E; ++e) s += p[e] = std::exp(x[n * E + e] - mx);
    for (int e = 0; e < E; ++e) me[e] += (p[e] /= s) / N;
    z += (mx + std::log(s)) * (mx + std::log(s)) / N;
    ce[r.expert[n * k]] += 1.0 / N;
    double m[2], pj[2];
    for (int j = 0; j < k; ++j) {
      m[j] = r.slot[n * k + j] >= 0 ? 1 : 0;
      pj[j] = p[r.expert[n * k + j]] * m[j];
    }
    const double den = k == 1 ? 1.0 : std::max(pj[0] + pj[1], double(FLT_EPSILON));
    for (int j = 0; j < k; ++j) loss += dw[n * k + j] * pj[j] / den;
  }
  double aux = 0;
  for (int e = 0; e < E; ++e) aux += me[e] * ce[e] * E;
  return loss + aux_c * aux + z_c * z;
}
}  // namespace

TEST(MoeGate, BackwardMatchesFiniteDifferences) {
  // Tolerance |analytic - fd| <= 1e-6 + 1e-5 |fd|: the analytic gradient is built from fp32 probs
  // (relative error ~1e-7 per entry, a few terms per entry), the reference is double with central
  // differences at h = 1e-5 (truncation ~h^2 ~1e-10, rounding ~1e-16/h ~1e-11). Gradients are O(1);
  // the largest error seen is 7e-9, so the bound has two decades of room and still catches any
  // missing term (those are >= 1e-2 here).
  const int N = 7, E = 4;
  const float aux_c = 0.3f, z_c = 0.2f;
  for (int k = 1; k <= 2; ++k) {
    const std::vector<float> x = random_logits(N, E, 40 + k);
    GateConfig c = gate(E, k);
    c.use_rts = k == 1;
    Routing r = select_experts(x.data(), N, c, 9, true);
    assign_slots(r, k == 1 ? 2 : 3, c, 9, true);
    ASSERT_GT(r.dropped, 0) << "k " << k << ": the test must cover dropped routes";
    Rng rng(100 + k);
    std::vector<float> dw(static_cast<size_t>(N) * k);
    for (float& v : dw) v = static_cast<float>(rng.normal());
    std::vector<float> dx(x.size(), 1e30f);  // must be overwritten
    route_backward(r, x.data(), dw.data(), aux_c, z_c, dx.data());
    std::vector<double> xd(x.begin(), x.end());
    const double h = 1e-5;
    for (size_t i = 0; i < x.size(); ++i) {
      std::vector<double> xp = xd, xm = xd;
      xp[i] += h;
      xm[i] -= h;
      const double fd = (reference_loss(xp, r, dw, aux_c, z_c) - reference_loss(xm, r, dw, aux_c, z_c)) / (2 * h);
      EXPECT_NEAR(dx[i], fd, 1e-6 + 1e-5 * std::fabs(fd)) << "k " << k << " logit " << i;
    }
  }
}

TEST(MoeGate, NoDropWhenCapacityIsMaxDemand) {
  const int N = 20, E = 4;
  const std::vector<float> x = random_logits(N, E, 12);
  for (int k = 1; k <= 2; ++k) {
    GateConfig c = gate(E, k);
    c.drop_tokens = false;
    Routing r = select_experts(x.data(), N, c, 1, true);
    const int max_demand = *std::max_element(r.demand.begin(), r.demand.end());
    EXPECT_THROW(assign_slots(r, max_demand - 1, c, 1, true), hpct::Error);
    assign_slots(r, max_demand, c, 1, true);
    EXPECT_EQ(r.dropped, 0);
    EXPECT_EQ(r.load, r.demand);
    for (int32_t s : r.slot) EXPECT_GE(s, 0);
  }
}

TEST(MoeGate, ValidateNamesTheFlag) {
  auto message = [](GateConfig c, const char* flag = "--moe-train-capacity-factor") {
    try {
      validate(c, flag);
    } catch (const hpct::Error& e) {
      return e.context().key + " | " + e.what();
    }
    return std::string("no error");
  };
  auto has = [](const std::string& s, const char* part) { return s.find(part) != std::string::npos; };
  EXPECT_EQ(message(gate(2, 2)), "no error");
  EXPECT_TRUE(has(message(gate(0, 1)), "--num-experts")) << message(gate(0, 1));
  EXPECT_TRUE(has(message(gate(2, 3)), "--topk 3 exceeds --num-experts 2")) << message(gate(2, 3));
  EXPECT_TRUE(has(message(gate(8, 3)), "--topk")) << message(gate(8, 3));
  EXPECT_TRUE(has(message(gate(8, 0)), "--topk")) << message(gate(8, 0));
  for (double cf : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    GateConfig c = gate(4, 1);
    c.capacity_factor = cf;
    EXPECT_TRUE(has(message(c), "--moe-train-capacity-factor")) << cf << ": " << message(c);
    EXPECT_TRUE(has(message(c, "--moe-eval-capacity-factor"), "--moe-eval-capacity-factor")) << cf;
  }
  GateConfig c = gate(4, 1);
  c.min_capacity = -1;
  EXPECT_TRUE(has(message(c), "--moe-min-capacity")) << message(c);
}

// The device's way to the slots (kernels/moe_gate.hpp: counting, per token, the tokens of its
// expert ahead of it in RTS order and the earlier routes of its expert, where the host sorts and
// fills in token order), run here on the host through the same code the kernel runs: the same
// slots as assign_slots, for top-1 with RTS at several capacities, without RTS, without dropping,
// and top-2, on random logits and on logits with many exact ties (few distinct values).
TEST(MoeGate, TheDevicesCountingGivesTheSortedSlots) {
  const int N = 203, E = 6;
  for (int ties = 0; ties < 2; ++ties) {
    std::vector<float> x = random_logits(N, E, 11 + ties, 1.5);
    if (ties)
      for (float& v : x) v = std::round(v);  // a handful of values: equal probabilities, equal priorities' experts
    for (int k : {1, 2})
      for (int mode = 0; mode < 3; ++mode) {  // 0: RTS (top-1), 1: no RTS, 2: no dropping
        GateConfig c = gate(E, k);
        c.use_rts = mode == 0;
        c.drop_tokens = mode != 2;
        Routing r = select_experts(x.data(), N, c, 5, /*training=*/true);
        const int most = *std::max_element(r.demand.begin(), r.demand.end());
        for (int capacity : {1, 7, moe_capacity(N, c), most}) {
          if (!c.drop_tokens && capacity < most) continue;
          assign_slots(r, capacity, c, 5, true);
          const std::vector<int32_t> counted =
              hpct::kernels::gate_slots_by_counting(r.expert.data(), r.summary.data(), N, capacity, c, 5);
          EXPECT_EQ(counted, r.slot) << "k " << k << " mode " << mode << " capacity " << capacity << " ties " << ties;
        }
      }
  }
}
