// ZeRO-Offload's parameter store for a model on a device (see device_store.hpp).
#include "hpct/parallel/device_store.hpp"

#include <algorithm>

namespace hpct::parallel {

DeviceStore::DeviceStore(model::ParamStore& host, const ParamLayout& layout, kernels::OpsBackend& be, bool cache_params)
    : host_(host),
      layout_(layout),
      be_(be),
      dparams_(be, layout.numel() * sizeof(float)),
      dgrads_(be, layout.numel() * sizeof(float)),
      active_(layout.blocks().size(), 0),
      cache_(cache_params),
      fresh_(layout.blocks().size(), 0),
      held_(layout.blocks().size(), 0) {
  size_t largest = 0;
  for (const auto& b : layout.blocks()) largest = std::max(largest, b.numel);
  staging_.resize(largest);
}

const float* DeviceStore::params(int b) {
  const auto& blk = layout_.blocks()[b];
  float* d = dparams_.as<float>() + blk.offset;
  if (cache_ && fresh_[b]) return d;
  // The engine's block (gathered at stage 3, widened in 16-bit runs) is held until the model
  // releases it, as the model itself would hold it.
  const float* h = host_.params(b);
  held_[b] = 1;
  be_.copy_from_host(d, h, blk.numel * sizeof(float));
  to_device_ += static_cast<double>(blk.numel) * sizeof(float);
  if (cache_) fresh_[b] = 1;
  return d;
}

void DeviceStore::invalidate() { std::fill(fresh_.begin(), fresh_.end(), 0); }

float* DeviceStore::grads(int b) {
  const auto& blk = layout_.blocks()[b];
  float* d = dgrads_.as<float>() + blk.offset;
  if (!active_[b]) {  // the first touch in this micro-step: the model accumulates from zero
    be_.zero(d, blk.numel * sizeof(float));
    active_[b] = 1;
  }
  return d;
}

void DeviceStore::release(int b) {
  if (!held_[b]) return;  // served from the device copy: nothing taken from the engine
  held_[b] = 0;
  host_.release(b);
}

void DeviceStore::grads_ready(int b) {
  const auto& blk = layout_.blocks()[b];
  float* h = host_.grads(b);
  if (active_[b]) {
    be_.copy_to_host(staging_.data(), dgrads_.as<float>() + blk.offset, blk.numel * sizeof(float));
    to_host_ += static_cast<double>(blk.numel) * sizeof(float);
    for (size_t i = 0; i < blk.numel; ++i) h[i] += staging_[i];
    active_[b] = 0;
  }
  host_.grads_ready(b);
}

}  // namespace hpct::parallel
