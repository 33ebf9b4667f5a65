// hpct/model/moe_gate.hpp — MoE router math with DeepSpeed-MoE semantics (top-1 / top-2 gating,
// capacity, Random Token Selection, load-balancing and z losses, and their gradient), fp32 on the host.
//
// Not here: the router matmul (logits = h·Wg is the caller's), input jitter, dispatch/combine and the
// all-to-all, the MAX all-reduce of demand for drop_tokens=false. This file only turns (N, E) logits
// into per-route (expert, slot, weight) and back into d(logits).
// Trade-off: a plain host loop over N·E instead of DeepSpeed's dense (S, E, C) masks; it is exact and
// easy to check, and the gate is a sliver of an MoE layer's work. All randomness (Gumbel noise, RTS
// priorities) is a hash of (seed, token index[, expert]), so token n's expert choices and priority never
// depend on how many tokens share the call or which rank runs it (its slot, by nature, does).
//
// Dimension letters: N routed tokens (rows), E experts, k routes per token (1 or 2).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace hpct::model {

/// --moe-noisy-gate-policy None|Jitter|RSample. Jitter multiplies the router INPUT (the caller does it);
/// RSample takes the top-1 expert as argmax(logits + Gumbel) in training. RSample has no effect for top-2
/// (as DeepSpeed, whose top2gating ignores the policy).
enum class GateNoise { none, jitter, rsample };

struct GateConfig {
  int num_experts = 1;            // E
  int topk = 1;                   // 1 or 2, and <= E
  double capacity_factor = 1.0;   // the caller passes the train or eval factor
  int min_capacity = 4;
  bool drop_tokens = true;        // false: the caller passes capacity >= max demand (agreed over EP)
  bool use_rts = true;            // Random Token Selection, top-1 only (as DeepSpeed), train and eval
  // top-2, training only: 2nd = argmax(logits + Gumbel), 1st masked. DeepSpeed samples in eval too;
  // we keep eval deterministic (2nd = second-largest logit).
  bool second_expert_sampling = true;
  GateNoise noise = GateNoise::none;
};

struct MoeConfig;  // gpt.hpp
/// The gate's settings for an MoE layer of `experts` experts of model config m, in training (the
/// train capacity factor and noise) or evaluation.
GateConfig gate_config(const MoeConfig& m, int experts, bool training);

/// Throws hpct::config_error naming the flag: --num-experts, --topk, the capacity factor's flag
/// (pass "--moe-eval-capacity-factor" when cfg carries the eval factor), --moe-min-capacity.
/// Pure: every rank validates identically.
void validate(const GateConfig& cfg, const char* capacity_flag = "--moe-train-capacity-factor");

/// Slots per expert: C = min(max(ceil(k * tokens / E * capacity_factor), min_capacity), tokens).
/// Computed in double (DeepSpeed uses fp32 tensors; at an exact integer boundary with a non-dyadic
/// factor the two may differ by one slot). The clamp to `tokens` (DS #5353/#8155) is exact for k = 2
/// too: a token's two routes go to distinct experts, so no expert can ever be asked for more than
/// `tokens` slots, and a larger C only pads the buffer. tokens < min_capacity is allowed (DS asserts);
/// then C = tokens. tokens = 0 gives 0.
int moe_capacity(int tokens, const GateConfig& cfg);

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

/// The RTS priority of token n, uniform in (0, 1), a function of (seed, n) only.
double rts_priority(uint64_t seed, int n);
/// The Gumbel(0, 1) noise added to logit (n, e) when sampling, a function of (seed, n, e) only.
double gate_gumbel(uint64_t seed, int n, int e);

}  // namespace hpct::model
