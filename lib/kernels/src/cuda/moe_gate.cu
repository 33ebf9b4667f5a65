// The MoE gate on the device (declared in cuda_ops.hpp; contracts in moe_gate.hpp): the routes of
// the host functions (moe_gate.cpp), with nothing crossing to the host.
//
// Select: one thread per token runs moe_gate_math.hpp's select_token (the host's code), counting
// demand and first choices with integer atomics (exact in any order); one block then sums the
// probabilities per expert and the z terms in token order, as the host does, so the aux and z
// losses are the host's too. Assign: where the host sorts (RTS) and fills slots in token order, a
// thread per token counts: the tokens of its expert ahead of it in RTS order (kept if fewer than
// the capacity), and the earlier routes of its expert (its slot). O(N^2) comparisons for N tokens,
// each warp reading the same earlier routes at once (broadcast from cache): about 67M at N = 8192,
// microseconds on a current GPU, against a host round trip per layer. The same counting runs on the
// host in the tests (gate_slots_by_counting). Loads, drops and the routing hash are integer atomics
// (a wrapping sum for the hash): the same in any order. Built with --fmad=false (CMakeLists.txt).
#include <cuda_runtime.h>

#include <string>

#include "../moe_gate_math.hpp"
#include "checks.hpp"
#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"
#include "launch.cuh"

namespace hpct::kernels::cuda {
namespace {

using ull = unsigned long long;

__device__ __forceinline__ void count(int64_t* word, ull v = 1) { atomicAdd(reinterpret_cast<ull*>(word), v); }

__global__ void select_kernel(GateRoutes r, const float* logits, int N, int E, int k, bool rsample, bool sample2,
                              uint64_t seed) {
  HPCT_GRID_STRIDE(i, (size_t)N) {
    const int n = static_cast<int>(i);
    const gate::Choice c =
        gate::select_token(logits + i * E, r.probs + i * E, E, k, rsample, sample2, seed, n);
    r.scratch[n] = c.lse;
    r.expert[i * k] = c.e1;
    count(r.summary + c.e1);      // demand
    count(r.summary + E + c.e1);  // first choices
    if (k == 2) {
      r.expert[i * 2 + 1] = c.e2;
      count(r.summary + c.e2);
    }
  }
}

// One block: me[e] = sum_n probs[n, e] and z = sum_n lse_n^2, each in token order (the host's).
__global__ void select_finish_kernel(GateRoutes r, int N, int E) {
  extern __shared__ double me[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    double s = 0;
    for (int n = 0; n < N; ++n) s += r.probs[(size_t)n * E + e];
    me[e] = s;
  }
  double z = 0;
  if (threadIdx.x == blockDim.x - 1)
    for (int n = 0; n < N; ++n) z += r.scratch[n] * r.scratch[n];
  __syncthreads();
  if (threadIdx.x == blockDim.x - 1 && N > 0) {
    double aux = 0;
    for (int e = 0; e < E; ++e) aux += (me[e] / N) * (static_cast<double>(r.summary[E + e]) / N);
    r.summary[3 * E + 2] = __double_as_longlong(aux * E);
    r.summary[3 * E + 3] = __double_as_longlong(z / N);
  }
}

__global__ void priority_kernel(double* prio, int N, uint64_t seed) {
  HPCT_GRID_STRIDE(i, (size_t)N) prio[i] = gate::rts_priority(seed, static_cast<int>(i));
}

// keep[n] = 1 when fewer than `capacity` tokens of n's expert are ahead of it in RTS order.
__global__ void rts_keep_kernel(int32_t* keep, const int32_t* expert, const double* prio, int N, int capacity) {
  HPCT_GRID_STRIDE(i, (size_t)N) {
    const int n = static_cast<int>(i);
    keep[n] = gate::rts_ahead(expert, prio, 0, N, expert[n], prio[n], n) < capacity;
  }
}

__global__ void slots_top1_kernel(GateRoutes r, const int32_t* keep, int N, int E, int capacity) {
  HPCT_GRID_STRIDE(i, (size_t)N) {
    const int n = static_cast<int>(i), e = r.expert[n];
    const int c = gate::count_before(r.expert, 1, keep, 0, n, e);
    const bool kept = (!keep || keep[n]) && c < capacity;
    r.slot[n] = kept ? c : -1;
    r.weight[n] = kept ? r.probs[i * E + e] : 0.f;
    count(kept ? r.summary + 2 * E + e : r.summary + 3 * E);
    count(r.summary + 3 * E + 1, gate::route_hash(n, e, r.slot[n]));
  }
}

// All first choices are placed before any second choice; drops by position (DeepSpeed's top-2).
__global__ void slots_top2_kernel(GateRoutes r, int N, int E, int capacity) {
  HPCT_GRID_STRIDE(i, (size_t)N) {
    const int n = static_cast<int>(i), e1 = r.expert[2 * i], e2 = r.expert[2 * i + 1];
    const int loc1 = gate::count_before(r.expert, 2, nullptr, 0, n, e1);
    const int loc2 = static_cast<int>(r.summary[E + e2]) + gate::count_before(r.expert + 1, 2, nullptr, 0, n, e2);
    const bool m1 = loc1 < capacity, m2 = loc2 < capacity;
    const float* p = r.probs + i * E;
    gate::top2_weights(p[e1], p[e2], m1, m2, r.weight + 2 * i);
    r.slot[2 * i] = m1 ? loc1 : -1;
    r.slot[2 * i + 1] = m2 ? loc2 : -1;
    if (m1) count(r.summary + 2 * E + e1);
    if (m2) count(r.summary + 2 * E + e2);
    if (!m1 + !m2) count(r.summary + 3 * E, !m1 + !m2);
    count(r.summary + 3 * E + 1, gate::route_hash(2 * n, e1, r.slot[2 * i]) + gate::route_hash(2 * n + 1, e2, r.slot[2 * i + 1]));
  }
}

// The dispatch's order: route i's row = the rows of the experts before its own + its slot.
__global__ void order_kernel(GateRoutes r, int N, int E, int k) {
  HPCT_GRID_STRIDE(i, (size_t)N * k) {
    const int s = r.slot[i];
    if (s < 0) {
      r.pos[i] = -1;
      continue;
    }
    const int e = r.expert[i];
    long long row = s;
    for (int f = 0; f < e; ++f) row += r.summary[2 * E + f];
    r.pos[i] = static_cast<int32_t>(row);
    r.source[row] = static_cast<int32_t>(i / k);
  }
}

__global__ void gate_backward_kernel(float* dlogits, GateRoutes r, const float* logits, const float* dweight, int N,
                                     int E, int k, float aux_coeff, float z_coeff) {
  HPCT_GRID_STRIDE(i, (size_t)N) {
    gate::token_backward(dlogits + i * E, r.probs + i * E, logits + i * E, dweight + i * k, r.expert + i * k,
                         r.slot + i * k, r.weight + i * k, r.summary + E, N, E, k, aux_coeff, z_coeff);
  }
}

constexpr int kMaxExperts = 4096;  // the finishing block keeps E doubles in shared memory

void check_gate(const GateConfig& cfg, int N, const char* op) {
  validate(cfg);
  if (N < 0) throw Error(std::string("CUDA backend: ") + op + ": negative token count " + std::to_string(N));
  if (cfg.num_experts > kMaxExperts)
    throw Error(std::string("CUDA backend: ") + op + ": " + std::to_string(cfg.num_experts) +
                " experts; the device gate serves at most " + std::to_string(kMaxExperts));
}

}  // namespace

void moe_gate_select(const GateRoutes& r, const float* logits, int N, const GateConfig& cfg, uint64_t seed,
                     bool training, cudaStream_t stream) {
  check_gate(cfg, N, "moe_gate_select");
  const int E = cfg.num_experts, k = cfg.topk;
  check(cudaMemsetAsync(r.summary, 0, gate_summary_words(E) * sizeof(int64_t), stream), "moe_gate_select: memset");
  if (N == 0) return;
  const bool rsample = training && k == 1 && cfg.noise == GateNoise::rsample;
  const bool sample2 = training && k == 2 && cfg.second_expert_sampling;
  select_kernel<<<blocks_for(N), kThreads, 0, stream>>>(r, logits, N, E, k, rsample, sample2, seed);
  check_launch("moe_gate_select");
  select_finish_kernel<<<1, kThreads, E * sizeof(double), stream>>>(r, N, E);
  check_launch("moe_gate_select (finish)");
}

void moe_gate_assign(const GateRoutes& r, int N, int capacity, const GateConfig& cfg, uint64_t seed,
                     cudaStream_t stream) {
  check_gate(cfg, N, "moe_gate_assign");
  if (capacity < 0) throw Error("CUDA backend: moe_gate_assign: negative capacity " + std::to_string(capacity));
  const int E = cfg.num_experts, k = cfg.topk;
  // load, dropped and the hash start at 0; demand, first choices and the losses are select's.
  check(cudaMemsetAsync(r.summary + 2 * E, 0, (E + 2) * sizeof(int64_t), stream), "moe_gate_assign: memset");
  if (N == 0) return;
  if (k == 1) {
    const int32_t* keep = nullptr;
    if (cfg.drop_tokens && cfg.use_rts) {
      priority_kernel<<<blocks_for(N), kThreads, 0, stream>>>(r.scratch, N, seed);
      rts_keep_kernel<<<blocks_for(N), kThreads, 0, stream>>>(r.pos, r.expert, r.scratch, N, capacity);
      keep = r.pos;  // the flags until order_kernel writes the rows
    }
    slots_top1_kernel<<<blocks_for(N), kThreads, 0, stream>>>(r, keep, N, E, capacity);
  } else {
    slots_top2_kernel<<<blocks_for(N), kThreads, 0, stream>>>(r, N, E, capacity);
  }
  check_launch("moe_gate_assign");
  order_kernel<<<blocks_for((size_t)N * k), kThreads, 0, stream>>>(r, N, E, k);
  check_launch("moe_gate_assign (order)");
}

void moe_gate_backward(float* dlogits, const GateRoutes& r, const float* logits, const float* dweight, int N,
                       const GateConfig& cfg, float aux_coeff, float z_coeff, cudaStream_t stream) {
  check_gate(cfg, N, "moe_gate_backward");
  if (N == 0) return;
  gate_backward_kernel<<<blocks_for(N), kThreads, 0, stream>>>(dlogits, r, logits, dweight, N, cfg.num_experts,
                                                               cfg.topk, aux_coeff, z_coeff);
  check_launch("moe_gate_backward");
}

}  // namespace hpct::kernels::cuda
