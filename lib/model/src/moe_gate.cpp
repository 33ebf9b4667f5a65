// The MoE gate's vector API (moe_gate.hpp) over the array functions of kernels/moe_gate.hpp.
#include "hpct/model/moe_gate.hpp"

#include <string>

#include "hpct/core/error.hpp"

namespace hpct::model {

kernels::GateRoutes Routing::arrays() {
  kernels::GateRoutes a;
  a.probs = probs.data();
  a.expert = expert.data();
  a.slot = slot.data();
  a.weight = weight.data();
  a.pos = pos.data();
  a.source = source.data();
  a.summary = summary.data();
  a.scratch = scratch.data();
  return a;
}

RouteOrder route_order(const Routing& r) {
  RouteOrder o;
  o.first.assign(r.E + 1, 0);
  for (int e = 0; e < r.E; ++e) o.first[e + 1] = o.first[e] + r.load[e];
  o.pos = r.pos;
  o.source.assign(r.source.begin(), r.source.begin() + static_cast<std::ptrdiff_t>(o.first[r.E]));
  return o;
}

Routing select_experts(const float* logits, int N, const GateConfig& cfg, uint64_t seed, bool training) {
  validate(cfg);
  HPCT_REQUIRE(N >= 0, "select_experts: negative token count " + std::to_string(N));
  const int E = cfg.num_experts, k = cfg.topk;
  const size_t routes = static_cast<size_t>(N) * k;
  Routing r;
  r.N = N, r.E = E, r.k = k;
  r.probs.resize(static_cast<size_t>(N) * E);
  r.expert.assign(routes, 0);
  r.slot.assign(routes, -1);
  r.weight.assign(routes, 0.f);
  r.pos.assign(routes, -1);
  r.source.assign(routes, 0);
  r.summary.assign(kernels::gate_summary_words(E), 0);
  r.scratch.assign(N, 0.0);
  kernels::gate_select(r.arrays(), logits, N, cfg, seed, training);
  const kernels::GateSummary s = kernels::GateSummary::read(r.summary.data(), E);
  r.demand = s.demand;
  r.load.assign(E, 0);
  r.aux_loss = s.aux_loss;
  r.z_loss = s.z_loss;
  return r;
}

void assign_slots(Routing& r, int capacity, const GateConfig& cfg, uint64_t seed, bool /*training*/) {
  HPCT_REQUIRE(r.k == cfg.topk && r.E == cfg.num_experts, "assign_slots: routing and GateConfig disagree on k or E");
  kernels::gate_assign(r.arrays(), r.N, capacity, cfg, seed);
  const kernels::GateSummary s = kernels::GateSummary::read(r.summary.data(), r.E);
  r.capacity = capacity;
  r.load = s.load;
  r.dropped = s.dropped;
}

void route_backward(const Routing& r, const float* logits, const float* dweight, float aux_coeff, float z_coeff,
                    float* dlogits) {
  if (r.N == 0) return;
  GateConfig cfg;
  cfg.num_experts = r.E;
  cfg.topk = r.k;
  kernels::gate_backward(dlogits, const_cast<Routing&>(r).arrays(), logits, dweight, r.N, cfg, aux_coeff, z_coeff);
}

}  // namespace hpct::model
