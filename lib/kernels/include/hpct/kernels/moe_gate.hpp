// hpct/kernels/moe_gate.hpp — the MoE gate's maths on arrays, so that a backend runs it where the
// router's logits are (model/moe_gate.hpp keeps its vector-based API and its documentation of the
// DeepSpeed-MoE semantics: top-1 / top-2, capacity, Random Token Selection, aux and z losses).
//
// What it is: the gate's settings, its capacity rule, and its three steps over one call's arrays
// (GateRoutes, in the backend's memory): select (softmax, choices, demand, losses), assign (slots
// under a capacity, combine weights, the rows' order for the dispatch) and backward (d logits).
// The host functions here are the reference; OpsBackend::moe_gate_* run them (the CPU backend) or
// a device's kernels (the CUDA backend), which reach the same routes bitwise: both evaluate the
// same per-token code (src/moe_gate_math.hpp), and where the device's algorithm differs (slots by
// counting instead of sorting) the host tests run the device's counting too.
// What it is not: the router GEMM, jitter, dispatch/combine or the all-to-all (the MoE layer's).
// Trade-off: the summary (counts and losses) is one small array that a device backend's caller reads
// back once per MoE layer's forward (it sizes the experts' GEMMs and the all-to-all); nothing of a
// call's N x E or N x k arrays crosses to the host, in forward or backward.
//
// Dimension letters: N routed tokens (rows), E experts, k routes per token (1 or 2).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace hpct::kernels {

/// --moe-noisy-gate-policy None|Jitter|RSample (model/moe_gate.hpp says what each does).
enum class GateNoise { none, jitter, rsample };

struct GateConfig {
  int num_experts = 1;            // E
  int topk = 1;                   // 1 or 2, and <= E
  double capacity_factor = 1.0;   // the caller passes the train or eval factor
  int min_capacity = 4;
  bool drop_tokens = true;        // false: the caller passes capacity >= max demand (N will do)
  bool use_rts = true;            // Random Token Selection, top-1 only (as DeepSpeed), train and eval
  bool second_expert_sampling = true;  // top-2, training only: 2nd = argmax(logits + Gumbel)
  GateNoise noise = GateNoise::none;
};

/// Throws hpct::config_error naming the flag: --num-experts, --topk, the capacity factor's flag
/// (pass "--moe-eval-capacity-factor" when cfg carries the eval factor), --moe-min-capacity.
void validate(const GateConfig& cfg, const char* capacity_flag = "--moe-train-capacity-factor");

/// Slots per expert: C = min(max(ceil(k * tokens / E * capacity_factor), min_capacity), tokens)
/// (model/moe_gate.hpp has the reasons).
int moe_capacity(int tokens, const GateConfig& cfg);

/// The summary's words: [0, E) demand (routes wanting each expert), [E, 2E) first choices per
/// expert, [2E, 3E) load (routes kept), then dropped routes, the routing hash (uint64 bits), the
/// aux loss and the z loss (double bits).
inline size_t gate_summary_words(int E) { return 3 * static_cast<size_t>(E) + 4; }

/// One gate call's arrays, in the backend's memory (the caller sizes them).
struct GateRoutes {
  float* probs = nullptr;      // (N, E) softmax(logits)
  int32_t* expert = nullptr;   // (N, k) chosen expert per route (i = n*k + j)
  int32_t* slot = nullptr;     // (N, k) position in the expert's buffer, -1 = dropped
  float* weight = nullptr;     // (N, k) combine weight, 0 for a dropped route
  int32_t* pos = nullptr;      // (N, k) the route's row in the (expert, slot) order, -1 = dropped
  int32_t* source = nullptr;   // (N * k) the token of each kept row (the first `kept` are written)
  int64_t* summary = nullptr;  // (gate_summary_words(E))
  double* scratch = nullptr;   // (N) the steps' own
};

/// The summary read back on the host.
struct GateSummary {
  std::vector<int32_t> demand, first, load;  // (E) each
  long long dropped = 0;
  uint64_t hash = 0;  // sum over routes of a hash of (route, expert, slot): a flip shows
  double aux_loss = 0, z_loss = 0;
  long long kept() const;
  static GateSummary read(const int64_t* words, int E);
};

/// Step 1: probs, expert, and the summary's demand, first choices, aux and z losses (the rest of
/// the summary zeroed). Ties go to the lowest expert index; noise is a function of (seed, n, e).
void gate_select(const GateRoutes& r, const float* logits, int N, const GateConfig& cfg, uint64_t seed, bool training);
/// Step 2 after step 1: slot, weight, pos, source and the summary's load, dropped and hash, under
/// `capacity` (with drop_tokens false it must be >= the largest demand: this host function throws
/// hpct::Error otherwise; a device's kernel cannot, so its caller checks).
void gate_assign(const GateRoutes& r, int N, int capacity, const GateConfig& cfg, uint64_t seed);
/// Backward: dlogits (N, E) OVERWRITTEN with d(loss)/d(logits) for loss = sum dweight*weight +
/// aux_coeff*aux_loss + z_coeff*z_loss (choices and keep masks constant, as DeepSpeed).
void gate_backward(float* dlogits, const GateRoutes& r, const float* logits, const float* dweight, int N,
                   const GateConfig& cfg, float aux_coeff, float z_coeff);

/// The RTS priority of token n, uniform in (0, 1), and the Gumbel(0, 1) noise of logit (n, e):
/// functions of their arguments only, the same on every backend.
double rts_priority(uint64_t seed, int n);
double gate_gumbel(uint64_t seed, int n, int e);

/// The device's way to the slots, on the host (for tests): top-1 keeps, by counting for each token
/// the tokens of its expert ahead of it (higher priority, or equal and earlier), and every
/// route's slot as the count of earlier routes of its expert (kept ones, for top-1). Returns the
/// (N, k) slots (-1 dropped) that gate_assign's sorting gives, if the two agree.
std::vector<int32_t> gate_slots_by_counting(const int32_t* expert, const int64_t* summary, int N, int capacity,
                                            const GateConfig& cfg, uint64_t seed);

}  // namespace hpct::kernels
