// hpct/core/param_layout.hpp — the named table of a model's tensors over one flat allocation.
//
// As llm.c does, all parameters live in one buffer and each tensor is a named view at an offset.
// The same table drives the optimizer (which tensors get weight decay), data-parallel buckets,
// ZeRO sharding, checkpoints (dataset names) and memory reports, so a tensor is described once.
// Tensors are grouped in "blocks" (embeddings, each layer, the final norm) that are contiguous:
// the unit a ZeRO-3 gather or an overlapped gradient reduction works on.
#pragma once
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace hpct {

/// How the tensor a rank holds is a part of the full tensor (tensor parallelism; Megatron's
/// partition_dim and partition_stride). dim >= 0: the full tensor's dimension `dim` is cut into
/// `stride` equal sections and each section into `parts` equal pieces; this rank holds piece
/// `index` of every section, sections in order (qkv's rows are q|k|v: stride 3 keeps each rank's
/// q, k and v rows together). dim < 0: the whole tensor; with parts > 1 every rank of the
/// tensor-parallel group holds a copy and `index` says which one (copy 0 is the primary: it alone
/// is counted in norms and written to checkpoints, Megatron's param_is_not_tensor_parallel_duplicate).
/// `sections`, when given, replaces the equal ones: the dimension's sections in order, of these sizes
/// (grouped-query attention's q|k|v rows: NH, KV and KV heads), each cut into `parts` pieces.
struct Partition {
  int dim = -1;
  int parts = 1;
  int index = 0;
  int stride = 1;
  std::vector<int64_t> sections;
  /// The sizes of the sections of a dimension of size D.
  std::vector<int64_t> section_sizes(int64_t D) const {
    return sections.empty() ? std::vector<int64_t>(stride, D / stride) : sections;
  }
};

/// How a tensor starts. The layout only carries it, declared with the tensor; the model's init reads
/// it. unset: nothing was declared, and the model's init refuses the tensor, so a new tensor never
/// silently starts from a default (an RMSNorm weight at N(0, std) would train, badly).
struct InitSpec {
  enum class Kind { unset, zeros, ones, normal };
  Kind kind = Kind::unset;
  double std = 0;  // normal: N(0, std)
  static InitSpec zeros() { return {Kind::zeros, 0}; }
  static InitSpec ones() { return {Kind::ones, 0}; }
  static InitSpec normal(double std) { return {Kind::normal, std}; }
};

struct TensorSpec {
  std::string name;            // e.g. "layers.3.attn.qkv.weight"
  std::vector<int64_t> shape;  // the full (unsharded, tensor-parallel-whole) shape: the checkpoint's
  size_t offset = 0;           // elements from the start of the flat buffer
  size_t numel = 0;            // elements this rank holds (the full numel unless partitioned)
  int block = 0;               // contiguous group this tensor belongs to
  bool weight_decay = true;    // Megatron: no decay on biases and norm weights
  Partition part;
  InitSpec init;

  bool partitioned() const { return part.dim >= 0 && part.parts > 1; }
  /// Counted once over the tensor-parallel group: a partition, or the primary copy of a replica.
  bool primary() const { return part.dim >= 0 || part.index == 0; }
  /// The shape this rank holds.
  std::vector<int64_t> local_shape() const;
  /// Elements of the full tensor.
  size_t full_numel() const;
  /// Calls fn(full_begin, local_begin, count) for each run of consecutive elements of the full
  /// tensor (row-major flat indices) that this rank's elements [begin, end) cover, in order.
  template <class F>
  void for_full_runs(uint64_t begin, uint64_t end, F&& fn) const;
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
  bool trains = true;  // false: frozen (LoRA's base weights): no gradient, no optimizer state, not checkpointed
};

class ParamLayout {
 public:
  /// Starts a new block; tensors added after belong to it.
  void begin_block(const std::string& name, ReduceGroup group = ReduceGroup::dense);
  /// Adds a tensor of full shape `shape`; with a partition the rank holds its part (the split
  /// dimension must divide by parts * stride; throws naming the tensor otherwise).
  const TensorSpec& add(const std::string& name, std::vector<int64_t> shape, bool weight_decay, Partition part = {},
                        InitSpec init = {});
  size_t numel() const { return total_; }
  /// Elements of every tensor whole (what a checkpoint holds): numel() without tensor parallelism.
  size_t full_numel() const;
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const std::vector<BlockSpec>& blocks() const { return blocks_; }
  /// Throws hpct::Error naming the tensor if absent.
  const TensorSpec& find(const std::string& name) const;
  /// A layout of the given blocks only (in that order), packed from offset 0; each block records its
  /// index here as `origin`. What a ZeRO engine of one reducing group (or one rank's experts) sees.
  ParamLayout subset(const std::vector<int>& blocks) const;
  /// Indices of the blocks of one group, in order.
  std::vector<int> blocks_of(ReduceGroup g) const;
  /// Marks a block frozen: its tensors are used but never trained (LoRA's base weights).
  void freeze(int block);
  /// Indices of the blocks that train (or, with trains = false, the frozen ones), in order.
  std::vector<int> training_blocks(bool trains = true) const;
  /// subset(training_blocks()): what a checkpoint stores. The layout itself when nothing is frozen.
  ParamLayout trained() const;

 private:
  std::vector<TensorSpec> tensors_;
  std::vector<BlockSpec> blocks_;
  size_t total_ = 0;
};

/// "[768, 2304]", for messages.
std::string shape_string(const std::vector<int64_t>& shape);

template <class F>
void TensorSpec::for_full_runs(uint64_t begin, uint64_t end, F&& fn) const {
  if (begin >= end) return;
  if (!partitioned()) {
    fn(begin, begin, end - begin);
    return;
  }
  // Local tensor: [outer, D/parts, inner] with the split dimension in the middle; the local rows
  // of one piece (same outer index, same section) are consecutive rows of the full tensor.
  uint64_t outer = 1, inner = 1;
  for (int d = 0; d < part.dim; ++d) outer *= static_cast<uint64_t>(shape[d]);
  for (size_t d = part.dim + 1; d < shape.size(); ++d) inner *= static_cast<uint64_t>(shape[d]);
  const uint64_t D = static_cast<uint64_t>(shape[part.dim]), Dl = D / part.parts;
  if (part.sections.empty()) {
    const uint64_t sec = D / part.stride, piece = sec / part.parts;  // full rows per section, per piece
    uint64_t i = begin;
    while (i < end) {
      const uint64_t row = i / inner, in_row = i % inner;  // local row index over (outer, Dl)
      const uint64_t o = row / Dl, r = row % Dl;
      const uint64_t full_r = (r / piece) * sec + static_cast<uint64_t>(part.index) * piece + r % piece;
      const uint64_t n = std::min<uint64_t>(end - i, (piece - r % piece) * inner - in_row);
      fn((o * D + full_r) * inner + in_row, i, n);
      i += n;
    }
    return;
  }
  uint64_t i = begin;  // sections of their own sizes: find the one local row r falls in
  while (i < end) {
    const uint64_t row = i / inner, in_row = i % inner;
    const uint64_t o = row / Dl, r = row % Dl;
    uint64_t full_start = 0, local_start = 0, piece = 0;
    for (int64_t s : part.sections) {
      piece = static_cast<uint64_t>(s) / part.parts;
      if (r < local_start + piece) break;
      full_start += static_cast<uint64_t>(s);
      local_start += piece;
    }
    const uint64_t k = r - local_start;
    const uint64_t full_r = full_start + static_cast<uint64_t>(part.index) * piece + k;
    const uint64_t n = std::min<uint64_t>(end - i, (piece - k) * inner - in_row);
    fn((o * D + full_r) * inner + in_row, i, n);
    i += n;
  }
}

}  // namespace hpct
