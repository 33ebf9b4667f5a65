// ZeRO-Offload's parameter store for a model on a device (see device_store.hpp).
#include "hpct/parallel/device_store.hpp"

#include <algorithm>

namespace hpct::parallel {

DeviceStore::DeviceStore(model::ParamStore& host, const ParamLayout& layout, kernels::OpsBackend& be)
    : host_(host),
      layout_(layout),
      be_(be),
      dparams_(be, layout.numel() * sizeof(float)),
      dgrads_(be, layout.numel() * sizeof(float)),
      active_(layout.blocks().size(), 0) {
  size_t largest = 0;
  for (const auto& b : layout.blocks()) largest = std::max(largest, b.numel);
  staging_.resize(largest);
}

const float* DeviceStore::params(int b) {
  const auto& blk = layout_.blocks()[b];
  float* d = dparams_.as<float>() + blk.offset;
  // Every call copies: the engine's block may have changed (an optimizer step, a checkpoint load)
  // or been gathered afresh (stage 3), and the copy is what the model computes with.
  be_.copy_from_host(d, host_.params(b), blk.numel * sizeof(float));
  to_device_ += static_cast<double>(blk.numel) * sizeof(float);
  return d;
}

float* DeviceStore::grads(int b) {
  const auto& blk = layout_.blocks()[b];
  float* d = dgrads_.as<float>() + blk.offset;
  if (!active_[b]) {  // the first touch in this micro-step: the model accumulates from zero
    be_.zero(d, blk.numel * sizeof(float));
    active_[b] = 1;
  }
  return d;
}

void DeviceStore::release(int b) { host_.release(b); }

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
