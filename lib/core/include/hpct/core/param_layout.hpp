// hpct/core/param_layout.hpp — the named table of a model's tensors over one flat allocation.
//
// As llm.c does, all parameters live in one buffer and each tensor is a named view at an offset.
// The same table drives the optimizer (which tensors get weight decay), data-parallel buckets,
// ZeRO sharding, checkpoints (dataset names) and memory reports, so a tensor is described once.
// Tensors are grouped in "blocks" (embeddings, each layer, the final norm) that are contiguous:
// the unit a ZeRO-3 gather or an overlapped gradient reduction works on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hpct {

struct TensorSpec {
  std::string name;            // e.g. "layers.3.attn.qkv.weight"
  std::vector<int64_t> shape;  // global (unsharded) shape
  size_t offset = 0;           // elements from the start of the flat buffer
  size_t numel = 0;
  int block = 0;               // contiguous group this tensor belongs to
  bool weight_decay = true;    // Megatron: no decay on biases and norm weights
};

/// Which data-parallel group reduces (and ZeRO shards) a block: dense blocks over every rank that
/// holds the same model part, expert blocks only over the ranks holding the same experts (the
/// expert-data-parallel group). See comm/process_grid.hpp.
enum class ReduceGroup { dense = 0, expert = 1 };

struct BlockSpec {
  std::string name;  // "embedding", "layers.3", "layers.3.mlp.experts.5", "final_norm"
  size_t offset = 0;
  size_t numel = 0;
  ReduceGroup group = ReduceGroup::dense;
  int origin = -1;   // in a subset(): the block's index in the layout it was taken from
};

class ParamLayout {
 public:
  /// Starts a new block; tensors added after belong to it.
  void begin_block(const std::string& name, ReduceGroup group = ReduceGroup::dense);
  const TensorSpec& add(const std::string& name, std::vector<int64_t> shape, bool weight_decay);
  size_t numel() const { return total_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const std::vector<BlockSpec>& blocks() const { return blocks_; }
  /// Throws hpct::Error naming the tensor if absent.
  const TensorSpec& find(const std::string& name) const;
  /// A layout of the given blocks only (in that order), packed from offset 0; each block records its
  /// index here as `origin`. What a ZeRO engine of one reducing group (or one rank's experts) sees.
  ParamLayout subset(const std::vector<int>& blocks) const;
  /// Indices of the blocks of one group, in order.
  std::vector<int> blocks_of(ReduceGroup g) const;

 private:
  std::vector<TensorSpec> tensors_;
  std::vector<BlockSpec> blocks_;
  size_t total_ = 0;
};

/// "[768, 2304]", for messages.
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace hpct
