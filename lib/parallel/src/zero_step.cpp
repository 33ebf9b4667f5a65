// ZeRO stages 0-3 (see zero.hpp): the AdamW step over this rank's partition (in memory or swept
// from NVMe), the state as pieces for checkpoints, re-replication after a load, and the memory report.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "hpct/core/error.hpp"
#include "hpct/core/timer.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/ops.hpp"
#include "hpct/kernels/optim.hpp"
#include "hpct/parallel/zero.hpp"
#include "zero_internal.hpp"

namespace hpct::parallel {

// AdamW on n elements (kernels::adamw_runs: a 16-bit gradient widened tile by tile); in 16-bit
// runs the updated masters are rounded into pub (the copy the model computes with).
void ZeroEngine::update(float* p, const float* g, const uint16_t* g16, float* m, float* v, size_t n, float weight_decay,
                        const AdamParams& a, uint16_t* pub, bool primary) {
  kernels::AdamwRun r;
  r.param = p, r.grad = g, r.grad16 = g16, r.m = m, r.v = v, r.param16 = pub, r.n = n;
  r.weight_decay = weight_decay;
  r.norms = a.state_norms && primary;  // replicas count once over the tensor-parallel group
  kernels::adamw_runs(&r, 1, adamw_args(a, prec_), state_sumsq_.data());
}

std::array<double, 3> ZeroEngine::state_sumsq() const {
  std::array<double, 3> s = state_sumsq_;
  if (cfg_.stage > 0) dp_.allreduce_sum(s.data(), 3);  // stage 0: every rank updated everything
  return s;
}

void ZeroEngine::adam_step(const AdamParams& a) {
  // Off the thread that built the engine (the one that makes the run's MPI calls) the step must make
  // none: a programming error, not a user's.
  const bool off_thread = std::this_thread::get_id() != mpi_thread_;
  if (off_thread && (!step_is_local() || a.state_norms || (regathers() && !a.regather_later) || !gathered_.empty()))
    throw Error("ZeRO: adam_step on another thread than the engine's would make MPI calls (stage " +
                std::to_string(cfg_.stage) + (step_is_local() ? "" : ", NVMe") + (a.state_norms ? ", state norms" : "") +
                (regathers() && !a.regather_later ? ", re-gathers in the step" : "") +
                (gathered_.empty() ? "" : ", gathered blocks not released") + ")");
  if (!off_thread) release_gathered();
  state_sumsq_ = {};
  const auto& blocks = layout_.blocks();
  if (swap_) {
    swept_adam(a, off_thread);
    return;
  }
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const int b = static_cast<int>(bi);
    update_block(b, a);
    // A block replicated at stages 1-2 is whole again once gathered: each block's all-gather right
    // after its update (the same order on every rank), so a.updated can hand it on while the next
    // blocks are updated; or, with regather_later, the caller's regather(b) in that order. Stage 0:
    // every rank updated everything alike.
    if (!a.regather_later) regather(b);
    if (a.updated) a.updated(b);
  }
}

// Gathered copies of the old parameters are stale after the update. (A widened resident block
// has no request: no MPI call.)
void ZeroEngine::release_gathered() {
  for (auto& [b, g] : gathered_) {
    if (g->req != MPI_REQUEST_NULL) MPI_Wait(&g->req, MPI_STATUS_IGNORE);
    delete g;
  }
  gathered_.clear();
}

void ZeroEngine::regather(int b) {
  if (cfg_.stage > 0 && resident_[b]) all_gather_resident(b);  // stage 3: the persistent blocks
}

bool ZeroEngine::regathers() const {
  return cfg_.stage > 0 && n_ > 1 && std::any_of(resident_.begin(), resident_.end(), [](char r) { return r != 0; });
}

// This rank's range of the block: everything at stage 0, its slice otherwise. Offsets into the
// full (stage 0) or the shard (stage 1-3) arrays; 16-bit runs read 16-bit gradients and write the
// rounded result into the 16-bit parameters.
void ZeroEngine::update_block(int b, const AdamParams& a) {
  const auto& blocks = layout_.blocks();
  const bool s0 = cfg_.stage == 0;
  const size_t lo = s0 ? blocks[b].offset : shards_.begin(b, rank_);
  const size_t cnt = s0 ? blocks[b].numel : static_cast<size_t>(counts_[b][rank_]);
  if (cnt == 0) return;
  const size_t at = s0 ? lo : shards_.local_offset(b);
  float* p = s0 ? (half_ ? master32_.data() : full_params_.data()) + lo : master(b);
  const float* g = half_ ? nullptr : (s0 ? full_grads_.data() : grad_shard_.data()) + at;
  const uint16_t* g16 = half_ ? (s0 ? grads16_.data() : grad_shard16_.data()) + at : nullptr;
  uint16_t* pub = !half_ ? nullptr : s0 ? full16_.data() + lo : home16(b);
  for (const auto& t : layout_.tensors()) {
    if (t.block != b) continue;
    const size_t s = std::max(lo, t.offset), e = std::min(lo + cnt, t.offset + t.numel);
    if (s >= e) continue;
    const size_t k = s - lo;
    update(p + k, g ? g + k : nullptr, g16 ? g16 + k : nullptr, exp_avg_.data() + at + k, exp_avg_sq_.data() + at + k,
           e - s, t.weight_decay ? a.weight_decay : 0.0f, a, pub ? pub + k : nullptr, t.primary());
  }
}

// The update with states in the swap file: one pipelined pass over this rank's shard (tile i+1
// read and tile i-1 written while tile i is updated). Element-wise, so tiles change nothing.
// Each block is final in memory (the 16-bit copy, or the fp32 parameters) once the sweep has
// passed the end of its slice: it is reported then, in block order (its re-gather first unless
// the caller makes it), so that its upload, or a forward beside a step run behind it, need not
// wait for the rest of the sweep. The write-back of its states may still be in flight; nothing
// but the next sweep reads them.
void ZeroEngine::swept_adam(const AdamParams& a, bool off_thread) {
  io::ArrayMask mask = 0;
  for (int k : {k_param_, k_m_, k_v_})
    if (k >= 0) mask |= 1u << k;
  const size_t nb = layout_.blocks().size();
  size_t reported = 0;  // blocks [0, reported) handed on
  const auto report_through = [&](size_t local_end) {
    for (; reported < nb; ++reported) {
      const int b = static_cast<int>(reported);
      if (shards_.local_offset(b) + static_cast<size_t>(counts_[b][rank_]) > local_end) break;
      if (!a.regather_later) regather(b);
      if (a.updated) a.updated(b);
    }
  };
  size_t first = 0;
  auto st = swap_->sweep(mask, mask, [&](const io::SweepChunk& c) {
    const size_t cb = c.begin, ce = c.begin + c.count;
    while (first < segments_.size() && segments_[first].local + segments_[first].count <= cb) ++first;
    for (size_t i = first; i < segments_.size() && segments_[i].local < ce; ++i) {
      const Segment& sg = segments_[i];
      const size_t s0 = std::max(sg.local, cb), e0 = std::min(sg.local + sg.count, ce);
      if (s0 >= e0) continue;
      float* p = sg.param ? sg.param + (s0 - sg.local) : c.array(k_param_) + (s0 - cb);
      float* m = k_m_ >= 0 ? c.array(k_m_) + (s0 - cb) : exp_avg_.data() + s0;
      float* v = k_v_ >= 0 ? c.array(k_v_) + (s0 - cb) : exp_avg_sq_.data() + s0;
      uint16_t* pub = half_ ? home16(sg.block) : nullptr;  // nullptr: the slice is gathered from the master
      if (pub) pub += s0 - shards_.local_offset(sg.block);
      update(p, half_ ? nullptr : grad_shard_.data() + s0, half_ ? grad_shard16_.data() + s0 : nullptr, m, v, e0 - s0,
             sg.decay ? a.weight_decay : 0.0f, a, pub, sg.primary);
    }
    report_through(ce);
  });
  {
    std::lock_guard<std::mutex> lock(traffic_mu_);
    traffic_.bytes_read += double(st.bytes_read);
    traffic_.bytes_written += double(st.bytes_written);
    traffic_.optimizer_bytes += double(st.bytes_read + st.bytes_written);
    traffic_.optimizer_seconds += st.wall_seconds;
    if (off_thread) traffic_.optimizer_seconds_behind += st.wall_seconds;
    traffic_.optimizer_io_wait += st.io_wait_seconds;
  }
  note_working();
  report_through(SIZE_MAX);  // blocks past the last tile (none, or this rank's empty slices)
}

void ZeroEngine::visit_pieces(bool load, const std::function<void(const StatePiece&)>& fn) {
  const auto& blocks = layout_.blocks();
  std::vector<float> pbuf, mbuf, vbuf;  // staging for what lives in the swap file
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const int b = static_cast<int>(bi);
    StatePiece p;
    p.begin = shards_.begin(b, rank_);
    p.count = static_cast<size_t>(counts_[b][rank_]);
    if (p.count == 0) continue;
    const uint64_t local = shards_.local_offset(b);
    const bool param_on_nvme = master_in_swap(b);
    if (param_on_nvme) {
      pbuf.resize(p.count);
      p.params = pbuf.data();
      if (!load) swap_->read(k_param_, local, p.count, p.params);
    } else {
      p.params = master(b);
    }
    if (k_m_ >= 0) {
      mbuf.resize(p.count);
      vbuf.resize(p.count);
      p.exp_avg = mbuf.data();
      p.exp_avg_sq = vbuf.data();
      if (!load) {
        swap_->read(k_m_, local, p.count, p.exp_avg);
        swap_->read(k_v_, local, p.count, p.exp_avg_sq);
      }
    } else {
      const size_t at = cfg_.stage == 0 ? p.begin : local;  // stage 0 keeps full moments
      p.exp_avg = exp_avg_.data() + at;
      p.exp_avg_sq = exp_avg_sq_.data() + at;
    }
    fn(p);
    if (load) {
      if (param_on_nvme) swap_->write(k_param_, local, p.params, p.count);
      if (k_m_ >= 0) {
        swap_->write(k_m_, local, p.exp_avg, p.count);
        swap_->write(k_v_, local, p.exp_avg_sq, p.count);
      }
    }
  }
}

void ZeroEngine::after_load() {
  // Blocks gathered or widened before the load hold the old values.
  for (auto& [b, g] : gathered_) {
    MPI_Wait(&g->req, MPI_STATUS_IGNORE);
    delete g;
  }
  gathered_.clear();
  const auto& blocks = layout_.blocks();
  std::vector<float> slice;
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (half_ && cfg_.stage == 0) {  // every rank's masters whole, then the 16-bit copy of them all
      float* m = master32_.data() + blocks[b].offset;
      HPCT_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, m, counts_[b].data(), displs_[b].data(), MPI_FLOAT,
                                    dp_.raw()));
      kernels::to_half(m, full16_.data() + blocks[b].offset, blocks[b].numel, prec_);
    } else if (half_) {  // this rank's loaded masters, rounded into its 16-bit slices
      slice.resize(static_cast<size_t>(counts_[b][rank_]));
      read_slice((int)b, slice.data());
      publish((int)b, slice.data());
      if (resident_[b]) all_gather_resident((int)b);
    } else if (resident_[b]) {
      all_gather_resident((int)b);
    }
    if (cfg_.stage == 0) {
      for (float* buf : {exp_avg_.data(), exp_avg_sq_.data()})
        HPCT_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf + blocks[b].offset, counts_[b].data(),
                                      displs_[b].data(), MPI_FLOAT, dp_.raw()));
    }
  }
  bytes_sent_ = 0;
}

std::vector<float> ZeroEngine::gather_params() {
  const auto& blocks = layout_.blocks();
  std::vector<float> out(layout_.numel());
  for (size_t b = 0; b < blocks.size(); ++b) {
    float* dst = out.data() + blocks[b].offset;
    if (half_ && cfg_.stage == 0) {  // the fp32 masters (16-bit runs gather masters, not their copies)
      std::memcpy(dst, master32_.data() + blocks[b].offset, blocks[b].numel * sizeof(float));
    } else if (resident_[b] && !half_) {
      std::memcpy(dst, full_params_.data() + res_off_[b], blocks[b].numel * sizeof(float));
    } else {
      std::vector<float> mine(static_cast<size_t>(counts_[b][rank_]));
      read_slice((int)b, mine.data());
      HPCT_CHECK_MPI(MPI_Allgatherv(mine.data(), counts_[b][rank_], MPI_FLOAT, dst, counts_[b].data(),
                                    displs_[b].data(), MPI_FLOAT, dp_.raw()));
    }
  }
  return out;
}

ZeroMemory ZeroEngine::memory() const {
  ZeroMemory m;
  const size_t h = sizeof(uint16_t), f = sizeof(float);
  m.params = (full_params_.size() + shard_params_.size()) * f + (full16_.size() + shard16_.size()) * h;
  m.grads = full_grads_.size() * f + grads16_.size() * h;
  const size_t shard = grad_shard_.size() * f + grad_shard16_.size() * h;
  if (cfg_.stage >= 2) m.grads += shard;
  else m.grad_shard = shard;
  m.optimizer = (master32_.size() + exp_avg_.size() + exp_avg_sq_.size()) * f;
  m.working_peak = working_peak_;
  if (swap_) {
    const size_t L = shards_.local_numel() * sizeof(float);
    // 16-bit runs: the parameter array holds the fp32 masters, optimizer state by the paper's count.
    m.nvme_params = k_param_ >= 0 && !half_ ? L : 0;
    m.nvme_optimizer = (k_m_ >= 0 ? 2 * L : 0) + (k_param_ >= 0 && half_ ? L : 0);
    m.nvme_file = io::SwapStore::file_bytes(swap_->num_arrays(), swap_->elems(), swap_->alignment());
  }
  return m;
}

}  // namespace hpct::parallel
