// hpct/model/attention.hpp — the transformer's self-attention as one component: it declares its
// tensors (names, shapes, tensor-parallel splits, initialisation) and computes its forward and
// backward, so the attention variants to come (grouped key/value heads, rotary positions, a fused
// kernel's state) are written here once, for the training model and the tools that read its table.
//
// query_key_value (C -> 3C, sections q|k|v), causal multi-head attention (softmax(q k^T / sqrt(d)) v
// per head, the backend's attention op with its saved state `att`), dense (C -> C); Megatron's names.
// With rotary positions (Rotary::dims > 0) q and k are rotated by their tokens' positions between
// the projection and the attention (kernels::rope); the backward rotates their gradients back.
// With tensor parallelism the heads split over the group: query_key_value column-parallel by
// sections (this rank's heads of q, k and v), dense row-parallel, so the caller passes dense's bias
// on one rank only and sums the output (and the input gradient) over the group.
// Grouped-query attention (fewer key/value heads than query heads; Llama's num_key_value_heads):
// query_key_value is C + 2 KV d rows (q, then KV key heads, then KV value heads), query head h uses
// key/value head h / (NH/KV); the shared heads are widened for the attention op (kernels::expand_kv)
// and their gradients summed back (reduce_kv). Each rank holds its part of each of the three sections.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "hpct/core/param_layout.hpp"
#include "hpct/kernels/dropout.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "hpct/model/linear_hooks.hpp"

namespace hpct::model {

/// Where an attention's tensors are in its block: element offsets from the block's start (the
/// biases `none` without them: --disable-bias-linear).
struct AttentionTensors {
  static constexpr size_t none = std::numeric_limits<size_t>::max();
  size_t qkvw = 0, qkvb = 0, projw = 0, projb = 0;
};

/// One attention's parameters (projb null: no bias added, a row-parallel part off rank 0) or
/// gradients (null: not computed, a frozen block's).
struct AttentionWeights {
  const float *qkvw = nullptr, *qkvb = nullptr, *projw = nullptr, *projb = nullptr;
  // The matrices' 16-bit copies where the store keeps them (ParamStore::params16; nullptr: none).
  const uint16_t *qkvw16 = nullptr, *projw16 = nullptr;
  /// block16: the block's 16-bit copy (nullptr: none).
  static AttentionWeights at(const float* block, const AttentionTensors& t, const uint16_t* block16 = nullptr) {
    auto bias = [&](size_t o) { return o == AttentionTensors::none ? nullptr : block + o; };
    AttentionWeights w{block + t.qkvw, bias(t.qkvb), block + t.projw, bias(t.projb)};
    if (block16) w.qkvw16 = block16 + t.qkvw, w.projw16 = block16 + t.projw;
    return w;
  }
  kernels::Operand qkv() const { return {qkvw, qkvw16}; }
  kernels::Operand proj() const { return {projw, projw16}; }
};
struct AttentionGrads {
  float *qkvw = nullptr, *qkvb = nullptr, *projw = nullptr, *projb = nullptr;
  static AttentionGrads at(float* block, const AttentionTensors& t) {
    if (!block) return {};
    auto bias = [&](size_t o) { return o == AttentionTensors::none ? nullptr : block + o; };
    return {block + t.qkvw, bias(t.qkvb), block + t.projw, bias(t.projb)};
  }
};

/// Rotary position embedding of the queries and keys: the first `dims` channels of each head
/// (0: none, learned positions are added at the input instead), frequencies theta^(-2i/dims).
struct Rotary {
  int dims = 0;
  float theta = 10000.0f;
};

class Attention {
 public:
  /// How the tensors split over the tensor-parallel group: query_key_value's rows (a stride-3
  /// partition: q|k|v sections), dense's columns; dense's bias is a replica.
  struct Split {
    Partition qkv, proj, replica;
  };
  /// Declares query_key_value's and dense's weight and bias under `prefix` ("layers.0.attention.")
  /// in the block being built, of hidden size C; `weight` and `out_weight` are their
  /// initialisation (biases start at zero; none without `bias`). Offsets from `block_base`.
  /// kv_channels: the key (and value) heads' channels, KV d (0: C, every head its own).
  static AttentionTensors declare(ParamLayout& layout, const std::string& prefix, int64_t C, const Split& split,
                                  const InitSpec& weight, const InitSpec& out_weight, size_t block_base,
                                  bool bias = true, int64_t kv_channels = 0);

  Attention() = default;
  /// hidden: the model's width C; heads, channels: this rank's query heads and their channels (C / T);
  /// kv_heads: this rank's key/value heads (0: as many as query heads).
  Attention(kernels::OpsBackend& ops, kernels::Precision precision, int hidden, int heads, int channels,
            Rotary rotary = {}, int kv_heads = 0, kernels::AttentionUse use = {})
      : ops_(&ops), precision_(precision), C_(hidden), NH_(heads), Cl_(channels), KV_(kv_heads > 0 ? kv_heads : heads),
        rotary_(rotary), use_(use) {}
  const Rotary& rotary() const { return rotary_; }
  /// The backend's attention kernel for B x T calls of this attention (the start line says which).
  kernels::AttentionKernel kernel(int B, int T) const { return ops_->attention_kernel(B, T, Cl_, NH_, precision_, use_); }
  bool grouped() const { return KV_ != NH_; }
  /// A qkv row: this rank's q, k and v channels (3 x channels without grouping).
  int qkv_width() const { return Cl_ + 2 * KV_ * (Cl_ / NH_); }
  /// Floats of the dqkv scratch backward needs for `rows` rows.
  size_t dqkv_floats(size_t rows) const { return rows * (qkv_width() + (grouped() ? 3 * (size_t)Cl_ : 0)); }
  /// Rotates the q and k sections of `rows` qkv rows by their positions pos (backend memory), as
  /// mix does (the decoder's rows, each at its own position). Nothing without rotary positions.
  void rotate(float* qkv, int rows, const int32_t* pos) const;

  /// The attention's state for backward, in the backend's memory: the op's own (its size is the
  /// backend's: OpsBackend::attention_state_floats).
  size_t state_floats(int B, int T) const { return op_state_floats(B, T); }
  /// Floats of the buffer mix() computes the attention's inputs in for B x T rows: the qkv rows
  /// (qkv_width() each) and, grouped, every query head's widened q, k, v rows (3 x channels each)
  /// after them.
  size_t inputs_floats(int B, int T) const {
    return (size_t)B * T * (qkv_width() + (grouped() ? 3 * (size_t)Cl_ : 0));
  }
  /// True when the backend's kernel for B x T calls keeps in its state what its backward needs of
  /// its inputs (OpsBackend's AttentionKernel::keeps_inputs): the qkv buffer is then scratch once
  /// mix() returns, and backward does not read it, so layers may share one.
  bool keeps_inputs(int B, int T) const { return kernel(B, T).keeps_inputs; }

  /// The query/key/value projection alone: qkv = x W^T + b on `rows` rows (3 x channels each, q|k|v).
  /// x and y (below) in either form (kernels/operand.hpp: 16 bits where the model keeps its GEMM
  /// inputs narrow).
  void qkv(const AttentionWeights& w, kernels::Operand x, float* qkv, int rows, LinearHooks* hooks) const;
  /// Up to the heads' outputs: qkv = x W^T + b (rows B*T of qkv_width(), in a buffer of
  /// inputs_floats(B, T)), then y, the heads' outputs (B*T rows of channels); att is the state
  /// backward reads (state_floats), with qkv unless keeps_inputs(B, T). drop: attention dropout
  /// (nullptr: none); key_start: each row's first key (per-document attention; nullptr: causal only);
  /// pos: each row's position for rotary positions (nullptr: its place in the sample).
  void mix(const AttentionWeights& w, kernels::Operand x, float* qkv, float* att, kernels::Output y, int B, int T,
           const kernels::Dropout* drop, const int32_t* key_start, const int32_t* pos, LinearHooks* hooks) const;
  /// True when backward keeps the attention op's input gradient in p's 16 bits for the qkv GEMMs,
  /// as autocast's bf16 attention gradient: where the kernel computes it in 16 bits anyway
  /// (AttentionKernel::half_gradient: no value lost), the GEMMs' input x comes in 16 bits (so they
  /// run on 16-bit inputs either way, and no pass narrows x), and nothing reads the gradient in fp32
  /// but those GEMMs, which round it to p in a 16-bit op (no grouped heads' sum, rotary rotation or
  /// adapter on qkv). Saves widening it and narrowing it back: 8 bytes an element moved, per layer
  /// and micro-step. (A weight given without its 16-bit copy is then rounded by the GEMMs'
  /// narrowing pass rather than inside cuBLAS: the same rounding to p, once.)
  bool half_gradient(int B, int T, kernels::Operand x, LinearHooks* hooks) const;
  /// The output projection: out = y dense^T + b on `rows` rows (a partial sum under tensor parallelism).
  void project(const AttentionWeights& w, kernels::Operand y, float* out, int rows, LinearHooks* hooks) const;
  /// From dout (the projection's output gradient): the weight gradients ACCUMULATED, dx WRITTEN
  /// (no memset first; a LoRA hook adds to it after the GEMM); dy (B*T x channels) and dqkv
  /// (dqkv_floats(B*T)) are scratch. qkv: mix()'s buffer as it left it, unread where
  /// keeps_inputs(B, T) (nullptr allowed there). y: mix()'s output, unchanged since (the kernel
  /// reads it where the use says output_kept). Where half_gradient(), the attention's gradient
  /// stays in 16 bits on its way to the qkv GEMMs.
  void backward(const AttentionWeights& w, const AttentionGrads& g, kernels::Operand x, const float* qkv,
                const float* att, kernels::Operand y, const float* dout, float* dx, int B, int T, float* dy, float* dqkv,
                const kernels::Dropout* drop, const int32_t* pos, LinearHooks* hooks) const;

 private:
  size_t op_state_floats(int B, int T) const { return ops_->attention_state_floats(B, T, Cl_, NH_, precision_, use_); }

  kernels::OpsBackend* ops_ = nullptr;
  kernels::Precision precision_ = kernels::Precision::fp32;
  int C_ = 0, NH_ = 0, Cl_ = 0, KV_ = 0;
  Rotary rotary_;
  kernels::AttentionUse use_;  // what the calls may ask beyond the causal mask: picks the backend's kernel
};

}  // namespace hpct::model
