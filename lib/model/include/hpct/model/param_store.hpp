// hpct/model/param_store.hpp — the protocol between a model and whoever holds its parameters.
//
// The model asks for a block's parameters and gradients (blocks as in its ParamLayout) and says when
// it is done with a block and when a block's gradient is complete; it never assumes where they live.
// That is what lets ZeRO-3 gather a block just in time, a data-parallel engine reduce a block's
// gradient as soon as backward finishes it, and a grouped store route expert blocks to their own
// engine. Not here: any policy — the default store is two flat buffers.
#pragma once
#include <cstddef>
#include <cstdint>

#include "hpct/core/param_layout.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/precision.hpp"

namespace hpct::model {

/// Where the model reads parameters and writes gradients, one block at a time (see ParamLayout).
/// Block ids are the model layout's (Gpt::layout_for). The default store points
/// into two flat buffers; ZeRO-3 gathers and releases blocks behind the same interface. Pointers
/// are in the memory of the model's backend (device memory for a CUDA model).
class ParamStore {
 public:
  virtual ~ParamStore() = default;
  virtual const float* params(int block) = 0;  // base of the block (offset of its first tensor)
  /// nullptr for a block that does not train (ParamLayout::freeze: LoRA's base weights): the model
  /// then computes no gradient for its tensors.
  virtual float* grads(int block) = 0;
  virtual void release(int block) {}            // forward/backward of this block is done for now
  /// The block's parameters as 16-bit values (the run's precision) in the model's backend memory:
  /// params(block)'s layout and values (those are these widened), valid as long as params(block)'s
  /// pointer is; nullptr where the store keeps none (fp32 runs; the default). The model's linear
  /// layers hand them to their GEMMs beside the fp32 values (kernels/operand.hpp), so a device reads
  /// 2-byte weights on its 16-bit tensor-core path.
  virtual const uint16_t* params16(int /*block*/) { return nullptr; }
  /// The block's parameters as the 16-bit copy the store keeps (mixed-precision runs, blocks every
  /// rank holds whole), in host memory, valid until the parameters change; nullptr where there is
  /// none. Not used by the model: ZeRO-Offload copies these 2-byte values to the GPU.
  virtual const uint16_t* params_half(int /*block*/) { return nullptr; }
  /// The gradient of this block is complete for this micro-batch (backward visits blocks L+1..0).
  virtual void grads_ready(int block) {}
  /// The block's gradient handed over whole as n 16-bit values (p: bf16 or fp16) in host memory,
  /// valid during the call, in place of writing grads(block) and calling grads_ready(block): what
  /// ZeRO-Offload's device store does with the 16-bit sum it keeps on the GPU. Not used by the
  /// model. The default adds them in fp32 into grads(block) and reports it ready; an engine may take
  /// the 16-bit values as they are where that gives the same bits.
  virtual void grads_ready_half(int block, const uint16_t* g, size_t n, kernels::Precision p) {
    if (float* h = grads(block)) kernels::add_from_half(g, h, n, p);
    grads_ready(block);
  }
};

class FlatParamStore : public ParamStore {
 public:
  FlatParamStore(const ParamLayout& layout, const float* params, float* grads) : layout_(layout), p_(params), g_(grads) {}
  const float* params(int block) override { return p_ + layout_.blocks()[block].offset; }
  float* grads(int block) override { return layout_.blocks()[block].trains ? g_ + layout_.blocks()[block].offset : nullptr; }

 private:
  const ParamLayout& layout_;
  const float* p_;
  float* g_;
};

}  // namespace hpct::model
