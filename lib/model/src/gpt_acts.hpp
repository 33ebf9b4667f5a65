// gpt_acts.hpp — private to the model library: Gpt's saved activations and scratch (gpt.cpp)
// and one MoE layer's (moe.cpp), complete wherever Gpt uses or destroys them.
#pragma once
#include <vector>

#include "hpct/model/gpt.hpp"
#include "hpct/model/moe_gate.hpp"

namespace hpct::model {

// One layer's saved activations. With recompute there is one set, refilled per layer in backward.
struct Gpt::LayerActs {
  float* ln1;       // (N, C)
  float* ln1_mean;  // (N)
  float* ln1_rstd;  // (N)
  float* qkv;       // (N, 3C)
  float* att;       // (B, NH, T, T)
  float* atty;      // (N, C)
  float* res2;      // (N, C) residual after attention
  float* ln2;       // (N, C)
  float* ln2_mean;  // (N)
  float* ln2_rstd;  // (N)
  float* fch;       // (N, 4C)
  float* fch_gelu;  // (N, 4C)
};

struct Gpt::Workspace {
  int B = 0, T = 0;
  kernels::BackendBuffer mem;  // every float buffer below, in the backend's memory
  std::vector<LayerActs> acts;
  float* res = nullptr;       // (L+1, N, C) layer inputs; res[L] is the last layer's output
  float* lnf = nullptr;       // (N, C)
  float* lnf_mean = nullptr;  // (N)
  float* lnf_rstd = nullptr;  // (N)
  float* dres = nullptr;      // (N, C)
  float* dln = nullptr;       // (N, C) scratch for dln1 / dln2 / datty / dlnf
  float* datty = nullptr;     // (N, C)
  float* dqkv = nullptr;      // (N, 3C)
  float* dfch = nullptr;      // (N, 4C)
  float* dfch_gelu = nullptr; // (N, 4C)
  float* logits = nullptr;    // (kHeadRows, Vp)
  float* losses = nullptr;    // (N), in the backend's memory
  std::vector<float> host_losses;       // (N): the losses read back, on a device backend
  kernels::BackendBuffer tokens, targets;  // (N) int32 each, on a device backend
};

// One MoE layer's saved state for backward (one set per layer, or one shared with recompute).
struct Gpt::MoeActs {
  std::vector<float> xr;        // (N, C) router input (jittered x; empty without jitter)
  std::vector<float> jitter;    // (N, C) the jitter factors
  std::vector<float> logits;    // (N, E)
  Routing routing;
  std::vector<int32_t> pos;     // (N, K) row of each route in the send buffer, -1 = dropped
  std::vector<int> send_rows, recv_rows;  // per ep rank
  std::vector<int> recv_counts;           // (ep, El): rows from source s for local expert j
  std::vector<float> rows;      // (R, C) received rows, grouped by local expert
  std::vector<float> fch, fch_gelu;  // (R, 4C)
  std::vector<float> y;         // (R, C) expert outputs
  std::vector<float> yback;     // (S, C) outputs back in send order
  std::vector<float> moe_out, dense_out, coef;  // residual MoE: (N, C), (N, C), (N, 2) softmaxed
  int N = 0;
};

}  // namespace hpct::model
