// hpct/parallel/frozen_blocks.hpp — blocks that do not train (LoRA's base weights), held whole on
// every rank in the memory of a backend.
//
// What it is: the frozen group of a GroupedStore. Every rank holds the blocks whole, in the
// training precision's storage (16 bits in bf16/fp16 runs, widened to an fp32 working copy while
// the model uses a block, until release), with no gradient, no optimizer state and no checkpoint
// pieces (a checkpoint stores ParamLayout::trained()). The memory is a backend's: the host (the
// CPU backend) beside the host engine and ZeRO-Offload, the GPU beside the GPU-resident engine, so
// the model reads the base where it computes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "hpct/core/param_layout.hpp"
#include "hpct/kernels/ops_backend.hpp"

namespace hpct::parallel {

class FrozenBlocks {
 public:
  /// blocks: schema block ids, in schema order. be: where the values live (must outlive this).
  FrozenBlocks(const ParamLayout& schema, std::vector<int> blocks, kernels::Precision precision, kernels::OpsBackend& be);

  size_t size() const { return blocks_.size(); }
  int block(size_t i) const { return blocks_[i]; }

  /// The i-th block in fp32, in the backend's memory (16-bit runs: a working copy until release(i)).
  const float* params(size_t i);
  void release(size_t i);
  /// 16-bit runs: the stored 16-bit block; nullptr in fp32 runs.
  const uint16_t* params_half(size_t i) const;
  /// init(schema block, dst) writes the whole block into dst (host memory).
  void init(const std::function<void(int block, float* dst)>& init);
  /// Writes every block, in fp32, into `full` (host memory) at its schema offset.
  void copy_into(std::vector<float>& full) const;
  size_t bytes() const { return values_.bytes(); }

 private:
  const ParamLayout& schema_;
  std::vector<int> blocks_;
  std::vector<size_t> at_;  // each block's first element in values_
  kernels::Precision precision_;
  bool half_;
  kernels::OpsBackend& be_;
  kernels::BackendBuffer values_;                 // fp32, or the 16-bit copies
  std::vector<kernels::BackendBuffer> widened_;   // 16-bit runs: per block, its fp32 copy while in use
};

}  // namespace hpct::parallel
