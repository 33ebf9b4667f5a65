// MoE router math with DeepSpeed-MoE semantics (deepspeed/moe/sharded_moe.py: top1gating, top2gating);
// see moe_gate.hpp for what each step does and where it departs from DeepSpeed.
#include "hpct/model/moe_gate.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"

namespace hpct::model {
namespace {

// Stream tags: the RTS and Gumbel draws of one seed are independent of each other.
constexpr uint64_t kRtsStream = 0x5254530000000000ull;     // "RTS"
constexpr uint64_t kGumbelStream = 0x47554d0000000000ull;  // "GUM", low bits = expert

// 53 random bits centred in their cell: strictly inside (0, 1), so log(u) and log(-log(u)) are finite.
double open_unit(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }

// The largest value(e) over e != skip; among equals the lowest index (torch.argmax's convention).
// A NaN never wins a comparison, so the result is always a valid expert.
template <class Value>
int argmax_except(int E, int skip, Value value) {
  int best = -1;
  double best_v = 0;
  for (int e = 0; e < E; ++e) {
    if (e == skip) continue;
    const double v = value(e);
    if (best < 0 || v > best_v) {
      best = e;
      best_v = v;
    }
  }
  return best;
}

}  // namespace

RouteOrder route_order(const Routing& r) {
  RouteOrder o;
  o.first.assign(r.E + 1, 0);
  for (int e = 0; e < r.E; ++e) o.first[e + 1] = o.first[e] + r.load[e];
  o.pos.assign((size_t)r.N * r.k, -1);
  o.source.resize(o.first[r.E]);
  for (int n = 0; n < r.N; ++n)
    for (int k = 0; k < r.k; ++k) {
      const int i = n * r.k + k;
      if (r.slot[i] < 0) continue;
      const size_t p = o.first[r.expert[i]] + r.slot[i];
      o.pos[i] = static_cast<int32_t>(p);
      o.source[p] = n;
    }
  return o;
}

double rts_priority(uint64_t seed, int n) {
  return open_unit(mix_seed(seed, static_cast<uint64_t>(n), kRtsStream));
}

double gate_gumbel(uint64_t seed, int n, int e) {
  const double u = open_unit(mix_seed(seed, static_cast<uint64_t>(n), kGumbelStream | static_cast<uint32_t>(e)));
  return -std::log(-std::log(u));
}

void validate(const GateConfig& cfg, const char* capacity_flag) {
  const std::string k = std::to_string(cfg.topk), E = std::to_string(cfg.num_experts);
  if (cfg.num_experts < 1) throw config_error("--num-experts", "--num-experts must be >= 1, got " + E);
  if (cfg.topk < 1) throw config_error("--topk", "--topk must be >= 1, got " + k);
  if (cfg.topk > cfg.num_experts)
    throw config_error("--topk", "--topk " + k + " exceeds --num-experts " + E, "a token's routes go to distinct experts");
  if (cfg.topk > 2)
    throw config_error("--topk", "--topk " + k + " is not supported", "DeepSpeed-style gating here is top-1 or top-2");
  if (!(cfg.capacity_factor > 0) || !std::isfinite(cfg.capacity_factor))
    throw config_error(capacity_flag,
                       std::string(capacity_flag) + " must be finite and > 0, got " + std::to_string(cfg.capacity_factor));
  if (cfg.min_capacity < 0)
    throw config_error("--moe-min-capacity", "--moe-min-capacity must be >= 0, got " + std::to_string(cfg.min_capacity));
}

int moe_capacity(int tokens, const GateConfig& cfg) {
  validate(cfg);
  HPCT_REQUIRE(tokens >= 0, "moe_capacity: negative token count " + std::to_string(tokens));
  // DeepSpeed's order of operations: (S / E) * (cf * k), then ceil.
  const double c = std::ceil(static_cast<double>(tokens) / cfg.num_experts * (cfg.capacity_factor * cfg.topk));
  if (c >= tokens) return tokens;  // also keeps a huge factor from overflowing the int below
  return std::min(std::max(static_cast<int>(c), cfg.min_capacity), tokens);
}

Routing select_experts(const float* logits, int N, const GateConfig& cfg, uint64_t seed, bool training) {
  validate(cfg);
  HPCT_REQUIRE(N >= 0, "select_experts: negative token count " + std::to_string(N));
  const int E = cfg.num_experts, k = cfg.topk;
  Routing r;
  r.N = N, r.E = E, r.k = k;
  r.probs.resize(static_cast<size_t>(N) * E);
  r.expert.assign(static_cast<size_t>(N) * k, 0);
  r.slot.assign(static_cast<size_t>(N) * k, -1);
  r.weight.assign(static_cast<size_t>(N) * k, 0.f);
  r.demand.assign(E, 0);
  r.load.assign(E, 0);
  const bool rsample = training && k == 1 && cfg.noise == GateNoise::rsample;
  const bool sample2 = training && k == 2 && cfg.second_expert_sampling;
  std::vector<double> me(E, 0.0);     // (E) sum_n probs[n, e]
  std::vector<long long> ce(E, 0);    // (E) first choices per expert
  double z_sum = 0;
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<size_t>(n) * E;  // (E)
    float* p = &r.probs[static_cast<size_t>(n) * E];        // (E)
    const float mx = *std::max_element(x, x + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) {
      p[e] = std::exp(x[e] - mx);
      sum += p[e];
    }
    for (int e = 0; e < E; ++e) {
      p[e] = static_cast<float>(p[e] / sum);
      me[e] += p[e];
    }
    const double lse = mx + std::log(sum);
    z_sum += lse * lse;
    const int e1 = rsample ? argmax_except(E, -1, [&](int e) { return double(x[e]) + gate_gumbel(seed, n, e); })
                           : argmax_except(E, -1, [&](int e) { return double(p[e]); });
    r.expert[static_cast<size_t>(n) * k] = e1;
    ++ce[e1];
    ++r.demand[e1];
    if (k == 2) {
      // DeepSpeed takes the 2nd choice on the logits (plus noise), not on the probs.
      const int e2 = argmax_except(E, e1, [&](int e) { return double(x[e]) + (sample2 ? gate_gumbel(seed, n, e) : 0.0); });
      r.expert[static_cast<size_t>(n) * 2 + 1] = e2;
      ++r.demand[e2];
    }
  }
  if (N > 0) {
    // top-1: E * sum(me*ce); top-2: E*E*mean(me*ce1), the same number.
    double aux = 0;
    for (int e = 0; e < E; ++e) aux += (me[e] / N) * (static_cast<double>(ce[e]) / N);
    r.aux_loss = aux * E;
    r.z_loss = z_sum / N;
  }
  return r;
}

void assign_slots(Routing& r, int capacity, const GateConfig& cfg, uint64_t seed, bool /*training*/) {
  const int N = r.N, E = r.E, k = r.k;
  HPCT_REQUIRE(capacity >= 0, "assign_slots: negative capacity " + std::to_string(capacity));
  HPCT_REQUIRE(k == cfg.topk && E == cfg.num_experts, "assign_slots: routing and GateConfig disagree on k or E");
  if (!cfg.drop_tokens) {
    const int max_demand = E > 0 ? *std::max_element(r.demand.begin(), r.demand.end()) : 0;
    HPCT_REQUIRE(capacity >= max_demand, "assign_slots: drop_tokens=false needs capacity >= max demand " +
                                             std::to_string(max_demand) + ", got " + std::to_string(capacity));
  }
  r.capacity = capacity;
  std::fill(r.slot.begin(), r.slot.end(), -1);
  std::fill(r.weight.begin(), r.weight.end(), 0.f);
  std::fill(r.load.begin(), r.load.end(), 0);
  r.dropped = 0;
  std::vector<int32_t> fill(E, 0);  // (E) next free slot
  if (k == 1) {
    std::vector<char> keep(N, 1);  // (N) survives RTS
    if (cfg.drop_tokens && cfg.use_rts) {
      // Per expert, keep the `capacity` demanding tokens of highest priority (DS: topk(mask1 * U, C)).
      std::vector<double> prio(N);
      for (int n = 0; n < N; ++n) prio[n] = rts_priority(seed, n);
      std::vector<int> order(N);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int a, int b) {
        if (r.expert[a] != r.expert[b]) return r.expert[a] < r.expert[b];
        if (prio[a] != prio[b]) return prio[a] > prio[b];
        return a < b;
      });
      int run = 0;
      for (int i = 0; i < N; ++i) {
        run = (i > 0 && r.expert[order[i]] == r.expert[order[i - 1]]) ? run + 1 : 0;
        if (run >= capacity) keep[order[i]] = 0;
      }
    }
    // Slots in token order among the kept (DS: cumsum(new_mask1) - 1); without RTS, drop by position.
    for (int n = 0; n < N; ++n) {
      const int e = r.expert[n];
      if (keep[n] && fill[e] < capacity) {
        r.slot[n] = fill[e]++;
        r.weight[n] = r.probs[static_cast<size_t>(n) * E + e];
      } else {
        ++r.dropped;
      }
    }
  } else {
    std::vector<int32_t> first(E, 0);  // (E) first choices per expert, placed before any second choice
    for (int n = 0; n < N; ++n) ++first[r.expert[static_cast<size_t>(n) * 2]];
    std::vector<int32_t> second(E, 0);
    for (int n = 0; n < N; ++n) {
      const int e1 = r.expert[static_cast<size_t>(n) * 2], e2 = r.expert[static_cast<size_t>(n) * 2 + 1];
      const int loc1 = fill[e1]++, loc2 = first[e2] + second[e2]++;
      const bool m1 = loc1 < capacity, m2 = loc2 < capacity;
      const float p1 = m1 ? r.probs[static_cast<size_t>(n) * E + e1] : 0.f;
      const float p2 = m2 ? r.probs[static_cast<size_t>(n) * E + e2] : 0.f;
      const float den = std::max(p1 + p2, FLT_EPSILON);  // DS: clamp(min=torch.finfo(fp32).eps)
      r.slot[static_cast<size_t>(n) * 2] = m1 ? loc1 : -1;
      r.slot[static_cast<size_t>(n) * 2 + 1] = m2 ? loc2 : -1;
      r.weight[static_cast<size_t>(n) * 2] = p1 / den;
      r.weight[static_cast<size_t>(n) * 2 + 1] = p2 / den;
      r.dropped += !m1 + !m2;
    }
  }
  for (size_t i = 0; i < r.slot.size(); ++i)
    if (r.slot[i] >= 0) ++r.load[r.expert[i]];
}

void route_backward(const Routing& r, const float* logits, const float* dweight, float aux_coeff, float z_coeff,
                    float* dlogits) {
  const int N = r.N, E = r.E, k = r.k;
  if (N == 0) return;
  std::vector<double> ce(E, 0.0);  // (E) fraction of first choices: a constant, as in DeepSpeed
  for (int n = 0; n < N; ++n) ce[r.expert[static_cast<size_t>(n) * k]] += 1.0 / N;
  std::vector<double> dp(E);  // (E) d(loss)/d(probs[n, :])
  for (int n = 0; n < N; ++n) {
    const float* p = &r.probs[static_cast<size_t>(n) * E];
    const float* x = logits + static_cast<size_t>(n) * E;
    const float* dw = dweight + static_cast<size_t>(n) * k;
    const int32_t* ex = &r.expert[static_cast<size_t>(n) * k];
    const int32_t* sl = &r.slot[static_cast<size_t>(n) * k];
    // aux = E * sum_e ce[e] * mean_n p[n, e]
    for (int e = 0; e < E; ++e) dp[e] = static_cast<double>(aux_coeff) * E * ce[e] / N;
    if (k == 1) {
      if (sl[0] >= 0) dp[ex[0]] += dw[0];  // weight = p[e1]
    } else {
      // w_j = p_j m_j / S, S = p_1 m_1 + p_2 m_2 (clamped at eps, where the clamp passes no gradient):
      // dL/dp_j = m_j (dw_j - sum_i dw_i w_i) / S.
      const float p1 = sl[0] >= 0 ? p[ex[0]] : 0.f, p2 = sl[1] >= 0 ? p[ex[1]] : 0.f;
      const float s = p1 + p2;
      const double g = s >= FLT_EPSILON ? double(dw[0]) * r.weight[static_cast<size_t>(n) * 2] +
                                              double(dw[1]) * r.weight[static_cast<size_t>(n) * 2 + 1]
                                        : 0.0;
      const double den = std::max(s, FLT_EPSILON);
      for (int j = 0; j < 2; ++j)
        if (sl[j] >= 0) dp[ex[j]] += (dw[j] - g) / den;
    }
    // softmax backward, plus z = mean_n lse_n^2 whose gradient is (2/N) lse_n p[n, e].
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
    const float mx = *std::max_element(x, x + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(double(x[e]) - mx);
    const double zg = static_cast<double>(z_coeff) * 2.0 / N * (mx + std::log(sum));
    for (int e = 0; e < E; ++e) dlogits[static_cast<size_t>(n) * E + e] = static_cast<float>(p[e] * (dp[e] - dot + zg));
  }
}

}  // namespace hpct::model
