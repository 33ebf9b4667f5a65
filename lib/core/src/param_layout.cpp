#include "hpct/core/param_layout.hpp"

#include "hpct/core/error.hpp"

namespace hpct {

void ParamLayout::begin_block(const std::string& name, ReduceGroup group) {
  blocks_.push_back(BlockSpec{name, total_, 0, group, -1});
}

const TensorSpec& ParamLayout::add(const std::string& name, std::vector<int64_t> shape, bool weight_decay, Partition part,
                                   InitSpec init) {
  if (blocks_.empty()) begin_block("params");
  if (part.parts < 1 || part.stride < 1 || part.index < 0 || part.index >= part.parts ||
      part.dim >= static_cast<int>(shape.size()))
    throw Error("tensor '" + name + "': impossible partition");
  if (part.dim >= 0 && !part.sections.empty()) {
    int64_t sum = 0;
    for (int64_t s : part.sections) {
      if (s <= 0 || s % part.parts != 0)
        throw Error("tensor '" + name + "': a section of " + std::to_string(s) + " rows does not divide into " +
                    std::to_string(part.parts) + " parts");
      sum += s;
    }
    if (sum != shape[part.dim]) throw Error("tensor '" + name + "': its sections do not add up to dimension " + std::to_string(part.dim));
  } else if (part.dim >= 0 && shape[part.dim] % (int64_t(part.parts) * part.stride) != 0)
    throw Error("tensor '" + name + "' of shape " + shape_string(shape) + ": dimension " + std::to_string(part.dim) +
                " does not divide into " + std::to_string(part.parts) + " parts" +
                (part.stride > 1 ? " of each of " + std::to_string(part.stride) + " sections" : std::string()));
  TensorSpec t{name, std::move(shape), total_, 0, static_cast<int>(blocks_.size()) - 1, weight_decay, part, init};
  size_t n = 1;
  for (int64_t d : t.local_shape()) {
    if (d <= 0) throw Error("tensor '" + name + "' has a non-positive dimension");
    n *= static_cast<size_t>(d);
  }
  t.numel = n;
  total_ += n;
  blocks_.back().numel += n;
  tensors_.push_back(std::move(t));
  return tensors_.back();
}

const TensorSpec& ParamLayout::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  throw Error("no tensor named '" + name + "' in the model");
}

ParamLayout ParamLayout::subset(const std::vector<int>& blocks) const {
  ParamLayout out;
  for (int b : blocks) {
    if (b < 0 || b >= static_cast<int>(blocks_.size())) throw Error("subset: no block " + std::to_string(b));
    out.begin_block(blocks_[b].name, blocks_[b].group);
    out.blocks_.back().origin = b;
    out.blocks_.back().trains = blocks_[b].trains;
    for (const auto& t : tensors_)
      if (t.block == b) out.add(t.name, t.shape, t.weight_decay, t.part);
  }
  return out;
}

std::vector<int> ParamLayout::blocks_of(ReduceGroup g) const {
  std::vector<int> out;
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (blocks_[b].group == g) out.push_back(static_cast<int>(b));
  return out;
}

void ParamLayout::freeze(int block) {
  if (block < 0 || block >= static_cast<int>(blocks_.size())) throw Error("freeze: no block " + std::to_string(block));
  blocks_[block].trains = false;
}

std::vector<int> ParamLayout::training_blocks(bool trains) const {
  std::vector<int> out;
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (blocks_[b].trains == trains) out.push_back(static_cast<int>(b));
  return out;
}

ParamLayout ParamLayout::trained() const {
  if (training_blocks(false).empty()) return *this;
  return subset(training_blocks());
}

std::vector<int64_t> TensorSpec::local_shape() const {
  std::vector<int64_t> s = shape;
  if (partitioned()) s[part.dim] /= part.parts;
  return s;
}

size_t TensorSpec::full_numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

size_t ParamLayout::full_numel() const {
  size_t n = 0;
  for (const auto& t : tensors_) n += t.full_numel();
  return n;
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace hpct
