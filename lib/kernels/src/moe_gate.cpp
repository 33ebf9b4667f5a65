// The MoE gate on host arrays (moe_gate.hpp): the reference the CUDA kernels (cuda/moe_gate.cu)
// are checked against, and the CPU backend's gate. DeepSpeed-MoE semantics (sharded_moe.py:
// top1gating, top2gating); model/moe_gate.hpp documents each step and where it departs from DS.
#include "hpct/kernels/moe_gate.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "hpct/core/error.hpp"
#include "moe_gate_math.hpp"

namespace hpct::kernels {
namespace {

int64_t double_bits(double v) {
  int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
double bits_double(int64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

}  // namespace

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

long long GateSummary::kept() const { return std::accumulate(load.begin(), load.end(), 0LL); }

GateSummary GateSummary::read(const int64_t* w, int E) {
  GateSummary s;
  s.demand.assign(w, w + E);
  s.first.assign(w + E, w + 2 * E);
  s.load.assign(w + 2 * E, w + 3 * E);
  s.dropped = w[3 * E];
  s.hash = static_cast<uint64_t>(w[3 * E + 1]);
  s.aux_loss = bits_double(w[3 * E + 2]);
  s.z_loss = bits_double(w[3 * E + 3]);
  return s;
}

double rts_priority(uint64_t seed, int n) { return gate::rts_priority(seed, n); }
double gate_gumbel(uint64_t seed, int n, int e) { return gate::gumbel(seed, n, e); }

void gate_select(const GateRoutes& r, const float* logits, int N, const GateConfig& cfg, uint64_t seed, bool training) {
  validate(cfg);
  HPCT_REQUIRE(N >= 0, "gate_select: negative token count " + std::to_string(N));
  const int E = cfg.num_experts, k = cfg.topk;
  const bool rsample = training && k == 1 && cfg.noise == GateNoise::rsample;
  const bool sample2 = training && k == 2 && cfg.second_expert_sampling;
  int64_t* sum = r.summary;
  std::fill(sum, sum + gate_summary_words(E), 0);
  int64_t *demand = sum, *first = sum + E;
  std::vector<double> me(E, 0.0);  // (E) sum_n probs[n, e], in token order
  double z_sum = 0;
  for (int n = 0; n < N; ++n) {
    float* p = r.probs + static_cast<size_t>(n) * E;
    const gate::Choice c = gate::select_token(logits + static_cast<size_t>(n) * E, p, E, k, rsample, sample2, seed, n);
    for (int e = 0; e < E; ++e) me[e] += p[e];
    z_sum += c.lse * c.lse;
    r.expert[static_cast<size_t>(n) * k] = c.e1;
    ++first[c.e1];
    ++demand[c.e1];
    if (k == 2) {
      r.expert[static_cast<size_t>(n) * 2 + 1] = c.e2;
      ++demand[c.e2];
    }
  }
  if (N > 0) {
    // top-1: E * sum(me*ce); top-2: E*E*mean(me*ce1), the same number.
    double aux = 0;
    for (int e = 0; e < E; ++e) aux += (me[e] / N) * (static_cast<double>(first[e]) / N);
    sum[3 * E + 2] = double_bits(aux * E);
    sum[3 * E + 3] = double_bits(z_sum / N);
  }
}

void gate_assign(const GateRoutes& r, int N, int capacity, const GateConfig& cfg, uint64_t seed) {
  const int E = cfg.num_experts, k = cfg.topk;
  HPCT_REQUIRE(capacity >= 0, "gate_assign: negative capacity " + std::to_string(capacity));
  int64_t* sum = r.summary;
  if (!cfg.drop_tokens) {
    const int64_t max_demand = E > 0 ? *std::max_element(sum, sum + E) : 0;
    HPCT_REQUIRE(capacity >= max_demand, "gate_assign: drop_tokens=false needs capacity >= max demand " +
                                             std::to_string(max_demand) + ", got " + std::to_string(capacity));
  }
  int64_t *first = sum + E, *load = sum + 2 * E;
  std::fill(load, load + E, 0);
  long long dropped = 0;
  std::vector<int32_t> fill(E, 0);  // (E) next free slot
  if (k == 1) {
    std::vector<char> keep(N, 1);  // (N) survives RTS
    if (cfg.drop_tokens && cfg.use_rts) {
      // Per expert, keep the `capacity` demanding tokens of highest priority (DS: topk(mask1 * U, C)).
      std::vector<double> prio(N);
      for (int n = 0; n < N; ++n) prio[n] = gate::rts_priority(seed, n);
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
      const bool kept = keep[n] && fill[e] < capacity;
      r.slot[n] = kept ? fill[e]++ : -1;
      r.weight[n] = kept ? r.probs[static_cast<size_t>(n) * E + e] : 0.f;
      dropped += !kept;
    }
  } else {
    std::vector<int32_t> second(E, 0);  // all first choices are placed before any second choice
    for (int n = 0; n < N; ++n) {
      const int e1 = r.expert[static_cast<size_t>(n) * 2], e2 = r.expert[static_cast<size_t>(n) * 2 + 1];
      const int loc1 = fill[e1]++, loc2 = static_cast<int>(first[e2]) + second[e2]++;
      const bool m1 = loc1 < capacity, m2 = loc2 < capacity;
      const float* p = r.probs + static_cast<size_t>(n) * E;
      gate::top2_weights(p[e1], p[e2], m1, m2, r.weight + static_cast<size_t>(n) * 2);
      r.slot[static_cast<size_t>(n) * 2] = m1 ? loc1 : -1;
      r.slot[static_cast<size_t>(n) * 2 + 1] = m2 ? loc2 : -1;
      dropped += !m1 + !m2;
    }
  }
  const size_t routes = static_cast<size_t>(N) * k;
  uint64_t hash = 0;
  for (size_t i = 0; i < routes; ++i) {
    if (r.slot[i] >= 0) ++load[r.expert[i]];
    hash += gate::route_hash(static_cast<long long>(i), r.expert[i], r.slot[i]);
  }
  sum[3 * E] = dropped;
  sum[3 * E + 1] = static_cast<int64_t>(hash);
  // The dispatch's order: rows sorted by (expert, slot).
  std::vector<int64_t> row(E + 1, 0);
  for (int e = 0; e < E; ++e) row[e + 1] = row[e] + load[e];
  for (size_t i = 0; i < routes; ++i) {
    if (r.slot[i] < 0) {
      r.pos[i] = -1;
      continue;
    }
    const int64_t p = row[r.expert[i]] + r.slot[i];
    r.pos[i] = static_cast<int32_t>(p);
    r.source[p] = static_cast<int32_t>(i / k);
  }
}

void gate_backward(float* dlogits, const GateRoutes& r, const float* logits, const float* dweight, int N,
                   const GateConfig& cfg, float aux_coeff, float z_coeff) {
  const int E = cfg.num_experts, k = cfg.topk;
  for (int n = 0; n < N; ++n) {
    const size_t row = static_cast<size_t>(n) * E, route = static_cast<size_t>(n) * k;
    gate::token_backward(dlogits + row, r.probs + row, logits + row, dweight + route, r.expert + route, r.slot + route,
                         r.weight + route, r.summary + E, N, E, k, aux_coeff, z_coeff);
  }
}

std::vector<int32_t> gate_slots_by_counting(const int32_t* expert, const int64_t* summary, int N, int capacity,
                                            const GateConfig& cfg, uint64_t seed) {
  const int k = cfg.topk;
  std::vector<int32_t> slot(static_cast<size_t>(N) * k, -1);
  if (k == 1) {
    std::vector<int32_t> keep;
    if (cfg.drop_tokens && cfg.use_rts) {
      std::vector<double> prio(N);
      for (int n = 0; n < N; ++n) prio[n] = gate::rts_priority(seed, n);
      keep.resize(N);
      for (int n = 0; n < N; ++n) keep[n] = gate::rts_ahead(expert, prio.data(), 0, N, expert[n], prio[n], n) < capacity;
    }
    const int32_t* kp = keep.empty() ? nullptr : keep.data();
    for (int n = 0; n < N; ++n) {
      const int c = gate::count_before(expert, 1, kp, 0, n, expert[n]);
      slot[n] = (!kp || kp[n]) && c < capacity ? c : -1;
    }
  } else {
    for (int n = 0; n < N; ++n) {
      const int e1 = expert[2 * n], e2 = expert[2 * n + 1];
      const int loc1 = gate::count_before(expert, 2, nullptr, 0, n, e1);
      const int loc2 = static_cast<int>(summary[cfg.num_experts + e2]) + gate::count_before(expert + 1, 2, nullptr, 0, n, e2);
      slot[2 * n] = loc1 < capacity ? loc1 : -1;
      slot[2 * n + 1] = loc2 < capacity ? loc2 : -1;
    }
  }
  return slot;
}

}  // namespace hpct::kernels
