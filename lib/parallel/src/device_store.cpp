// ZeRO-Offload's parameter store for a model on a device (see device_store.hpp).
#include "hpct/parallel/device_store.hpp"

#include <algorithm>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/kernels/half.hpp"

namespace hpct::parallel {

DeviceStore::DeviceStore(model::ParamStore& host, const ParamLayout& layout, kernels::OpsBackend& be, bool cache_params,
                         kernels::Precision storage)
    : host_(host),
      layout_(layout),
      be_(be),
      active_(layout.blocks().size(), 0),
      summed_(layout.blocks().size(), 0),
      cache_(cache_params),
      storage_(storage),
      fresh_(layout.blocks().size(), 0),
      held_(layout.blocks().size(), 0),
      pblock_(layout.blocks().size()),
      gblock_(layout.blocks().size()) {
  size_t largest = 0;
  for (const auto& b : layout.blocks()) largest = std::max(largest, b.numel);
  if (cache_ && half16()) staging16_.resize(largest);
  else staging_.resize(largest);
  if (cache_) {  // the whole model's parameters and gradient sum stay on the device between uses
    const size_t elem = half16() ? sizeof(uint16_t) : sizeof(float);
    if (half16()) dparams16_ = kernels::BackendBuffer(be, layout.numel() * elem);
    else dparams_ = kernels::BackendBuffer(be, layout.numel() * elem);
    dgrads_ = kernels::BackendBuffer(be, layout.numel() * elem);
    live_ = peak_ = dparams16_.bytes() + dparams_.bytes() + dgrads_.bytes();
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

const float* DeviceStore::params(int b) {
  const auto& blk = layout_.blocks()[b];
  if (cache_ && half16()) {
    // 2-byte copies stay on the device; the model gets this block widened to fp32 while it uses it.
    uint16_t* d16 = dparams16_.as<uint16_t>() + blk.offset;
    if (!fresh_[b]) {
      const uint16_t* h16 = host_.params_half(b);
      if (!h16) throw Error("ZeRO-Offload: block '" + blk.name + "' has no 16-bit copy in host memory");
      be_.copy_from_host(d16, h16, blk.numel * sizeof(uint16_t));
      to_device_ += static_cast<double>(blk.numel) * sizeof(uint16_t);
      fresh_[b] = 1;
    }
    float* w = take(pblock_, b);
    be_.widen_half(w, d16, blk.numel, storage_);
    return w;
  }
  if (cache_ && fresh_[b]) return dparams_.as<float>() + blk.offset;
  // The engine's block (gathered at stage 3, widened in 16-bit runs) is held until the model
  // releases it, as the model itself would hold it.
  const float* h = host_.params(b);
  held_[b] = 1;
  float* d = cache_ ? dparams_.as<float>() + blk.offset : take(pblock_, b);
  be_.copy_from_host(d, h, blk.numel * sizeof(float));
  to_device_ += static_cast<double>(blk.numel) * sizeof(float);
  if (cache_) fresh_[b] = 1;
  return d;
}

void DeviceStore::invalidate() { std::fill(fresh_.begin(), fresh_.end(), 0); }

void DeviceStore::begin_micro_step(bool first, bool last) {
  if (first) std::fill(summed_.begin(), summed_.end(), 0);
  last_ = last;
}

float* DeviceStore::grads(int b) {
  const auto& blk = layout_.blocks()[b];
  if (!blk.trains) return nullptr;  // frozen (LoRA's base): no gradient
  float* d = take(gblock_, b);
  if (!active_[b]) {  // the first touch in this micro-step: the model accumulates from zero
    be_.zero(d, blk.numel * sizeof(float));
    active_[b] = 1;
  }
  return d;
}

void DeviceStore::release(int b) {
  if (pblock_[b].bytes()) give_back(pblock_, b);  // a working copy (stage 3, or widened): it goes too
  if (!held_[b]) return;  // served from the device copy: nothing taken from the engine
  held_[b] = 0;
  host_.release(b);
}

void DeviceStore::fold(int b) {
  const auto& blk = layout_.blocks()[b];
  const float* g = gblock_[b].as<float>();
  if (half16()) {
    uint16_t* acc = dgrads_.as<uint16_t>() + blk.offset;
    if (!summed_[b]) be_.zero(acc, blk.numel * sizeof(uint16_t));  // +0 in bf16 and fp16
    be_.accumulate_half(acc, g, blk.numel, storage_);
  } else {
    float* acc = dgrads_.as<float>() + blk.offset;
    if (!summed_[b]) be_.zero(acc, blk.numel * sizeof(float));
    be_.residual_forward(acc, acc, g, blk.numel);
  }
  summed_[b] = 1;
}

void DeviceStore::hand_over(int b) {
  const auto& blk = layout_.blocks()[b];
  float* h = host_.grads(b);
  if (!summed_[b]) return;  // no gradient this step (the engine's buffer stays zero)
  if (half16()) {
    be_.copy_to_host(staging16_.data(), dgrads_.as<uint16_t>() + blk.offset, blk.numel * sizeof(uint16_t));
    to_host_ += static_cast<double>(blk.numel) * sizeof(uint16_t);
    kernels::add_from_half(staging16_.data(), h, blk.numel, storage_);  // exact: the engine rounds it to itself
  } else {
    add_to_host(h, dgrads_.as<float>() + blk.offset, blk.numel);
  }
  summed_[b] = 0;
}

void DeviceStore::add_to_host(float* h, const float* d, size_t n) {
  be_.copy_to_host(staging_.data(), d, n * sizeof(float));
  to_host_ += static_cast<double>(n) * sizeof(float);
  for (size_t i = 0; i < n; ++i) h[i] += staging_[i];
}

void DeviceStore::grads_ready(int b) {
  if (!layout_.blocks()[b].trains) return;
  if (cache_) {  // stages 0-2: summed on the device, handed over once per step
    if (active_[b]) {
      fold(b);
      active_[b] = 0;
      give_back(gblock_, b);
    }
    if (!last_) return;
    hand_over(b);
    host_.grads_ready(b);
    return;
  }
  const auto& blk = layout_.blocks()[b];
  float* h = host_.grads(b);
  if (active_[b]) {
    add_to_host(h, gblock_[b].as<float>(), blk.numel);
    active_[b] = 0;
    give_back(gblock_, b);
  }
  host_.grads_ready(b);
}

}  // namespace hpct::parallel
