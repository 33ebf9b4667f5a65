// ZeRO-Offload's parameter store for a model on a device (see device_store.hpp).
#include "hpct/parallel/device_store.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "hpct/core/error.hpp"
#include "hpct/core/timer.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/host_copy.hpp"
#include "hpct/kernels/optim.hpp"

namespace hpct::parallel {

// The worker thread of update_behind and what it shares with the store's thread (under mu): the
// job, the blocks it has made final, in order, and how it ended.
struct DeviceStore::Behind {
  std::mutex mu;
  std::condition_variable cv;  // both ways: a job (or stop) for the worker; a record (or the end) for the store
  std::function<void()> job;
  bool has_job = false, stop = false, done = true;
  std::exception_ptr error;
  std::vector<char> ready;     // per block: final in the running step
  std::vector<int> recorded;   // the same blocks in the order the step made them final
  double seconds = 0;          // the jobs' wall time, summed
  std::thread thread;          // last: started once the rest exists

  explicit Behind(size_t blocks) : ready(blocks, 0) {
    // One thread short of the host optimizer's team, for the thread that drives the device.
    const int threads = std::max(1, kernels::optimizer_threads() - 1);
    thread = std::thread([this, threads] { run(threads); });
  }
  ~Behind() {
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
  void run(int threads) {
    kernels::set_optimizer_threads_here(threads);
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return has_job || stop; });
        if (!has_job) return;
        f = std::move(job);
        has_job = false;
      }
      Timer t;
      std::exception_ptr err;
      try {
        f();
      } catch (...) {
        err = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> l(mu);
        error = err;
        seconds += t.seconds();
        done = true;
      }
      cv.notify_all();
    }
  }
};

DeviceStore::DeviceStore(model::ParamStore& host, const ParamLayout& layout, kernels::OpsBackend& be, bool cache_params,
                         kernels::Precision storage, const std::vector<int>& held)
    : host_(host),
      layout_(layout),
      be_(be),
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
  finished_.assign(layout.blocks().size(), 0);
  mine_.assign(layout.blocks().size(), held.empty() ? 1 : 0);
  for (int b : held) mine_.at(static_cast<size_t>(b)) = 1;
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
    if (half16()) dparams16_ = kernels::BackendBuffer(be, layout.numel() * elem);
    else dparams_ = kernels::BackendBuffer(be, layout.numel() * elem);
    dgrads_ = kernels::BackendBuffer(be, layout.numel() * elem);
    live_ = peak_ = dparams16_.bytes() + dparams_.bytes() + dgrads_.bytes();
  }
}

size_t DeviceStore::device_bytes_needed(const ParamLayout& layout, bool cache_params, kernels::Precision storage) {
  size_t largest = 0;
  for (const auto& b : layout.blocks()) largest = std::max(largest, b.numel);
  const size_t elem = storage == kernels::Precision::fp32 ? sizeof(float) : sizeof(uint16_t);
  return (cache_params ? 2 * layout.numel() * elem : 0) + largest * sizeof(float);
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
  // pinned copies when they are unpinned. No re-gather and no `after`: a collective here, on an
  // error path, could wait for ranks that never come, and the state is being dropped.
  regather_ = nullptr;
  after_ = nullptr;
  try {
    join();
  } catch (...) {  // a failed step: its error was the training thread's to report
  }
  try {
    settle();  // the direct uploads, even after a failed join
  } catch (...) {  // a failed device: unpinned all the same
  }
  behind_.reset();  // the worker stops (a failed join above has still waited for its step)
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
  void* dst = half16() ? static_cast<void*>(dparams16_.as<uint16_t>() + blk.offset) : dparams_.as<float>() + blk.offset;
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
    if (!fresh_[c] && !queued_[c] && updated_behind(c)) upload(c);
  }
}

const float* DeviceStore::params(int b) {
  ++params_calls_;
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
    if (running_) wait_behind(b);
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
    be_.widen_half(w, dparams16_.as<uint16_t>() + blk.offset, blk.numel, storage_);
    return w;
  }
  return dparams_.as<float>() + blk.offset;
}

const uint16_t* DeviceStore::params16(int b) {
  if (!cache_ || !half16() || !fresh_[b]) return nullptr;
  return dparams16_.as<uint16_t>() + layout_.blocks()[b].offset;
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
  if (running_) {  // the worker's call: recorded for this thread, which issues the upload
    if (slow_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(slow_));
    {
      std::lock_guard<std::mutex> l(behind_->mu);
      behind_->ready[b] = 1;
      behind_->recorded.push_back(b);
    }
    behind_->cv.notify_all();
    return;
  }
  queue_from_step(b);
}

void DeviceStore::queue_from_step(int b) {
  if (!cache_ || !direct_[b] || !layout_.blocks()[b].trains || queued_[b]) return;
  upload(b);
  ++uploads_in_step_;
}

// ---- the step behind -------------------------------------------------------------------------

void DeviceStore::update_behind(std::function<void()> step, std::function<void()> after,
                                std::function<void(int)> regather) {
  join();
  if (!behind_) behind_ = std::make_unique<Behind>(layout_.blocks().size());
  {
    std::lock_guard<std::mutex> l(behind_->mu);
    std::fill(behind_->ready.begin(), behind_->ready.end(), 0);
    behind_->recorded.clear();
    behind_->error = nullptr;
    behind_->done = false;
    behind_->job = [this, step = std::move(step)] {
      step();
      // Tests: a tail after the last block too, so the backward reaches the engine before the end.
      if (slow_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(10 * slow_));
    };
    behind_->has_job = true;
    taken_ = 0;
    running_ = true;  // before the worker can call updated()
  }
  std::fill(finished_.begin(), finished_.end(), 0);
  regathers_in_step_ = 0;
  after_ = std::move(after);
  regather_ = std::move(regather);
  ++steps_behind_;
  behind_->cv.notify_all();
}

bool DeviceStore::updated_behind(int b) { return !running_ || finished_[b]; }

// A record acted on: the block re-gathered (a collective, on this thread), then handed on as
// updated() would have: a pinned block's upload starts.
void DeviceStore::finish_record(int c) {
  if (regather_) {
    for (uint64_t v : {static_cast<uint64_t>(params_calls_), static_cast<uint64_t>(regathers_in_step_++)})
      for (int byte = 0; byte < 8; ++byte) regather_order_ = (regather_order_ ^ ((v >> (8 * byte)) & 0xffu)) * 1099511628211ull;
    regather_(c);
  }
  finished_[c] = 1;
  queue_from_step(c);
}

void DeviceStore::take_records() {
  std::vector<int> fresh;
  {
    std::lock_guard<std::mutex> l(behind_->mu);
    fresh.assign(behind_->recorded.begin() + static_cast<std::ptrdiff_t>(taken_), behind_->recorded.end());
    taken_ = behind_->recorded.size();
  }
  for (int c : fresh) finish_record(c);
}

bool DeviceStore::finish_next() {
  int c;
  bool running;
  {
    std::unique_lock<std::mutex> l(behind_->mu);
    if (taken_ == behind_->recorded.size() && !behind_->done) {
      Timer t;
      behind_->cv.wait(l, [&] { return taken_ < behind_->recorded.size() || behind_->done; });
      behind_wait_ += t.seconds();
    }
    if (taken_ == behind_->recorded.size()) return false;
    c = behind_->recorded[taken_++];
    running = !behind_->done;
  }
  finish_record(c);
  uses_behind_ += running;
  return true;
}

void DeviceStore::wait_behind(int b) {
  if (regather_) {
    // Every rank must make the same collectives in the same order, whatever the timing: the
    // records in their order up to b, each waited for, never more (nor an early join).
    while (!finished_[b])
      if (!finish_next()) return join();  // the step ended without b (a failure: join rethrows it)
    return;
  }
  bool ended;
  {
    std::unique_lock<std::mutex> l(behind_->mu);
    if (!behind_->ready[b] && !behind_->done) {
      Timer t;
      behind_->cv.wait(l, [&] { return behind_->ready[b] || behind_->done; });
      behind_wait_ += t.seconds();
    }
    ended = behind_->done;
  }
  if (ended) {  // finished (or failed): over, as the first gradient would end it
    join();
    return;
  }
  ++uses_behind_;
  take_records();  // b and the blocks before it go up now, the forward's next ones as they come
}

void DeviceStore::join() {
  if (!running_) return;
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> l(behind_->mu);
    if (!behind_->done) {
      Timer t;
      behind_->cv.wait(l, [&] { return behind_->done; });
      behind_wait_ += t.seconds();
    }
    err = behind_->error;
    behind_->error = nullptr;
  }
  running_ = false;
  std::function<void()> after = std::move(after_);
  after_ = nullptr;
  if (err) {
    regather_ = nullptr;
    std::rethrow_exception(err);
  }
  take_records();  // the blocks no forward asked for yet: re-gathered and uploaded in their order
  regather_ = nullptr;
  if (after) after();
}

double DeviceStore::behind_seconds() const {
  if (!behind_) return 0;
  std::lock_guard<std::mutex> l(behind_->mu);
  return behind_->seconds;
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
    const char* sum = summed_[b] ? dgrads_.as<char>() + blk.offset * elem : nullptr;
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
