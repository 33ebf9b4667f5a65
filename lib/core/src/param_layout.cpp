#include "hpct/core/param_layout.hpp"

#include "hpct/core/error.hpp"

namespace hpct {

void ParamLayout::begin_block(const std::string& name) { blocks_.push_back(BlockSpec{name, total_, 0}); }

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

std::string shape_string(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace hpct
