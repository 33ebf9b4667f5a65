// The MoE gate on the CUDA backend (OpsBackend::moe_gate_*, cuda/moe_gate.cu) against the host
// functions (kernels/moe_gate.hpp) on the same logits: top-1 with Random Token Selection, without
// it, with RSample noise, without dropping, and top-2 with and without second-expert sampling; N
// not a multiple of the block size, E from 2 to 64, random logits and logits with many exact ties.
// Without a CUDA device every test is SKIPPED.
//
// Tolerances: the routes (expert, slot, position, source row) and every count of the summary
// (demand, first choices, load, dropped, the routing hash) bitwise: they are integers decided by
// comparisons of values both sides compute with the same code (moe_gate_math.hpp, no contraction
// on either side). The probabilities, combine weights and the aux and z losses bitwise too, except
// that the device's double exp and log may differ from glibc's in the last bit: allowed 1 fp32 ulp
// (2^-23 relative) on a probability or weight and 1e-11 relative on the losses (a probability one
// ulp off moves the aux loss by about 1e-12), which would still catch any other arithmetic. The backward's d(logits): 1e-6 relative + 1e-9 absolute (the same
// code in double, rounded to fp32 once; the same last-bit caveat).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "hpct/kernels/moe_gate.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "cuda_test_util.hpp"

using namespace hpct::kernels;
using namespace hpct::kernels::test;  // cuda_test_util.hpp

namespace {

[[maybe_unused]] const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new BackendEnv);

// One gate call's arrays on the host, or their device twins.
struct Arrays {
  std::vector<float> probs, weight;
  std::vector<int32_t> expert, slot, pos, source;
  std::vector<int64_t> summary;
  std::vector<double> scratch;
  Arrays(int N, int E, int k)
      : probs((size_t)N * E), weight((size_t)N * k), expert((size_t)N * k), slot((size_t)N * k), pos((size_t)N * k),
        source((size_t)N * k), summary(gate_summary_words(E)), scratch(N) {}
  GateRoutes host() {
    return GateRoutes{probs.data(), expert.data(), slot.data(), weight.data(), pos.data(), source.data(), summary.data(),
                      scratch.data()};
  }
  GateRoutes device(Gpu& g) {
    return GateRoutes{g.put(probs), g.put(expert), g.put(slot), g.put(weight), g.put(pos), g.put(source),
                      g.put(summary), g.put(scratch)};
  }
  template <class T>
  static void get(Gpu& g, std::vector<T>& h, const T* d) {
    g.be->copy_to_host(h.data(), d, h.size() * sizeof(T));
  }
  void read(Gpu& g, const GateRoutes& d) {
    get(g, probs, d.probs), get(g, weight, d.weight), get(g, expert, d.expert), get(g, slot, d.slot);
    get(g, pos, d.pos), get(g, source, d.source), get(g, summary, d.summary);
  }
};

struct Case {
  int N, E, k;
  bool rts, drop, training;
  GateNoise noise;
  bool sample2;
  bool ties;
  double factor = 1.0;  // capacity factor
  std::string name() const {
    return "N" + std::to_string(N) + " E" + std::to_string(E) + " top" + std::to_string(k) + (rts ? " rts" : "") +
           (drop ? "" : " no-drop") + (training ? " train" : " eval") + (noise == GateNoise::rsample ? " rsample" : "") +
           (sample2 ? " sample2" : "") + (ties ? " ties" : "") + " cf" + std::to_string(factor);
  }
};

void expect_ulp(const std::string& what, const std::vector<float>& gpu, const std::vector<float>& cpu) {
  ASSERT_EQ(gpu.size(), cpu.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < cpu.size(); ++i)
    if (!(std::fabs(gpu[i] - cpu[i]) <= 0x1.0p-23f * std::fabs(cpu[i])) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": first at " << first << ": gpu " << gpu[first] << " cpu " << cpu[first];
}

}  // namespace

TEST(CudaMoeGate, RoutesAndBackwardAreTheHosts) {
  NEED_GPU(g);
  const Case cases[] = {
      {1000, 8, 1, true, true, true, GateNoise::none, false, false},
      {1000, 8, 1, true, true, true, GateNoise::none, false, true},
      {4099, 64, 1, true, true, true, GateNoise::none, false, false},
      {777, 16, 1, false, true, false, GateNoise::none, false, false},
      {777, 16, 1, true, true, true, GateNoise::rsample, false, false},
      {513, 4, 1, true, false, true, GateNoise::none, false, true},
      {1000, 8, 2, false, true, true, GateNoise::none, true, false},
      {1000, 8, 2, false, true, false, GateNoise::none, true, true},
      {300, 2, 2, false, false, true, GateNoise::none, false, false},
      {1000, 8, 2, false, true, true, GateNoise::none, true, false, 0.4},   // first choices dropped too
      {2000, 300, 1, true, true, true, GateNoise::none, false, false},      // experts > threads of a block
  };
  for (const Case& c : cases) {
    GateConfig cfg;
    cfg.num_experts = c.E, cfg.topk = c.k, cfg.use_rts = c.rts, cfg.drop_tokens = c.drop;
    cfg.noise = c.noise, cfg.second_expert_sampling = c.sample2, cfg.capacity_factor = c.factor, cfg.min_capacity = 4;
    Vec x = randn((size_t)c.N * c.E, 3 + c.N + c.E, 2.0f);
    if (c.ties)
      for (float& v : x) v = std::round(v);
    const uint64_t seed = 0x5eed + c.E;
    Arrays cpu(c.N, c.E, c.k), gpu(c.N, c.E, c.k);
    const GateRoutes h = cpu.host(), d = gpu.device(g);
    const float* dx = g.put(x);
    gate_select(h, x.data(), c.N, cfg, seed, c.training);
    g.be->moe_gate_select(d, dx, c.N, cfg, seed, c.training);
    const int capacity = c.drop ? moe_capacity(c.N, cfg) : static_cast<int>(*std::max_element(cpu.summary.begin(), cpu.summary.begin() + c.E));
    gate_assign(h, c.N, capacity, cfg, seed);
    g.be->moe_gate_assign(d, c.N, capacity, cfg, seed);
    gpu.read(g, d);
    const std::string what = c.name();
    EXPECT_EQ(gpu.expert, cpu.expert) << what;
    EXPECT_EQ(gpu.slot, cpu.slot) << what;
    EXPECT_EQ(gpu.pos, cpu.pos) << what;
    const GateSummary sc = GateSummary::read(cpu.summary.data(), c.E), sg = GateSummary::read(gpu.summary.data(), c.E);
    EXPECT_EQ(sg.demand, sc.demand) << what;
    EXPECT_EQ(sg.first, sc.first) << what;
    EXPECT_EQ(sg.load, sc.load) << what;
    EXPECT_EQ(sg.dropped, sc.dropped) << what;
    EXPECT_EQ(sg.hash, sc.hash) << what;
    EXPECT_NEAR(sg.aux_loss, sc.aux_loss, 1e-11 * std::fabs(sc.aux_loss)) << what;
    EXPECT_NEAR(sg.z_loss, sc.z_loss, 1e-11 * std::fabs(sc.z_loss)) << what;
    if (c.drop && (c.k == 1 || c.factor < 1)) {
      EXPECT_GT(sc.dropped, 0) << what << ": the case should drop";
    }
    if (c.k == 2 && c.factor < 1) {
      bool first_dropped = false;
      for (int n = 0; n < c.N; ++n) first_dropped |= cpu.slot[2 * n] < 0;
      EXPECT_TRUE(first_dropped) << what << ": a first choice should be dropped";
    }
    const size_t kept = static_cast<size_t>(sc.kept());
    EXPECT_EQ(std::vector<int32_t>(gpu.source.begin(), gpu.source.begin() + kept),
              std::vector<int32_t>(cpu.source.begin(), cpu.source.begin() + kept)) << what;
    expect_ulp(what + " probs", gpu.probs, cpu.probs);
    expect_ulp(what + " weight", gpu.weight, cpu.weight);

    // Backward on the same routes.
    const Vec dweight = randn((size_t)c.N * c.k, 7 + c.N, 1.0f);
    Vec dl_cpu((size_t)c.N * c.E), dl_gpu(dl_cpu.size());
    gate_backward(dl_cpu.data(), h, x.data(), dweight.data(), c.N, cfg, 0.01f, 0.001f);
    float* ddl = g.put(dl_gpu);
    g.be->moe_gate_backward(ddl, d, dx, g.put(dweight), c.N, cfg, 0.01f, 0.001f);
    expect_close(what + " dlogits", g.get(ddl, dl_gpu.size()), dl_cpu, 1e-6, 1e-9);

    // Assign again on the same arrays at half the capacity (the device reuses pos and scratch).
    if (c.drop) {
      gate_assign(h, c.N, capacity / 2, cfg, seed);
      g.be->moe_gate_assign(d, c.N, capacity / 2, cfg, seed);
      gpu.read(g, d);
      EXPECT_EQ(gpu.slot, cpu.slot) << what << " at half the capacity";
      EXPECT_EQ(gpu.pos, cpu.pos) << what << " at half the capacity";
      const auto counts = [&](const Arrays& a) {  // every word but the losses
        return std::vector<int64_t>(a.summary.begin(), a.summary.begin() + 3 * c.E + 2);
      };
      EXPECT_EQ(counts(gpu), counts(cpu)) << what << " at half the capacity";
    }
  }
}

// An empty call (no tokens) writes a zero summary and touches nothing else.
TEST(CudaMoeGate, NoTokens) {
  NEED_GPU(g);
  GateConfig cfg;
  cfg.num_experts = 4;
  Arrays a(0, 4, 1);
  a.summary.assign(a.summary.size(), 7);
  const GateRoutes d = a.device(g);
  g.be->moe_gate_select(d, nullptr, 0, cfg, 1, true);
  g.be->moe_gate_assign(d, 0, 0, cfg, 1);
  Arrays::get(g, a.summary, d.summary);
  for (int64_t w : a.summary) EXPECT_EQ(w, 0);
}
