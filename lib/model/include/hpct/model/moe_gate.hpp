// hpct/model/moe_gate.hpp — MoE router math with DeepSpeed-MoE semantics (top-1 / top-2 gating,
// capacity, Random Token Selection, load-balancing and z losses, and their gradient), as host vectors
// over kernels/moe_gate.hpp's array functions (which the backends run on their own memory).
//
// Not here: the router matmul (logits = h·Wg is the caller's), input jitter, dispatch/combine and the
// all-to-all, the MAX all-reduce of demand for drop_tokens=false. This file only turns (N, E) logits
// into per-route (expert, slot, weight) and back into d(logits).
// Trade-off: plain loops over N·E instead of DeepSpeed's dense (S, E, C) masks; they are exact and
// easy to check, and the gate is a sliver of an MoE layer's work. All randomness (Gumbel noise, RTS
// priorities) is a hash of (seed, token index[, expert]), so token n's expert choices and priority never
// depend on how many tokens share the call or which rank runs it (its slot, by nature, does).
//
// Dimension letters: N routed tokens (rows), E experts, k routes per token (1 or 2).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hpct/kernels/moe_gate.hpp"

namespace hpct::model {

// The settings, the capacity rule and the noise are the kernels layer's (kernels/moe_gate.hpp),
// whose array functions the backends run; this header keeps the vector API over them.
using kernels::gate_gumbel;
using kernels::GateConfig;
using kernels::GateNoise;
using kernels::moe_capacity;
using kernels::rts_priority;
using kernels::validate;

struct MoeConfig;  // gpt.hpp
/// The gate's settings for an MoE layer of `experts` experts of model config m, in training (the
/// train capacity factor and noise) or evaluation.
GateConfig gate_config(const MoeConfig& m, int experts, bool training);

/// validate(cfg, flag) throws hpct::config_error naming the flag: --num-experts, --topk, the
/// capacity factor's flag (pass "--moe-eval-capacity-factor" when cfg carries the eval factor),
/// --moe-min-capacity. Pure: every rank validates identically.

/// Slots per expert: C = min(max(ceil(k * tokens / E * capacity_factor), min_capacity), tokens).
/// Computed in double (DeepSpeed uses fp32 tensors; at an exact integer boundary with a non-dyadic
/// factor the two may differ by one slot). The clamp to `tokens` (DS #5353/#8155) is exact for k = 2
/// too: a token's two routes go to distinct experts, so no expert can ever be asked for more than
/// `tokens` slots, and a larger C only pads the buffer. tokens < min_capacity is allowed (DS asserts);
/// then C = tokens. tokens = 0 gives 0. (moe_capacity(tokens, cfg))

struct Routing {
  int N = 0, E = 0, k = 1, capacity = 0;
  std::vector<float> probs;     // (N, E) softmax(logits), fp32
  std::vector<int32_t> expert;  // (N, k) chosen expert per route; k=2: [n*2+0] first, [n*2+1] second
  std::vector<int32_t> slot;    // (N, k) position in the expert's buffer, -1 = dropped
  std::vector<float> weight;    // (N, k) combine weight, 0 for a dropped route
  std::vector<int32_t> demand;  // (E) routes wanting each expert before dropping
  std::vector<int32_t> load;    // (E) routes kept per expert
  long long dropped = 0;        // routes dropped
  double aux_loss = 0;          // E * sum_e me[e]*ce[e], ce from first choices, before dropping
  double z_loss = 0;            // mean_n logsumexp(logits_n)^2 (ST-MoE), always computed
  // The array functions' own: the dispatch order (route_order) and the summary words.
  std::vector<int32_t> pos, source;
  std::vector<int64_t> summary;
  std::vector<double> scratch;
  kernels::GateRoutes arrays();
};

/// Step 1: probabilities, expert choices, demand, aux and z losses. `logits` is (N, E) row-major.
/// The noise of token n is a function of (seed, n, e) only. Ties go to the lowest expert index.
Routing select_experts(const float* logits, int N, const GateConfig& cfg, uint64_t seed, bool training);

/// Step 2: slots under `capacity` and combine weights; may be called again with another capacity.
/// top-1: per expert, the kept tokens are the `capacity` ones with the highest rts_priority(seed, n)
/// (use_rts; ties to the lower n) or the first by position; slot = rank among the kept in token order.
/// Weight = the raw probability. top-2: all first choices are placed before any second choice, drop
/// by position (no RTS, as DeepSpeed); weights renormalised over the kept routes,
/// w_j = p_j m_j / max(p_1 m_1 + p_2 m_2, FLT_EPSILON). With drop_tokens=false, throws hpct::Error
/// if capacity < max demand. `training` is accepted for symmetry; DS applies RTS in eval too.
void assign_slots(Routing& r, int capacity, const GateConfig& cfg, uint64_t seed, bool training);

/// Backward: dlogits (N, E) is OVERWRITTEN with d(loss)/d(logits) for
///   loss = sum_{n,j} dweight[n,j]*weight[n,j] + aux_coeff*aux_loss + z_coeff*z_loss,
/// dweight (N, k). Choices and keep masks are constants (no gradient through argmax or dropping, as
/// DeepSpeed); the gradient flows through probs (weights, me) and, for z_loss, the logits directly.
void route_backward(const Routing& r, const float* logits, const float* dweight, float aux_coeff,
                    float z_coeff, float* dlogits);

/// Where each kept route's row goes in the experts' buffer, ordered by (expert, slot).
struct RouteOrder {
  std::vector<size_t> first;    // (E+1) first row of each expert; first[E] = rows kept
  std::vector<int32_t> pos;     // (N, k) the route's row, -1 = dropped
  std::vector<int32_t> source;  // (rows kept) the token of each row
};
RouteOrder route_order(const Routing& r);

/// rts_priority(seed, n): the RTS priority of token n, uniform in (0, 1), a function of (seed, n)
/// only; gate_gumbel(seed, n, e): the Gumbel(0, 1) noise added to logit (n, e) when sampling.

}  // namespace hpct::model
