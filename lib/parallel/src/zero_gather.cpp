// ZeRO stage 3's parameter side (see zero.hpp): each block all-gathered just before use (16-bit
// runs gather 16-bit slices and widen them), prefetched along the order recorded on the first
// micro-step, and released after. Split from zero.cpp by responsibility; no behaviour of its own.
#include "hpct/parallel/zero.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hpct/core/error.hpp"
#include "hpct/core/timer.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/ops.hpp"
#include "zero_internal.hpp"

namespace hpct::parallel {

// ---- stage 3: gather / release ----------------------------------------------------------------
void ZeroEngine::start_gather(int b) {
  if (before_gather_) before_gather_(b);  // a step behind: this block's update is done first
  const size_t numel = layout_.blocks()[b].numel;
  auto* g = new Gathered;
  g->numel = numel;
  g->buf = pool_.acquire(numel * sizeof(float));
  if (half_) g->buf16 = pool_.acquire(numel * sizeof(uint16_t));
  gathered_[b] = g;
  ++gathers_;
  // 16-bit runs gather their 16-bit slice from memory when one is kept (the master may still be in
  // the swap file, with offload_optimizer); only with offload_param is the master slice read.
  if (half_ ? (k_param_ >= 0 && home16(b) == nullptr) : master_in_swap(b)) {
    // The slice lives in the swap file: start reading it now (a prefetch overlaps the read with
    // compute); the all-gather is posted once it has arrived (post_gather).
    const size_t c = static_cast<size_t>(counts_[b][rank_]);
    g->send = pool_.acquire(c * sizeof(float));
    g->reading = swap_->start_read(k_param_, shards_.local_offset(b), c, reinterpret_cast<float*>(g->send.data()));
    traffic_.bytes_read += double(c) * sizeof(float);
    note_working();
    return;
  }
  note_working();
  post_gather(b);
}

void ZeroEngine::post_gather(int b) {
  Gathered* g = gathered_.at(b);
  if (g->started) return;
  const int c = counts_[b][rank_];
  const void* mine = half_ ? static_cast<const void*>(home16(b)) : master(b);
  if (g->reading.active() || g->send.data()) {
    Timer t;
    swap_->finish_read(g->reading);
    traffic_.param_read_seconds += t.seconds();
    mine = g->send.data();
    if (half_) {  // the swap file holds the fp32 master: round what is sent
      g->send16 = pool_.acquire(static_cast<size_t>(c) * sizeof(uint16_t));
      kernels::to_half(reinterpret_cast<const float*>(g->send.data()), reinterpret_cast<uint16_t*>(g->send16.data()),
                       static_cast<size_t>(c), prec_);
      mine = g->send16.data();
      note_working();
    }
  }
  const MPI_Datatype type = half_ ? MPI_UINT16_T : MPI_FLOAT;
  void* recv = half_ ? static_cast<void*>(g->buf16.data()) : g->buf.data();
  HPCT_CHECK_MPI(MPI_Iallgatherv(mine, c, type, recv, counts_[b].data(), displs_[b].data(), type, dp_.raw(), &g->req));
  g->started = true;
  bytes_sent_ += double(n_ - 1) / n_ * g->numel * (half_ ? sizeof(uint16_t) : sizeof(float));
}

void ZeroEngine::finish_gather(Gathered& g) {
  HPCT_CHECK_MPI(MPI_Wait(&g.req, MPI_STATUS_IGNORE));
  if (g.ready) return;
  if (half_) {  // widen, and give the 16-bit buffers back now
    kernels::from_half(reinterpret_cast<const uint16_t*>(g.buf16.data()), g.data(), g.numel, prec_);
    g.buf16 = {};
    g.send16 = {};
  }
  g.send = {};
  g.ready = true;
}

void ZeroEngine::wait_gather(int b) {
  Timer t;
  post_gather(b);
  finish_gather(*gathered_.at(b));
  gather_wait_ += t.seconds();
}

void ZeroEngine::prefetch() {
  size_t live = 0;
  for (auto& [b, g] : gathered_) live += g->numel;
  trace_.prefetch(cfg_.prefetch_bucket_size, cfg_.max_live_parameters, live, [&](int u) { return partitioned_numel(u); },
                  [&](int u) { return gathered_.count(u) > 0; }, [&](int u) { start_gather(u); });
}

size_t ZeroEngine::partitioned_numel(int b) const { return resident_[b] ? 0 : layout_.blocks()[b].numel; }

bool ZeroEngine::needed_soon(int b) const {
  return trace_.needed_within(b, cfg_.prefetch_bucket_size, [&](int u) { return partitioned_numel(u); });
}

const float* ZeroEngine::params(int b) {
  trace_.used(b);
  if (resident_[b]) {
    if (before_gather_) before_gather_(b);  // a step behind: its update and re-gather first
    if (!half_) return full_params_.data() + res_off_[b];
    // 16-bit runs: the block widened into a working buffer until release (no communication).
    auto it = gathered_.find(b);
    if (it != gathered_.end()) return it->second->data();
    auto* g = new Gathered;
    g->numel = layout_.blocks()[b].numel;
    g->buf = pool_.acquire(g->numel * sizeof(float));
    kernels::from_half(full16_.data() + res_off_[b], g->data(), g->numel, prec_);
    g->started = g->ready = true;
    gathered_[b] = g;
    note_working();
    return g->data();
  }
  poll();
  if (!gathered_.count(b)) start_gather(b);
  wait_gather(b);
  float* p = gathered_[b]->data();
  prefetch();
  return p;
}

const uint16_t* ZeroEngine::params_half(int b) {
  return half_ && resident_[b] ? full16_.data() + res_off_[b] : nullptr;
}

void ZeroEngine::release(int b) {
  if (resident_[b] && !half_) return;
  auto it = gathered_.find(b);
  if (it == gathered_.end()) return;
  // Keep it when it is needed again within the prefetch window (it would be gathered right back);
  // a widened resident block is cheap to widen again.
  if (!resident_[b] && needed_soon(b)) return;
  MPI_Wait(&it->second->req, MPI_STATUS_IGNORE);
  delete it->second;
  gathered_.erase(it);
}

}  // namespace hpct::parallel
