// Blocks that do not train, held whole in a backend's memory. See frozen_blocks.hpp.
#include "hpct/parallel/frozen_blocks.hpp"

#include "hpct/kernels/half.hpp"

namespace hpct::parallel {

FrozenBlocks::FrozenBlocks(const ParamLayout& schema, std::vector<int> blocks, kernels::Precision precision,
                           kernels::OpsBackend& be)
    : schema_(schema), blocks_(std::move(blocks)), precision_(precision), half_(precision != kernels::Precision::fp32),
      be_(be) {
  size_t total = 0;
  for (int b : blocks_) at_.push_back(total), total += schema.blocks()[b].numel;
  values_ = kernels::BackendBuffer(be_, total * (half_ ? sizeof(uint16_t) : sizeof(float)));
  widened_.resize(blocks_.size());
}

const float* FrozenBlocks::params(size_t i) {
  if (!half_) return values_.as<float>() + at_[i];
  kernels::BackendBuffer& w = widened_[i];
  if (!w.bytes()) {
    const size_t n = schema_.blocks()[blocks_[i]].numel;
    w = kernels::BackendBuffer(be_, n * sizeof(float));
    be_.widen_half(w.as<float>(), values_.as<uint16_t>() + at_[i], n, precision_);
  }
  return w.as<float>();
}

void FrozenBlocks::release(size_t i) { widened_[i].reset(); }

const uint16_t* FrozenBlocks::params_half(size_t i) const { return half_ ? values_.as<uint16_t>() + at_[i] : nullptr; }

void FrozenBlocks::init(const std::function<void(int, float*)>& init) {
  std::vector<float> buf;
  std::vector<uint16_t> h;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int b = blocks_[i];
    const size_t n = schema_.blocks()[b].numel;
    buf.resize(n);
    init(b, buf.data());
    widened_[i].reset();  // a copy of the old values
    if (!half_) {
      be_.copy_from_host(values_.as<float>() + at_[i], buf.data(), n * sizeof(float));
      continue;
    }
    h.resize(n);
    kernels::to_half(buf.data(), h.data(), n, precision_);
    be_.copy_from_host(values_.as<uint16_t>() + at_[i], h.data(), n * sizeof(uint16_t));
  }
}

void FrozenBlocks::copy_into(std::vector<float>& full) const {
  std::vector<uint16_t> h;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const BlockSpec& b = schema_.blocks()[blocks_[i]];
    if (!half_) {
      be_.copy_to_host(full.data() + b.offset, values_.as<float>() + at_[i], b.numel * sizeof(float));
      continue;
    }
    h.resize(b.numel);
    be_.copy_to_host(h.data(), values_.as<uint16_t>() + at_[i], b.numel * sizeof(uint16_t));
    kernels::from_half(h.data(), full.data() + b.offset, b.numel, precision_);
  }
}

}  // namespace hpct::parallel
