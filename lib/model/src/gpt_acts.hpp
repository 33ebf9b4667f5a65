// gpt_acts.hpp — private to the model library: Gpt's saved activations and scratch (gpt.cpp)
// and one MoE layer's (moe.cpp), complete wherever Gpt uses or destroys them.
#pragma once
#include <vector>

#include "hpct/model/gpt.hpp"
#include "hpct/model/moe_gate.hpp"

namespace hpct::model {

// One layer's saved activations. With recompute there is one set, refilled per layer in backward.
// The GEMMs' inputs (ln1, atty, ln2, fch_gelu) are fp32, or 16-bit where the workspace keeps them
// so (Gpt::keeps_half_activations).
struct Gpt::LayerActs {
  // n = N, or N/T rows under sequence parallelism (the norms' statistics, res2)
  kernels::Output ln1;  // (N, C)
  float* ln1_mean;  // (n)
  float* ln1_rstd;  // (n)
  float* qkv;       // (N, 3C) (+ grouped: the widened heads): Attention::inputs_floats; every
                    // set's the same buffer where the attention kernel keeps its inputs
  float* att;       // the attention op's state (materialised: B x NH x T x T)
  kernels::Output atty;  // (N, C)
  float* res2;      // (n, C) residual after attention
  kernels::Output ln2;  // (N, C)
  float* ln2_mean;  // (n)
  float* ln2_rstd;  // (n)
  kernels::Output fch;  // (N, 4C): fp32, or 16-bit (Gpt::keeps_half_pre_activations)
  kernels::Output fch_gelu;  // (N, 4C)
  float* lora_h[4] = {};  // LoRA: x A^T of each adapted linear, (N, rank)
};

struct Gpt::Workspace {
  int B = 0, T = 0;
  kernels::BackendBuffer mem;  // every float buffer below, in the backend's memory
  std::vector<LayerActs> acts;
  // n = N, or this rank's N/T rows under sequence parallelism
  float* res = nullptr;       // (L+1, n, C) layer inputs; res[L] is the last layer's output
  kernels::Output lnf;        // (N, C): fp32, or 16-bit as the layers' GEMM inputs
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
  float* logits = nullptr;    // (head rows, Vl): OpsBackend::head_rows
  float* ltd = nullptr;       // (3, N, C) random-LTD: a layer's kept input rows, output rows, gradient rows
  float* ddrop = nullptr;     // (n, C) hidden dropout: the gradient reaching a dropped output
  float* losses = nullptr;    // (N), in the backend's memory
  kernels::HostBuffer host_losses;      // (N) floats: the losses read back, on a device backend (page-locked)
  kernels::BackendBuffer tokens, targets;  // (N) int32 each, on a device backend
  kernels::BackendBuffer key_start, positions;  // (N) int32 each, on a device backend with documents on
  // random-LTD on a device backend: each dropping layer's kept rows (B*kept int32, by layer index)
  // and the kept rows' first attention keys (per-document attention)
  std::vector<kernels::BackendBuffer> ltd_rows;
  kernels::BackendBuffer ltd_start;
  kernels::BackendBuffer ltd_pos;  // rotary positions of a random-LTD layer's kept rows
  // LoRA: each activation set's lora_h, and scratch for one adapter's update and gradients
  kernels::BackendBuffer lora_mem;
  float* lora_t = nullptr;   // (N, the widest adapter output)
  float* lora_dh = nullptr;  // (N, rank)
  // The embedding's adapters: A[token] rows (N, rank), the head chunk's x B and s x B (2 x 256 x
  // rank), its adapter logits (256, Vp), and scratch for the scatter's position gradient (T, rank)
  float *lora_u = nullptr, *lora_z = nullptr, *lora_logits = nullptr, *lora_dpos = nullptr;
};

// A growable array in a backend's memory (the MoE layer's rows and scratch). resize() keeps
// nothing when it grows and never shrinks, so a layer's buffers stop allocating after the first step.
template <class T>
class BackendArray {
 public:
  explicit BackendArray(kernels::OpsBackend& be) : be_(&be) {}
  T* resize(size_t n) {
    if (n > cap_) buf_ = kernels::BackendBuffer(*be_, n * sizeof(T)), cap_ = n;
    n_ = n;
    return data();
  }
  T* zeros(size_t n) {
    resize(n);
    if (n) be_->zero(buf_.as<void>(), n * sizeof(T));
    return data();
  }
  /// n host values into the array (resized to n).
  T* upload(const T* host, size_t n) {
    resize(n);
    if (n) be_->copy_from_host(buf_.as<void>(), host, n * sizeof(T));
    return data();
  }
  void clear() { n_ = 0; }
  T* data() const { return buf_.as<T>(); }
  size_t size() const { return n_; }
  size_t capacity() const { return cap_; }
  bool empty() const { return n_ == 0; }

 private:
  kernels::OpsBackend* be_;
  kernels::BackendBuffer buf_;
  size_t n_ = 0, cap_ = 0;
};


}  // namespace hpct::model
