// ZeRO-Offload's parameter store for a model on a device (see device_store.hpp).
#include "hpct/parallel/device_store.hpp"

#include <algorithm>

namespace hpct::parallel {

DeviceStore::DeviceStore(model::ParamStore& host, const ParamLayout& layout, kernels::OpsBackend& be, bool cache_params)
    : host_(host),
      layout_(layout),
      be_(be),
      active_(layout.blocks().size(), 0),
      cache_(cache_params),
      fresh_(layout.blocks().size(), 0),
      held_(layout.blocks().size(), 0) {
  size_t largest = 0;
  for (const auto& b : layout.blocks()) largest = std::max(largest, b.numel);
  staging_.resize(largest);
  if (cache_) {  // the whole model, resident
    dparams_ = kernels::BackendBuffer(be, layout.numel() * sizeof(float));
    dgrads_ = kernels::BackendBuffer(be, layout.numel() * sizeof(float));
    live_ = peak_ = dparams_.bytes() + dgrads_.bytes();
  } else {
    pblock_.resize(layout.blocks().size());
    gblock_.resize(layout.blocks().size());
  }
}

float* DeviceStore::take(std::vector<kernels::BackendBuffer>& blocks, int b) {
  kernels::BackendBuffer& buf = blocks[b];
  if (!buf.bytes()) {
    buf = kernels::BackendBuffer(be_, layout_.blocks()[b].numel * sizeof(float));
    live_ += buf.bytes();
    peak_ = std::max(peak_, live_);
  }
  return buf.as<float>();
}

void DeviceStore::give_back(std::vector<kernels::BackendBuffer>& blocks, int b) {
  live_ -= blocks[b].bytes();
  blocks[b].reset();
}

float* DeviceStore::param_slot(int b) {
  return cache_ ? dparams_.as<float>() + layout_.blocks()[b].offset : take(pblock_, b);
}

float* DeviceStore::grad_slot(int b) {
  return cache_ ? dgrads_.as<float>() + layout_.blocks()[b].offset : take(gblock_, b);
}

const float* DeviceStore::params(int b) {
  const auto& blk = layout_.blocks()[b];
  if (cache_ && fresh_[b]) return param_slot(b);
  // The engine's block (gathered at stage 3, widened in 16-bit runs) is held until the model
  // releases it, as the model itself would hold it.
  const float* h = host_.params(b);
  held_[b] = 1;
  float* d = param_slot(b);
  be_.copy_from_host(d, h, blk.numel * sizeof(float));
  to_device_ += static_cast<double>(blk.numel) * sizeof(float);
  if (cache_) fresh_[b] = 1;
  return d;
}

void DeviceStore::invalidate() { std::fill(fresh_.begin(), fresh_.end(), 0); }

float* DeviceStore::grads(int b) {
  const auto& blk = layout_.blocks()[b];
  float* d = grad_slot(b);
  if (!active_[b]) {  // the first touch in this micro-step: the model accumulates from zero
    be_.zero(d, blk.numel * sizeof(float));
    active_[b] = 1;
  }
  return d;
}

void DeviceStore::release(int b) {
  if (!cache_ && pblock_[b].bytes()) give_back(pblock_, b);  // stage 3: the device copy goes too
  if (!held_[b]) return;  // served from the device copy: nothing taken from the engine
  held_[b] = 0;
  host_.release(b);
}

void DeviceStore::grads_ready(int b) {
  const auto& blk = layout_.blocks()[b];
  float* h = host_.grads(b);
  if (active_[b]) {
    be_.copy_to_host(staging_.data(), grad_slot(b), blk.numel * sizeof(float));
    to_host_ += static_cast<double>(blk.numel) * sizeof(float);
    for (size_t i = 0; i < blk.numel; ++i) h[i] += staging_[i];
    active_[b] = 0;
    if (!cache_) give_back(gblock_, b);
  }
  host_.grads_ready(b);
}

}  // namespace hpct::parallel
