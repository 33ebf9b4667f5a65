// hpct/model/gpt.hpp — GPT-2 style decoder with explicit forward and backward.
//
// Token + learned position embeddings, L pre-LayerNorm blocks (causal multi-head attention, GELU
// MLP), final LayerNorm, output head tied to the token embedding. No autograd: the backward is
// written out, op by op, against hpct::kernels. Activation checkpointing per layer keeps only each
// layer's input and recomputes the layer in backward (one scratch set instead of L).
// Not here: optimizer, data parallelism, sharding — the model reads parameters and writes
// gradients through a ParamStore, block by block, so ZeRO-3 can gather a layer just in time and
// a data-parallel engine can reduce a layer's gradients as soon as they are complete.
//
// The ops run on a kernels::OpsBackend: the CPU one by default, or a CUDA device. Parameters,
// gradients and activations then live in that backend's memory; tokens and targets are passed as
// host arrays and copied in, losses come back to the host.
//
// Dimension letters: B batch, T sequence, C channels (hidden), L layers, NH heads, V vocab,
// Vp padded vocab, N = B*T rows.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hpct/core/param_layout.hpp"
#include "hpct/kernels/ops_backend.hpp"

namespace hpct::model {

struct GptConfig {
  int num_layers = 2;
  int hidden_size = 64;
  int num_heads = 2;
  int max_seq_length = 64;  // learned position table size (Megatron's --max-position-embeddings)
  int vocab_size = 256;     // tokenizer's vocabulary
  int vocab_multiple = 128; // Megatron's --make-vocab-size-divisible-by
  double init_std = 0.02;   // Megatron's --init-method-std

  int padded_vocab() const { return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple; }
  /// Throws config_error naming the flag for impossible shapes.
  void validate() const;
  std::string describe() const;
};

/// Where the model reads parameters and writes gradients, one block at a time (see ParamLayout).
/// Block order: 0 = embedding (wte, wpe), 1..L = layers, L+1 = final norm. The default store points
/// into two flat buffers; ZeRO-3 gathers and releases blocks behind the same interface. Pointers
/// are in the memory of the model's backend (device memory for a CUDA model).
class ParamStore {
 public:
  virtual ~ParamStore() = default;
  virtual const float* params(int block) = 0;  // base of the block (offset of its first tensor)
  virtual float* grads(int block) = 0;
  virtual void release(int block) {}            // forward/backward of this block is done for now
  /// The block's parameters as the 16-bit copy the store keeps (mixed-precision runs, blocks every
  /// rank holds whole), in host memory, valid until the parameters change; nullptr where there is
  /// none. Not used by the model: ZeRO-Offload copies these 2-byte values to the GPU.
  virtual const uint16_t* params_half(int /*block*/) { return nullptr; }
  /// The gradient of this block is complete for this micro-batch (backward visits blocks L+1..0).
  virtual void grads_ready(int block) {}
};

class FlatParamStore : public ParamStore {
 public:
  FlatParamStore(const ParamLayout& layout, const float* params, float* grads) : layout_(layout), p_(params), g_(grads) {}
  const float* params(int block) override { return p_ + layout_.blocks()[block].offset; }
  float* grads(int block) override { return g_ + layout_.blocks()[block].offset; }

 private:
  const ParamLayout& layout_;
  const float* p_;
  float* g_;
};

class Gpt {
 public:
  /// ops: the backend the model computes on, which must outlive the model; nullptr = the CPU one.
  Gpt(const GptConfig& cfg, kernels::Precision precision, bool recompute_activations,
      kernels::OpsBackend* ops = nullptr);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  kernels::OpsBackend& ops() const { return *ops_; }

  const GptConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  kernels::Precision precision() const { return precision_; }

  /// GPT-2 / Megatron init: N(0, std) weights, output projections N(0, std/sqrt(2L)), zero biases,
  /// unit norm weights. Deterministic in the seed, independent of the rank layout.
  void init_params(float* params, uint64_t seed) const;
  /// The same values for one block only: dst receives the block's elements (as at its layout
  /// offset in init_params), so a sharded store initialises without a full copy.
  void init_block(int block, float* dst, uint64_t seed) const;

  /// Forward and backward of one micro-batch. tokens/targets are (B, T) host arrays; a target < 0
  /// is ignored.
  /// Gradients are ACCUMULATED into the store with d(loss)/d(logit) scaled by dloss (so the caller
  /// chooses the mean over the global batch and any loss scale). Returns the SUM of token losses.
  double forward_backward(ParamStore& store, const int32_t* tokens, const int32_t* targets, int B, int T, float dloss);
  /// Forward only (evaluation). Returns the sum of token losses (targets < 0 add nothing).
  double forward_loss(ParamStore& store, const int32_t* tokens, const int32_t* targets, int B, int T);

  /// Bytes of activations and scratch currently allocated (grows to the largest (B, T) seen), in the
  /// backend's memory, with the scratch the backend keeps for its ops (OpsBackend::scratch_bytes).
  size_t activation_bytes() const;
  /// Model FLOPs of one forward+backward over B*T tokens (2 per multiply-add; x3 for fwd+bwd,
  /// +1 forward when activations are recomputed), for TFLOP/s reporting.
  double flops_per_iteration(long long B, long long T) const;

 private:
  struct LayerActs;
  struct Workspace;
  void ensure_workspace(int B, int T);
  /// Checks tokens and targets and, on a device backend, copies them in; returns backend pointers.
  std::pair<const int32_t*, const int32_t*> stage_inputs(const int32_t* tokens, const int32_t* targets, int B, int T);
  const float* forward_layers(ParamStore& store, const int32_t* tokens, int B, int T, bool keep_acts);
  void layer_forward(int l, const float* lp, LayerActs& a, const float* in, float* out, int B, int T);
  void layer_backward(int l, const float* lp, float* lg, LayerActs& a, const float* in, float* dres, int B, int T);
  double head(const float* ep, float* eg, const float* fp, float* fg, const float* x, const int32_t* targets, int B,
              int T, float dloss, bool backward, float* dx);

  GptConfig cfg_;
  kernels::Precision precision_;
  bool recompute_;
  ParamLayout layout_;
  // offsets of tensors relative to their block base
  struct LayerOffsets {
    size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  } lo_{};
  size_t wte_ = 0, wpe_ = 0, lnfw_ = 0, lnfb_ = 0;
  std::unique_ptr<kernels::OpsBackend> own_ops_;  // the CPU backend when none was given
  kernels::OpsBackend* ops_ = nullptr;
  std::unique_ptr<Workspace> ws_;                 // declared last: its buffers go back to ops_ first
};

}  // namespace hpct::model
