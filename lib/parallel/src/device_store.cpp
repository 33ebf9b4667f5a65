// ZeRO-Offload's parameter store for a model on a device (see device_store.hpp).
#include "hpct/parallel/device_store.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/host_copy.hpp"

namespace hpct::parallel {

DeviceStore::DeviceStore(model::ParamStore& host, const ParamLayout& layout, kernels::OpsBackend& be, bool cache_params,
                         kernels::Precision storage, const std::vector<int>& held)
    : host_(host),
      layout_(layout),
      be_(be),
      behind_(layout.blocks().size()),
      pipelined_(!be.host_memory()),
      active_(layout.blocks().size(), 0),
      summed_(layout.blocks().size(), 0),
      cache_(cache_params),
      storage_(storage),
      fresh_(layout.blocks().size(), 0),
      queued_(layout.blocks().size(), 0),
      upload_of_(layout.blocks().size(), 0),
      order_pos_(layout.blocks().size(), -1),
      held_(layout.blocks().size(), 0),
      direct_(layout.blocks().size(), 0),
      pblock_(layout.blocks().size()),
      gblock_(layout.blocks().size()) {
  mine_.assign(layout.blocks().size(), held.empty() ? 1 : 0);
  for (int b : held) mine_.at(static_cast<size_t>(b)) = 1;
  // The device copies hold the blocks this rank holds, back to back in layout order (under expert
  // parallelism not the other ranks' experts).
  dev_off_.assign(layout.blocks().size(), SIZE_MAX);
  for (size_t b = 0; b < layout.blocks().size(); ++b)
    if (mine_[b]) {
      dev_off_[b] = dev_numel_;
      dev_numel_ += layout.blocks()[b].numel;
    }
  size_t largest = 0;
  for (const auto& b : layout.blocks()) largest = std::max(largest, b.numel);
  // Gradients travel in the accumulator's width (stages 0-2) or fp32 (stage 3); parameters in the
  // device copy's. One slot each way where the copies are done when they return.
  const size_t down_elem = cache_ && half16() ? sizeof(uint16_t) : sizeof(float);
  const size_t up_elem = half16() ? sizeof(uint16_t) : sizeof(float);
  down_.resize(pipelined_ ? kSlots : 1);
  for (Slot& s : down_) s.host = kernels::HostBuffer(be_, largest * down_elem);
  if (cache_ && pipelined_ && half16()) pin_runs();
  bool every_held_direct = true;
  for (size_t b = 0; b < direct_.size(); ++b) every_held_direct = every_held_direct && (direct_[b] || !mine_[b]);
  if (cache_ && pipelined_ && !every_held_direct) {
    up_.resize(kSlots);
    for (Slot& s : up_) s.host = kernels::HostBuffer(be_, largest * up_elem);
  }
  if (cache_) {  // the whole model's parameters and gradient sum stay on the device between uses
    const size_t elem = half16() ? sizeof(uint16_t) : sizeof(float);
    if (half16()) dparams16_ = kernels::BackendBuffer(be, dev_numel_ * elem);
    else dparams_ = kernels::BackendBuffer(be, dev_numel_ * elem);
    dgrads_ = kernels::BackendBuffer(be, dev_numel_ * elem);
    live_ = peak_ = dparams16_.bytes() + dparams_.bytes() + dgrads_.bytes();
  }
}

size_t DeviceStore::device_bytes_needed(const ParamLayout& layout, bool cache_params, kernels::Precision storage,
                                        const std::vector<int>& held) {
  size_t largest = 0, numel = held.empty() ? layout.numel() : 0;
  for (const auto& b : layout.blocks()) largest = std::max(largest, b.numel);
  for (int b : held) numel += layout.blocks().at(static_cast<size_t>(b)).numel;
  const size_t elem = storage == kernels::Precision::fp32 ? sizeof(float) : sizeof(uint16_t);
  return (cache_params ? 2 * numel * elem : 0) + largest * sizeof(float);
}

size_t DeviceStore::at(int b) const {
  const size_t o = dev_off_[static_cast<size_t>(b)];
  if (o == SIZE_MAX)
    throw Error("ZeRO-Offload: block '" + layout_.blocks()[static_cast<size_t>(b)].name +
                "' is not one this rank holds (expert parallelism: another rank's expert)");
  return o;
}

// Each run of blocks whose 16-bit copies lie back to back in the engine's memory is pinned once
// (a page may not be pinned twice, so not block by block); a run the backend cannot pin goes
// through the slots.
void DeviceStore::pin_runs() {
  const auto& blocks = layout_.blocks();
  size_t b = 0;
  while (b < blocks.size()) {
    const uint16_t* start = mine_[b] ? host_.params_half(static_cast<int>(b)) : nullptr;
    if (!start || blocks[b].numel == 0) {
      ++b;
      continue;
    }
    size_t e = b + 1, n = blocks[b].numel;
    while (e < blocks.size() && mine_[e] && blocks[e].numel > 0 && host_.params_half(static_cast<int>(e)) == start + n)
      n += blocks[e++].numel;
    auto* p = const_cast<uint16_t*>(start);  // pinning changes no value
    if (be_.pin_host(p, n * sizeof(uint16_t))) {
      pins_.push_back(p);
      pinned_bytes_ += n * sizeof(uint16_t);
      std::fill(direct_.begin() + static_cast<std::ptrdiff_t>(b), direct_.begin() + static_cast<std::ptrdiff_t>(e), 1);
    }
    b = e;
  }
}

DeviceStore::~DeviceStore() {
  // Nothing may still update the engine (which outlives this store only a little) nor read its
  // pinned copies when they are unpinned: the step behind ends first, without its re-gathers, its
  // `after` or its uploads (StepBehind::abandon), then the direct uploads are waited for.
  behind_.abandon();
  try {
    settle();  // the direct uploads
  } catch (...) {  // a failed device: unpinned all the same
  }
  for (void* p : pins_) be_.unpin_host(p);
  // Nothing may still be copying into or out of a slot when it is freed (nor out of a device
  // gradient when it is released).
  for (Pending& p : pending_) {
    try {
      be_.wait_transfer(p.t);
    } catch (...) {  // a failed device: the buffers go all the same
    }
  }
  pending_.clear();
  for (auto* slots : {&down_, &up_})
    for (Slot& s : *slots) {
      try {
        be_.wait_transfer(s.t);
      } catch (...) {
      }
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

// ---- parameters ------------------------------------------------------------------------------

void DeviceStore::upload(int b) {
  const auto& blk = layout_.blocks()[b];
  const size_t bytes = blk.numel * (half16() ? sizeof(uint16_t) : sizeof(float));
  void* dst = half16() ? static_cast<void*>(dparams16_.as<uint16_t>() + at(b)) : dparams_.as<float>() + at(b);
  const void* src;
  if (half16()) {
    src = host_.params_half(b);
    if (!src) throw Error("ZeRO-Offload: block '" + blk.name + "' has no 16-bit copy in host memory");
  } else {
    src = host_.params(b);
  }
  if (direct_[b]) {  // straight from the engine's pinned copy, which begin_update() waits for
    upload_of_[b] = be_.upload_async(dst, src, bytes);
    queued_[b] = 1;
    to_device_ += static_cast<double>(bytes);
    return;
  }
  Slot* slot = nullptr;
  if (pipelined_) {  // through a page-locked slot, so the copy runs beside the ops
    slot = &up_[next_up_];
    next_up_ = (next_up_ + 1) % up_.size();
    be_.wait_transfer(slot->t);  // its previous upload has left it
    kernels::host_copy(slot->host.as<void>(), src, bytes);
    src = slot->host.as<void>();
  }
  upload_of_[b] = be_.upload_async(dst, src, bytes);
  if (slot) slot->t = upload_of_[b];
  if (half16()) {
    // Nothing taken from the engine.
  } else {
    host_.release(b);  // copied (into the slot, or to the device where copies are done on return)
  }
  queued_[b] = 1;
  to_device_ += static_cast<double>(bytes);
}

void DeviceStore::upload_ahead(int b) {
  if (!pipelined_ || !order_done_ || order_pos_[b] < 0) return;
  for (size_t k = 1; k < up_.size(); ++k) {
    const size_t at = static_cast<size_t>(order_pos_[b]) + k;
    if (at >= order_.size()) return;
    const int c = order_[at];
    if (!fresh_[c] && !queued_[c] && behind_.final(c)) upload(c);
  }
}

const float* DeviceStore::params(int b) {
  behind_.count_use();
  const auto& blk = layout_.blocks()[b];
  if (!cache_) {
    // Stage 3: the engine's gathered block is held until the model releases it, as the model itself
    // would hold it, and copied to a device block of its own.
    const float* h = host_.params(b);
    held_[b] = 1;
    float* d = take(pblock_, b);
    be_.copy_from_host(d, h, blk.numel * sizeof(float));
    to_device_ += static_cast<double>(blk.numel) * sizeof(float);
    return d;
  }
  if (!fresh_[b]) {
    behind_.wait_for(b);
    if (!queued_[b]) upload(b);
    upload_ahead(b);
    be_.await_transfer(upload_of_[b]);  // the ops that read it wait for it on the device
    fresh_[b] = 1;
    if (!order_done_ && order_pos_[b] < 0) {
      order_pos_[b] = static_cast<int>(order_.size());
      order_.push_back(b);
    }
  }
  if (half16()) {  // 2-byte copies stay on the device; the model gets this block widened to fp32 while it uses it
    float* w = take(pblock_, b);
    be_.widen_half(w, dparams16_.as<uint16_t>() + at(b), blk.numel, storage_);
    return w;
  }
  return dparams_.as<float>() + at(b);
}

const uint16_t* DeviceStore::params16(int b) {
  if (!cache_ || !half16() || !fresh_[b]) return nullptr;
  return dparams16_.as<uint16_t>() + at(b);
}

void DeviceStore::settle() {
  join();
  for (size_t b = 0; b < direct_.size(); ++b)
    if (direct_[b] && queued_[b]) be_.wait_transfer(upload_of_[b]);
}

void DeviceStore::invalidate() {
  settle();
  std::fill(fresh_.begin(), fresh_.end(), 0);
  std::fill(queued_.begin(), queued_.end(), 0);
  if (!order_.empty()) order_done_ = true;  // the first pass's order, used from now on
}

void DeviceStore::begin_update(AdamParams& a) {
  settle();  // the engine is about to write what the direct uploads read (and a step behind is done)
  const auto& blocks = layout_.blocks();
  for (size_t b = 0; b < blocks.size(); ++b)
    if (blocks[b].trains) fresh_[b] = queued_[b] = 0;
  if (!order_.empty()) order_done_ = true;
  a.updated = [this](int block) { updated(block); };
}

void DeviceStore::updated(int b) {
  if (behind_.running()) {  // the worker's call: recorded for this thread, which issues the upload
    behind_.record(b);
    return;
  }
  queue_from_step(b);
}

void DeviceStore::queue_from_step(int b) {
  if (!cache_ || !direct_[b] || !layout_.blocks()[b].trains || queued_[b]) return;
  upload(b);
  ++uploads_in_step_;
}

void DeviceStore::update_behind(std::function<void()> step, std::function<void()> after,
                                std::function<void(int)> regather) {
  behind_.start(std::move(step), std::move(after), std::move(regather), [this](int b) { queue_from_step(b); });
}

void DeviceStore::release(int b) {
  if (pblock_[b].bytes()) give_back(pblock_, b);  // a working copy (stage 3, or widened): it goes too
  if (!held_[b]) return;  // served from the device copy: nothing taken from the engine
  held_[b] = 0;
  host_.release(b);
}

// ---- gradients -------------------------------------------------------------------------------

void DeviceStore::begin_micro_step(bool first, bool last) {
  if (!pending_.empty())
    throw Error("ZeRO-Offload: the gradient of block '" + layout_.blocks()[pending_.front().block].name +
                "' was still on its way to the host at the next micro-step (end_micro_step was not called)");
  if (first) std::fill(summed_.begin(), summed_.end(), 0);
  last_ = last;
}

void DeviceStore::end_micro_step() {
  while (!pending_.empty()) finish_oldest();
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

void DeviceStore::fold(int b) {
  const auto& blk = layout_.blocks()[b];
  const float* g = gblock_[b].as<float>();
  if (half16()) {
    uint16_t* acc = dgrads_.as<uint16_t>() + at(b);
    if (!summed_[b]) be_.zero(acc, blk.numel * sizeof(uint16_t));  // +0 in bf16 and fp16
    be_.accumulate_half(acc, g, blk.numel, storage_);
  } else {
    float* acc = dgrads_.as<float>() + at(b);
    if (!summed_[b]) be_.zero(acc, blk.numel * sizeof(float));
    be_.residual_forward(acc, acc, g, blk.numel);
  }
  summed_[b] = 1;
}

void DeviceStore::send(int b, const void* dev, size_t bytes, kernels::BackendBuffer source) {
  if (pending_.size() == down_.size()) finish_oldest();  // frees the slot taken next
  // Stage 3: the previous block's device gradient goes now, its release ordered after its download
  // on the device (not waited for here), so two fp32 gradients live at once, not kSlots + 1.
  if (!pending_.empty() && pending_.back().source.bytes()) {
    Pending& prev = pending_.back();
    be_.await_transfer(prev.t);
    live_ -= prev.source.bytes();
    prev.source.reset();
  }
  Pending p;
  p.block = b;
  p.slot = next_down_;
  next_down_ = (next_down_ + 1) % down_.size();
  p.has_values = dev != nullptr;
  if (dev) {
    p.t = be_.download_async(down_[p.slot].host.as<void>(), dev, bytes);
    down_[p.slot].t = p.t;
    to_host_ += static_cast<double>(bytes);
  }
  p.source = std::move(source);
  pending_.push_back(std::move(p));
  if (!pipelined_) finish_oldest();
}

void DeviceStore::finish_oldest() {
  join();  // the engine's gradients are the step behind's to read until it is done
  be_.wait_transfer(pending_.front().t);  // before it leaves the queue: a failed wait leaves it there
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  if (p.source.bytes()) {  // stage 3: the device gradient has been read
    live_ -= p.source.bytes();
    p.source.reset();
  }
  const auto& blk = layout_.blocks()[p.block];
  const void* got = down_[p.slot].host.as<void>();
  if (p.has_values && cache_ && half16()) {
    // The 16-bit sum as it is: the engine widens it (exact) or reduces it in 16 bits.
    host_.grads_ready_half(p.block, static_cast<const uint16_t*>(got), blk.numel, storage_);
    return;
  }
  float* h = host_.grads(p.block);
  if (p.has_values) {
    const float* g = static_cast<const float*>(got);
    for (size_t i = 0; i < blk.numel; ++i) h[i] += g[i];
  }
  host_.grads_ready(p.block);
}

void DeviceStore::grads_ready(int b) {
  const auto& blk = layout_.blocks()[b];
  if (!blk.trains) return;
  if (cache_) {  // stages 0-2: summed on the device, handed over once per step
    if (active_[b]) {
      fold(b);
      active_[b] = 0;
      give_back(gblock_, b);
    }
    if (!last_) return;
    const size_t elem = half16() ? sizeof(uint16_t) : sizeof(float);
    const char* sum = summed_[b] ? dgrads_.as<char>() + at(b) * elem : nullptr;
    summed_[b] = 0;
    send(b, sum, blk.numel * elem, {});
    return;
  }
  // Stage 3: every micro-step's fp32 gradient goes back as it is; its device buffer travels with it.
  if (!active_[b]) {
    send(b, nullptr, 0, {});
    return;
  }
  active_[b] = 0;
  kernels::BackendBuffer g = std::move(gblock_[b]);
  const void* dev = g.as<void>();
  send(b, dev, blk.numel * sizeof(float), std::move(g));
}

}  // namespace hpct::parallel
