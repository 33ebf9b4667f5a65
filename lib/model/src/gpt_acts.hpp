// gpt_acts.hpp — private to the model library: Gpt's saved activations and scratch (gpt.cpp)
// and one MoE layer's (moe.cpp), complete wherever Gpt uses or destroys them.
#pragma once
#include <vector>

#include "hpct/model/gpt.hpp"
#include "hpct/model/moe_gate.hpp"

namespace hpct::model {

// One layer's saved activations. With recompute there is one set, refilled per layer in backward.
struct Gpt::LayerActs {
  // n = N, or N/T rows under sequence parallelism (the norms' statistics, res2)
  float* ln1;       // (N, C)
  float* ln1_mean;  // (n)
  float* ln1_rstd;  // (n)
  float* qkv;       // (N, 3C)
  float* att;       // (B, NH, T, T)
  float* atty;      // (N, C)
  float* res2;      // (n, C) residual after attention
  float* ln2;       // (N, C)
  float* ln2_mean;  // (n)
  float* ln2_rstd;  // (n)
  float* fch;       // (N, 4C)
  float* fch_gelu;  // (N, 4C)
};

struct Gpt::Workspace {
  int B = 0, T = 0;
  kernels::BackendBuffer mem;  // every float buffer below, in the backend's memory
  std::vector<LayerActs> acts;
  // n = N, or this rank's N/T rows under sequence parallelism
  float* res = nullptr;       // (L+1, n, C) layer inputs; res[L] is the last layer's output
  float* lnf = nullptr;       // (N, C)
  float* lnf_mean = nullptr;  // (n)
  float* lnf_rstd = nullptr;  // (n)
  float* dres = nullptr;      // (n, C)
  float* dln = nullptr;       // (N, C) scratch for dln1 / dln2 / datty / dlnf; partial sums before g
  float* dfull = nullptr;     // (N, C) sequence parallelism: dres gathered from every rank
  float* dslice = nullptr;    // (n, C) sequence parallelism: this rank's rows of a scattered sum
  float* dnorm = nullptr;     // (4C) sequence parallelism: the norms' partial weight gradients
  float* kept_res2 = nullptr; // (L, n, C) CAC: each layer's res2 from the forward, for the replay
  float* datty = nullptr;     // (N, C)
  float* dqkv = nullptr;      // (N, 3C)
  float* dfch = nullptr;      // (N, 4C)
  float* dfch_gelu = nullptr; // (N, 4C)
  float* logits = nullptr;    // (kHeadRows, Vp)
  float* ltd = nullptr;       // (3, N, C) random-LTD: a layer's kept input rows, output rows, gradient rows
  float* losses = nullptr;    // (N), in the backend's memory
  std::vector<float> host_losses;       // (N): the losses read back, on a device backend
  kernels::BackendBuffer tokens, targets;  // (N) int32 each, on a device backend
};

// One MoE layer's saved state for backward (one set per layer, or one shared with recompute). With
// CAC the routing, exchanged rows and outputs are kept per MoE layer and the experts' hidden
// activations (fch, fch_gelu, y) live in the shared set.
struct Gpt::MoeActs {
  std::vector<float> xr;        // (N, C) router input (jittered x; empty without jitter)
  std::vector<float> jitter;    // (N, C) the jitter factors
  std::vector<float> logits;    // (N, E)
  Routing routing;
  std::vector<int32_t> pos;     // (N, K) row of each route in the send buffer, -1 = dropped
  std::vector<int> send_counts;  // (ep, El) = (E): rows to expert e = d*El + j (its kept load)
  std::vector<int> recv_counts;  // (ep, El): rows from source s for local expert j
  std::vector<float> rows;      // (R, C) received rows, grouped by local expert
  std::vector<float> fch, fch_gelu;  // (R, 4C)
  std::vector<float> y;         // (R, C) expert outputs
  std::vector<float> yback;     // (S, C) outputs back in send order
  std::vector<float> moe_out, dense_out, coef;  // residual MoE: (N, C), (N, C), (N, 2) softmaxed
  int N = 0;
};

}  // namespace hpct::model
