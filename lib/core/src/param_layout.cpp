#include "hpct/core/param_layout.hpp"

#include "hpct/core/error.hpp"

namespace hpct {

void ParamLayout::begin_block(const std::string& name, ReduceGroup group) {
  blocks_.push_back(BlockSpec{name, total_, 0, group, -1});
}

const TensorSpec& ParamLayout::add(const std::string& name, std::vector<int64_t> shape, bool weight_decay) {
  if (blocks_.empty()) begin_block("params");
  size_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) throw Error("tensor '" + name + "' has a non-positive dimension");
    n *= static_cast<size_t>(d);
  }
  TensorSpec t{name, std::move(shape), total_, n, static_cast<int>(blocks_.size()) - 1, weight_decay};
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
    for (const auto& t : tensors_)
      if (t.block == b) out.add(t.name, t.shape, t.weight_decay);
  }
  return out;
}

std::vector<int> ParamLayout::blocks_of(ReduceGroup g) const {
  std::vector<int> out;
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (blocks_[b].group == g) out.push_back(static_cast<int>(b));
  return out;
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace hpct
