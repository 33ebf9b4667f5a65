// GPU-resident ZeRO stages 0-3 (see device_engine.hpp). Each step mirrors ZeroEngine's (zero.cpp,
// zero_step.cpp) with the element work as backend ops, so a backend that computes as the CPU does
// gives ZeroEngine's bits: the same rounding points (a micro-step's fp32 gradient folded into the
// 16-bit sum once; 16-bit reductions with ZeroEngine's MPI operator), the same update runs in the
// same order, the same sums of squares.
#include "hpct/parallel/device_engine.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "hpct/core/error.hpp"
#include "hpct/core/timer.hpp"
#include "hpct/core/units.hpp"
#include "hpct/kernels/half.hpp"
#include "zero_internal.hpp"

namespace hpct::parallel {

namespace {
size_t elem_bytes(bool half) { return half ? sizeof(uint16_t) : sizeof(float); }
template <class T>
T* at(const kernels::BackendBuffer& b, size_t i) { return b.as<T>() + i; }
}  // namespace

DeviceEngine::DeviceEngine(const ParamLayout& layout, const ZeroConfig& cfg, const comm::Communicator& dp,
                           kernels::Precision precision, kernels::OpsBackend& be, comm::DeviceCollectives* dc,
                           double dc_timeout)
    : layout_(layout), cfg_(cfg), dp_(dp), prec_(precision), be_(be), dc_(dc), dc_timeout_(dc_timeout),
      half_(precision != kernels::Precision::fp32),
      fp16_(precision == kernels::Precision::fp16), red16_(half_ && !cfg.fp32_communication), host_(be.host_memory()),
      n_(dp.size()), rank_(dp.rank()), shards_(layout, dp.size()) {
  cfg_.validate();
  if (dc_ && dc_->size() != n_)
    throw Error("GPU-resident ZeRO: the device collectives span " + std::to_string(dc_->size()) +
                " ranks, the data-parallel group " + std::to_string(n_));
  if (cfg_.offload_optimizer.device != "none" || cfg_.offload_param.device != "none")
    throw config_error("zero_optimization.offload_optimizer.device",
                       "the device-resident engine keeps the states on the GPU; offloaded runs use the host engine");
  for (const auto& t : layout.tensors()) all_primary_ = all_primary_ && t.primary();
  const auto& blocks = layout.blocks();
  counts_.assign(blocks.size(), std::vector<int>(n_));
  displs_.assign(blocks.size(), std::vector<int>(n_));
  resident_.assign(blocks.size(), 1);
  res_off_.assign(blocks.size(), 0);
  size_t full = 0, part = 0;  // elements of the resident blocks; of this rank's partitioned slices
  for (size_t b = 0; b < blocks.size(); ++b) {
    as_count(blocks[b].numel, "ZeRO");
    for (int r = 0; r < n_; ++r) {
      counts_[b][r] = static_cast<int>(shards_.count((int)b, r));
      displs_[b][r] = static_cast<int>(shards_.begin((int)b, r) - blocks[b].offset);
    }
    // ZeroEngine's rule: at stage 3 a block of param_persistence_threshold elements or more is
    // partitioned; the rest (and every block at stages 0-2) stays whole, in block order.
    if (cfg_.stage == 3 && static_cast<double>(blocks[b].numel) >= cfg_.param_persistence_threshold) resident_[b] = 0;
    if (resident_[b]) {
      res_off_[b] = full;
      full += blocks[b].numel;
    } else {
      part = shards_.local_offset((int)b) + shards_.slice((int)b);
    }
  }
  const size_t P = layout.numel(), L = shards_.local_numel(), e = elem_bytes(half_), f = sizeof(float);
  const size_t opt = cfg_.stage == 0 ? P : L;  // elements this rank updates (stage 0: all)
  const size_t need = (full + part) * e + (half_ ? 3 : 2) * opt * f + (cfg_.stage <= 1 ? P * e : 0) +
                      (cfg_.stage >= 1 ? L * e : 0);
  auto alloc = [&](kernels::BackendBuffer& buf, size_t bytes) {
    try {
      buf = kernels::BackendBuffer(be_, bytes);
    } catch (const std::exception& ex) {
      throw Error("GPU-resident ZeRO stage " + std::to_string(cfg_.stage) + " needs " + format_bytes(double(need)) +
                      " of " + be_.name() +
                      " for this rank's states (" + std::to_string(P) + " parameters over " + std::to_string(n_) +
                      " data-parallel ranks), and it could not be had: " + ex.what(),
                  Error::Context{"", "zero_optimization.offload_optimizer.device",
                                 "a higher ZeRO stage, more GPUs, or offload_optimizer.device cpu (ZeRO-Offload)"});
    }
    if (bytes) be_.zero(buf.as<void>(), bytes);
  };
  alloc(params_, full * e);
  alloc(shard_, part * e);
  if (half_) alloc(master_, opt * f);
  alloc(m_, opt * f);
  alloc(v_, opt * f);
  if (cfg_.stage <= 1) alloc(grads_, P * e);
  if (cfg_.stage >= 1) alloc(grad_shard_, L * e);
  build_runs();
  if (dc_)
    started_ = std::make_unique<StartedCollectives>(
        *dc_, be_, dc_timeout_, blocks.size(), [this](kernels::BackendBuffer&& b) { give(std::move(b)); },
        "rank " + std::to_string(rank_) + " of " + std::to_string(n_));
  // Last, so that nothing above can throw after it (the destructor, which frees it, would not run).
  if (red16_ && n_ > 1) sum16_ = make_sum16_op(prec_);
}

DeviceEngine::~DeviceEngine() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (sum16_ != MPI_OP_NULL && !finalized) MPI_Op_free(&sum16_);
}

char* DeviceEngine::whole(int b) { return params_.as<char>() + res_off_[b] * elem_bytes(half_); }

char* DeviceEngine::home(int b) {
  if (resident_[b]) return whole(b) + displs_[b][rank_] * elem_bytes(half_);
  return shard_.as<char>() + shards_.local_offset(b) * elem_bytes(half_);
}

float* DeviceEngine::master(int b) {
  if (!half_) return reinterpret_cast<float*>(home(b));
  if (cfg_.stage == 0) return at<float>(master_, layout_.blocks()[b].offset + displs_[b][rank_]);
  return at<float>(master_, shards_.local_offset(b));
}

// The runs of this rank's update: per block its range (stage 0: all of it; else its slice), cut at
// tensor boundaries, in ZeroEngine::adam_step's order.
void DeviceEngine::build_runs() {
  const auto& blocks = layout_.blocks();
  const bool s0 = cfg_.stage == 0;
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const int b = static_cast<int>(bi);
    const size_t lo = s0 ? blocks[b].offset : shards_.begin(b, rank_);
    const size_t cnt = s0 ? blocks[b].numel : static_cast<size_t>(counts_[b][rank_]);
    if (cnt == 0) continue;
    const size_t idx = s0 ? lo : shards_.local_offset(b);  // in the gradient / moment arrays
    const kernels::BackendBuffer& g = s0 ? grads_ : grad_shard_;
    float* p = s0 ? (half_ ? at<float>(master_, lo) : at<float>(params_, lo)) : master(b);
    uint16_t* pub = !half_ ? nullptr : s0 ? at<uint16_t>(params_, lo) : home16(b);  // the 16-bit copy of the range
    for (const auto& t : layout_.tensors()) {
      if (t.block != b) continue;
      const size_t s = std::max(lo, t.offset), e = std::min(lo + cnt, t.offset + t.numel);
      if (s >= e) continue;
      const size_t k = s - lo;
      Run r;
      r.run.param = p + k;
      if (half_) r.run.grad16 = at<uint16_t>(g, idx + k);
      else r.run.grad = at<float>(g, idx + k);
      r.run.m = at<float>(m_, idx + k);
      r.run.v = at<float>(v_, idx + k);
      r.run.param16 = pub ? pub + k : nullptr;
      r.run.n = e - s;
      r.decay = t.weight_decay;
      r.primary = t.primary();
      runs_.push_back(r);
    }
  }
}

// ---- working buffers ----------------------------------------------------------------------------
kernels::BackendBuffer DeviceEngine::take(size_t bytes) {
  auto it = free_.find(bytes);
  if (it != free_.end()) {
    kernels::BackendBuffer b = std::move(it->second);
    free_.erase(it);
    return b;
  }
  working_ += bytes;
  working_peak_ = std::max(working_peak_, working_);
  return kernels::BackendBuffer(be_, bytes);
}

void DeviceEngine::give(kernels::BackendBuffer&& buf) {
  const size_t bytes = buf.bytes();
  free_.emplace(bytes, std::move(buf));
}

// ---- collectives on backend memory -------------------------------------------------------------
comm::DeviceCollectives::Elem DeviceEngine::elem(MPI_Datatype type) const {
  using E = comm::DeviceCollectives::Elem;
  if (type == MPI_FLOAT) return E::f32;
  return fp16_ ? E::f16 : E::bf16;  // 16-bit gradients or parameters
}

void DeviceEngine::on_device(const char* what, const std::function<bool(double, std::string*)>& f) {
  be_.synchronize();  // what the backend's stream wrote is in the buffer before the collective reads it
  std::string why;
  if (!f(comm::steady_seconds() + dc_timeout_, &why))
    throw Error(std::string("GPU-resident ZeRO: the data-parallel ") + what + " on device buffers failed on rank " +
                std::to_string(rank_) + " of " + std::to_string(n_) + ": " + why);
}

void DeviceEngine::await_gather(int b) {
  if (!started_ || !started_->gathering(b)) return;
  Timer timer;
  started_->await(b);
  gather_wait_ += timer.seconds();
}

void DeviceEngine::settle() {
  if (started_) reduce_wait_ += started_->settle();
}

// After the update: block b's slices from every rank into the whole block. Through device
// collectives that queue: this rank's slice copied into a buffer of N slices, the all-gather
// started there, and the whole block copied out once the model asks for it (await_gather).
void DeviceEngine::allgather_after_step(int b) {
  const size_t e = elem_bytes(half_), numel = layout_.blocks()[b].numel;
  bytes_sent_ += double(n_ - 1) / n_ * numel * e;
  if (!dc_ || !dc_->queues() || n_ == 1) {
    allgather(whole(b), b, half_ ? MPI_UINT16_T : MPI_FLOAT);
    return;
  }
  const size_t slice = shards_.slice(b), mine = static_cast<size_t>(counts_[b][rank_]);
  kernels::BackendBuffer full = take(slice * static_cast<size_t>(n_) * e);
  char* at_mine = full.as<char>() + static_cast<size_t>(rank_) * slice * e;
  if (mine) be_.copy(at_mine, home(b), mine * e);
  if (slice > mine) be_.zero(at_mine + mine * e, (slice - mine) * e);
  void* buf = full.as<void>();
  char* dst = whole(b);
  Held h;
  h.push_back(std::move(full));
  started_->start(Kind::gather, static_cast<size_t>(cfg_.allgather_bucket_size), "all-gather", numel, b,
        [&](double d, void* q, StartedCollectives::Ticket* t, std::string* why) {
          return dc_->start_allgather_blocks(buf, slice, elem(half_ ? MPI_UINT16_T : MPI_FLOAT), q, d, t, why);
        },
        std::move(h), [this, dst, buf, numel, e] { be_.copy(dst, buf, numel * e); });
}

// Without device collectives: the nonblocking calls ZeroEngine makes (the same algorithms, so the
// same sums), waited for at once. With them: the same reductions on device buffers, started.
void DeviceEngine::allreduce(void* buf, size_t count, MPI_Datatype type, MPI_Op op, Held hold,
                             std::function<void()> then) {
  if (dc_ && n_ > 1) {
    started_->start(Kind::reduction, reduce_keep(), "all-reduce", count, -1, [&](double d, void* q, StartedCollectives::Ticket* t, std::string* why) {
      return dc_->start_allreduce(buf, count, elem(type), q, d, t, why);
    }, std::move(hold), std::move(then));
    return;
  }
  if (n_ > 1) {
    int esz = 0;
    MPI_Type_size(type, &esz);
    void* h = buf;
    if (!host_) {
      stage_a_.resize(count * esz);
      be_.copy_to_host(stage_a_.data(), buf, count * esz);
      h = stage_a_.data();
    }
    MPI_Request req;
    HPCT_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, h, (int)count, type, op, dp_.raw(), &req));
    HPCT_CHECK_MPI(MPI_Wait(&req, MPI_STATUS_IGNORE));
    if (!host_) be_.copy_from_host(buf, h, count * esz);
  }
  if (then) then();
  for (auto& x : hold) give(std::move(x));
}

// send: block b's whole gradient; `padded` where it is a buffer of N slices whose padding is zero
// (the device collectives then read it as it is). recv: this rank's elements of it; `room` where
// it has the block's whole slice (the device collectives then write it there, padding included).
void DeviceEngine::reduce_scatter(const void* send, bool padded, void* recv, bool room, int b, MPI_Datatype type,
                                  MPI_Op op, Held hold, std::function<void()> then) {
  int esz = 0;
  MPI_Type_size(type, &esz);
  const size_t numel = layout_.blocks()[b].numel, mine = static_cast<size_t>(counts_[b][rank_]);
  if (n_ == 1) {  // one rank: the reduction is a copy
    be_.copy(recv, send, mine * esz);
  } else if (dc_) {  // N equal slices: the block padded with zeros, this rank's slice copied out
    const size_t slice = shards_.slice(b), padded_n = slice * static_cast<size_t>(n_);
    const void* full = send;
    void* part = recv;
    if (!padded) {
      kernels::BackendBuffer f = take(padded_n * esz);
      be_.copy(f.as<void>(), send, numel * esz);
      if (padded_n > numel) be_.zero(f.as<char>() + numel * esz, (padded_n - numel) * esz);
      full = f.as<void>();
      hold.push_back(std::move(f));
    }
    if (!room) {
      kernels::BackendBuffer r = take(slice * esz);
      part = r.as<void>();
      if (mine) {
        std::function<void()> after = std::move(then);
        then = [this, recv, part, mine, esz, after] {
          be_.copy(recv, part, mine * esz);
          if (after) after();
        };
      }
      hold.push_back(std::move(r));
    }
    started_->start(Kind::reduction, reduce_keep(), "reduce-scatter", numel, -1, [&](double d, void* q, StartedCollectives::Ticket* t, std::string* why) {
      return dc_->start_reduce_scatter_blocks(full, part, slice, elem(type), q, d, t, why);
    }, std::move(hold), std::move(then));
    return;
  } else {
    const void* hs = send;
    void* hr = recv;
    if (!host_) {
      stage_a_.resize(numel * esz);
      stage_b_.resize(std::max<size_t>(mine, 1) * esz);
      be_.copy_to_host(stage_a_.data(), send, numel * esz);
      hs = stage_a_.data();
      hr = stage_b_.data();
    }
    MPI_Request req;
    HPCT_CHECK_MPI(MPI_Ireduce_scatter(hs, hr, counts_[b].data(), type, op, dp_.raw(), &req));
    HPCT_CHECK_MPI(MPI_Wait(&req, MPI_STATUS_IGNORE));
    if (!host_) be_.copy_from_host(recv, hr, mine * esz);
  }
  if (then) then();
  for (auto& x : hold) give(std::move(x));
}

void DeviceEngine::allgather(void* block_buf, int b, MPI_Datatype type) {
  if (n_ == 1) return;
  int esz = 0;
  MPI_Type_size(type, &esz);
  const size_t numel = layout_.blocks()[b].numel;
  if (dc_) {  // N equal slices (rank r's at r x slice, the block's own layout), the padding zeros
    const size_t slice = shards_.slice(b), mine = static_cast<size_t>(counts_[b][rank_]);
    kernels::BackendBuffer full = take(slice * static_cast<size_t>(n_) * esz);
    char* at_mine = full.as<char>() + static_cast<size_t>(rank_) * slice * esz;
    if (mine) be_.copy(at_mine, static_cast<char*>(block_buf) + displs_[b][rank_] * esz, mine * esz);
    if (slice > mine) be_.zero(at_mine + mine * esz, (slice - mine) * esz);
    on_device("all-gather", [&](double d, std::string* why) {
      return dc_->allgather_blocks(full.as<void>(), slice, elem(type), d, why);
    });
    be_.copy(block_buf, full.as<void>(), numel * esz);
    give(std::move(full));
    return;
  }
  void* h = block_buf;
  if (!host_) {
    stage_a_.resize(numel * esz);
    be_.copy_to_host(stage_a_.data(), block_buf, numel * esz);
    h = stage_a_.data();
  }
  HPCT_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, type, h, counts_[b].data(), displs_[b].data(), type, dp_.raw()));
  if (!host_) be_.copy_from_host(block_buf, h, numel * esz);
}

// ---- parameters and gradients -------------------------------------------------------------------
const float* DeviceEngine::params(int b) {
  if (cfg_.stage == 3) trace_.used(b);  // the order of use, for the prefetch
  if (!resident_[b] && queued()) {
    if (!widened_.count(b)) start_gather(b);  // not prefetched
    await_gather(b);
    const float* p = widened_.at(b).as<float>();
    prefetch();
    return p;
  }
  await_gather(b);
  if (!half_ && resident_[b]) return reinterpret_cast<const float*>(whole(b));
  auto it = widened_.find(b);  // a working buffer until release
  if (it != widened_.end()) return it->second.as<float>();
  if (!resident_[b]) return gather(b);
  const size_t n = layout_.blocks()[b].numel;  // 16-bit runs: the block widened
  kernels::BackendBuffer w = take(n * sizeof(float));
  be_.widen_half(w.as<float>(), reinterpret_cast<const uint16_t*>(whole(b)), n, prec_);
  return widened_.emplace(b, std::move(w)).first->second.as<float>();
}

// Stage 3: every rank's slice of block b into one working buffer (ZeroEngine's all-gather: the same
// slices, moved, not computed, so the same bits), widened in 16-bit runs.
const float* DeviceEngine::gather(int b) {
  Timer timer;
  const size_t n = layout_.blocks()[b].numel, e = elem_bytes(half_);
  const size_t mine = static_cast<size_t>(counts_[b][rank_]);
  kernels::BackendBuffer g = take(n * e);
  if (mine) be_.copy(g.as<char>() + displs_[b][rank_] * e, home(b), mine * e);
  allgather(g.as<void>(), b, half_ ? MPI_UINT16_T : MPI_FLOAT);
  bytes_sent_ += double(n_ - 1) / n_ * n * e;
  ++gathers_;
  if (half_) {  // the 16-bit values stay beside the widened copy: the model's GEMMs read them (params16)
    kernels::BackendBuffer w = take(n * sizeof(float));
    be_.widen_half(w.as<float>(), g.as<uint16_t>(), n, prec_);
    gathered16_[b] = std::move(g);
    g = std::move(w);
  }
  gather_wait_ += timer.seconds();
  return widened_.emplace(b, std::move(g)).first->second.as<float>();
}

const uint16_t* DeviceEngine::params16(int b) {
  if (!half_) return nullptr;
  await_gather(b);
  if (resident_[b]) return reinterpret_cast<const uint16_t*>(whole(b));
  params(b);  // gathered, or joined (and the use recorded for the prefetch, every call alike)
  return gathered16_.at(b).as<uint16_t>();
}

void DeviceEngine::start_gather(int b) {
  const size_t n = layout_.blocks()[b].numel, e = elem_bytes(half_), slice = shards_.slice(b);
  const size_t mine = static_cast<size_t>(counts_[b][rank_]);
  // N slices, rank r's at r x slice: the block's own layout, so the gathered block is its first n
  // elements (the padding zeros after them).
  kernels::BackendBuffer g = take(slice * static_cast<size_t>(n_) * e);
  char* at_mine = g.as<char>() + static_cast<size_t>(rank_) * slice * e;
  if (mine) be_.copy(at_mine, home(b), mine * e);
  if (slice > mine) be_.zero(at_mine + mine * e, (slice - mine) * e);
  void* gp = g.as<void>();
  std::function<void()> then;
  if (half_) {  // widened once gathered; the 16-bit values stay for the GEMMs (params16)
    kernels::BackendBuffer w = take(n * sizeof(float));
    float* wp = w.as<float>();
    then = [this, wp, gp, n] { be_.widen_half(wp, static_cast<const uint16_t*>(gp), n, prec_); };
    gathered16_[b] = std::move(g);
    widened_[b] = std::move(w);
  } else {
    widened_[b] = std::move(g);
  }
  bytes_sent_ += double(n_ - 1) / n_ * n * e;
  ++gathers_;
  started_->start(Kind::gather, std::numeric_limits<size_t>::max(), "all-gather", n, b,
        [&](double d, void* q, StartedCollectives::Ticket* t, std::string* why) {
          return dc_->start_allgather_blocks(gp, slice, elem(half_ ? MPI_UINT16_T : MPI_FLOAT), q, d, t, why);
        },
        {}, std::move(then));
}

void DeviceEngine::prefetch() {
  size_t live = 0;
  for (const auto& [u, w] : widened_) live += partitioned_numel(u);
  trace_.prefetch(cfg_.prefetch_bucket_size, cfg_.max_live_parameters, live, [&](int u) { return partitioned_numel(u); },
                  [&](int u) { return widened_.count(u) > 0; },  // gathered or under way
                  [&](int u) { start_gather(u); });
}

void DeviceEngine::begin_micro_step(bool last) {
  last_micro_ = last;
  trace_.begin_micro_step();
}

void DeviceEngine::release(int b) {
  // Stage 3 with a prefetch: a block needed again within the prefetch window stays (it would be
  // gathered right back: the last layer of the forward is the first of the backward).
  if (!resident_[b] && queued() &&
      trace_.needed_within(b, cfg_.prefetch_bucket_size, [&](int u) { return partitioned_numel(u); }))
    return;
  await_gather(b);  // its buffers go back to the pool: nothing may still write them
  auto g16 = gathered16_.find(b);
  if (g16 != gathered16_.end()) {
    give(std::move(g16->second));
    gathered16_.erase(g16);
  }
  auto it = widened_.find(b);
  if (it == widened_.end()) return;
  give(std::move(it->second));
  widened_.erase(it);
}

float* DeviceEngine::grads(int b) {
  const auto& blk = layout_.blocks()[b];
  if (cfg_.stage <= 1 && !half_) return at<float>(grads_, blk.offset);
  auto it = work_.find(b);
  if (it == work_.end()) {
    const size_t n = padded_work() ? shards_.slice(b) * static_cast<size_t>(n_) : blk.numel;
    kernels::BackendBuffer w = take(n * sizeof(float));
    be_.zero(w.as<void>(), n * sizeof(float));
    it = work_.emplace(b, std::move(w)).first;
  }
  return it->second.as<float>();
}

void DeviceEngine::grads_ready(int b) {
  const bool reduce_now = cfg_.stage >= 2 || last_micro_;
  if (half_ && cfg_.stage <= 1) {
    // The micro-step's fp32 gradient meets the 16-bit sum of the earlier micro-steps: folded into
    // it (one rounding), or, on the last micro-step, the sum added to it for the reduction.
    auto it = work_.find(b);
    if (it == work_.end()) throw Error("ZeRO: block '" + layout_.blocks()[b].name + "' reported ready without gradients");
    const auto& blk = layout_.blocks()[b];
    uint16_t* acc = at<uint16_t>(grads_, blk.offset);
    if (!reduce_now || red16_) {  // 16-bit reductions start from the 16-bit gradient
      be_.accumulate_half(acc, it->second.as<float>(), blk.numel, prec_);
      give(std::move(it->second));
      work_.erase(it);
      if (!reduce_now) return;
    } else {
      kernels::BackendBuffer wide = take(blk.numel * sizeof(float));
      be_.widen_half(wide.as<float>(), acc, blk.numel, prec_);
      be_.add_scaled(it->second.as<float>(), wide.as<float>(), 1.0f, blk.numel);  // y + 1 x: exact as y + x
      give(std::move(wide));
    }
  }
  if (reduce_now) reduce(b);
}

void DeviceEngine::reduce(int b) {
  Timer timer;
  const auto& blk = layout_.blocks()[b];
  const size_t numel = blk.numel, loff = shards_.local_offset(b), mine = static_cast<size_t>(counts_[b][rank_]);
  const MPI_Datatype type = red16_ ? MPI_UINT16_T : MPI_FLOAT;
  const MPI_Op sum = red16_ ? sum16_ : MPI_SUM;
  const double elem = red16_ ? sizeof(uint16_t) : sizeof(float);
  const bool pad = padded_work();  // the work buffers hold N slices, the padding zero
  auto take_work = [&] {  // the block's fp32 working buffer
    kernels::BackendBuffer w = std::move(work_.at(b));
    work_.erase(b);
    return w;
  };
  auto round_fp16 = [&](float* x) {  // fp16 runs reducing in fp32: the values fp16 storage would hold
    kernels::BackendBuffer h = take(numel * sizeof(uint16_t));
    be_.narrow_half(h.as<uint16_t>(), x, numel, prec_);
    be_.widen_half(x, h.as<uint16_t>(), numel, prec_);
    give(std::move(h));
  };
  auto held = [](kernels::BackendBuffer&& a) {
    Held h;
    h.push_back(std::move(a));
    return h;
  };
  if (cfg_.stage == 0) {
    if (red16_) {
      allreduce(at<uint16_t>(grads_, blk.offset), numel, type, sum, {}, nullptr);
    } else if (half_) {  // reduced in fp32, then rounded into the 16-bit gradient
      kernels::BackendBuffer w = take_work();
      float* wf = w.as<float>();
      uint16_t* dst = at<uint16_t>(grads_, blk.offset);
      if (fp16_) round_fp16(wf);
      allreduce(wf, numel, type, sum, held(std::move(w)), [this, dst, wf, numel] { be_.narrow_half(dst, wf, numel, prec_); });
    } else {
      allreduce(at<float>(grads_, blk.offset), numel, type, sum, {}, nullptr);
    }
    bytes_sent_ += 2.0 * (n_ - 1) / n_ * numel * elem;
  } else {
    if (cfg_.stage == 1 && !(half_ && !red16_)) {  // once per step, the full gradient into the shard
      const void* send = red16_ ? static_cast<const void*>(at<uint16_t>(grads_, blk.offset)) : at<float>(grads_, blk.offset);
      void* recv = red16_ ? static_cast<void*>(at<uint16_t>(grad_shard_, loff)) : at<float>(grad_shard_, loff);
      reduce_scatter(send, false, recv, true, b, type, sum, {}, nullptr);  // the shard has the slice's room
    } else if (red16_) {  // stage 2: the block rounded to 16 bits, reduced, added into the shard
      kernels::BackendBuffer w = take_work();
      const size_t sn = pad ? shards_.slice(b) * static_cast<size_t>(n_) : numel;
      kernels::BackendBuffer send = take(sn * sizeof(uint16_t));
      if (sn > numel) be_.zero(send.as<uint16_t>() + numel, (sn - numel) * sizeof(uint16_t));
      be_.narrow_half(send.as<uint16_t>(), w.as<float>(), numel, prec_);
      give(std::move(w));
      kernels::BackendBuffer recv = take(shards_.slice(b) * sizeof(uint16_t));
      uint16_t* shard = at<uint16_t>(grad_shard_, loff);
      const uint16_t* got = recv.as<uint16_t>();
      const void* sp = send.as<void>();
      void* rp = recv.as<void>();
      Held h = held(std::move(send));
      h.push_back(std::move(recv));
      reduce_scatter(sp, pad, rp, true, b, type, sum, std::move(h),
                     [this, shard, got, mine] { be_.add_half(shard, got, mine, prec_); });
    } else {  // reduced in fp32 and accumulated into the shard (16-bit shards: one rounding)
      kernels::BackendBuffer w = take_work();
      if (fp16_) round_fp16(w.as<float>());
      kernels::BackendBuffer recv = take(shards_.slice(b) * sizeof(float));
      const float* got = recv.as<float>();
      const void* sp = w.as<void>();
      void* rp = recv.as<void>();
      Held h = held(std::move(w));
      h.push_back(std::move(recv));
      std::function<void()> add;
      if (half_) add = [this, dst = at<uint16_t>(grad_shard_, loff), got, mine] { be_.accumulate_half(dst, got, mine, prec_); };
      else add = [this, dst = at<float>(grad_shard_, loff), got, mine] { be_.add_scaled(dst, got, 1.0f, mine); };
      reduce_scatter(sp, pad, rp, true, b, type, sum, std::move(h), std::move(add));
    }
    bytes_sent_ += double(n_ - 1) / n_ * numel * elem;
  }
  reduce_wait_ += timer.seconds();
}

void DeviceEngine::begin_step() {
  if (grads_.bytes()) be_.zero(grads_.as<void>(), grads_.bytes());  // +0 in every format
  if (grad_shard_.bytes()) be_.zero(grad_shard_.as<void>(), grad_shard_.bytes());
}

void DeviceEngine::end_micro_step() {
  settle();  // the micro-step's reductions done before anything reads the gradients or the pool's buffers
  trace_.end_micro_step();
  if (!work_.empty())
    throw Error("ZeRO: gradients of block '" + layout_.blocks()[work_.begin()->first].name +
                "' were written but never reported ready (model bug)");
}

double DeviceEngine::sumsq(const void* buf, size_t n) {
  if (half_) return be_.sum_squares_half(static_cast<const uint16_t*>(buf), n, prec_);
  return be_.sum_squares(static_cast<const float*>(buf), n);
}

double DeviceEngine::grad_sumsq() {
  return over_grads([&](const void* buf, size_t n) { return sumsq(buf, n); });
}

double DeviceEngine::grad_zeros() {
  return over_grads([&](const void* buf, size_t n) {
    return half_ ? be_.count_zeros_half(static_cast<const uint16_t*>(buf), n) : be_.count_zeros(static_cast<const float*>(buf), n);
  });
}

double DeviceEngine::over_grads(const std::function<double(const void* buf, size_t n)>& sumsq) {
  // Tensor-parallel replicas count on their primary copy's rank only (the caller sums over the
  // tensor-parallel group); without them the whole buffer is summed at once.
  const size_t e = elem_bytes(half_);
  double s = 0;
  if (cfg_.stage == 0) {  // identical everywhere
    if (all_primary_) return sumsq(grads_.as<void>(), layout_.numel());
    for (const auto& t : layout_.tensors())
      if (t.primary()) s += sumsq(grads_.as<char>() + t.offset * e, t.numel);
    return s;
  }
  if (all_primary_) {
    s = sumsq(grad_shard_.as<void>(), shards_.local_numel());  // padding is zero
  } else {
    for (const auto& r : runs_)
      if (r.primary) s += sumsq(half_ ? static_cast<const void*>(r.run.grad16) : r.run.grad, r.run.n);
  }
  dp_.allreduce_sum(&s, 1);
  return s;
}

void DeviceEngine::adam_step(const AdamParams& a) {
  settle();  // the last step's all-gathers done before the update rewrites their blocks' slices
  for (auto& [b, w] : widened_) give(std::move(w));  // widened copies of the old parameters are stale
  widened_.clear();
  for (auto& [b, g] : gathered16_) give(std::move(g));
  gathered16_.clear();
  state_sumsq_ = {};
  step_runs_.clear();
  for (const Run& r : runs_) {
    kernels::AdamwRun x = r.run;
    x.weight_decay = r.decay ? a.weight_decay : 0.0f;
    x.norms = a.state_norms && r.primary;  // replicas count once over the tensor-parallel group
    step_runs_.push_back(x);
  }
  be_.adamw(step_runs_.data(), step_runs_.size(), adamw_args(a, prec_), a.state_norms ? state_sumsq_.data() : nullptr);
  if (cfg_.stage == 0) return;  // every rank updated everything alike
  for (size_t b = 0; b < layout_.blocks().size(); ++b)
    if (resident_[b]) allgather_after_step((int)b);  // stage 3's partitioned blocks: gathered when next used
}

std::array<double, 3> DeviceEngine::state_sumsq() const {
  std::array<double, 3> s = state_sumsq_;
  if (cfg_.stage > 0) dp_.allreduce_sum(s.data(), 3);  // stage 0: every rank updated everything
  return s;
}

// ---- state in and out ---------------------------------------------------------------------------
void DeviceEngine::init_params(const std::function<void(int, float*)>& init) {
  const auto& blocks = layout_.blocks();
  std::vector<float> t;
  std::vector<uint16_t> h;
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const int b = static_cast<int>(bi);
    const size_t n = blocks[b].numel;
    t.resize(n);
    init(b, t.data());
    const size_t mine = static_cast<size_t>(counts_[b][rank_]);
    if (!half_) {  // the parameters are the masters
      if (resident_[b]) be_.copy_from_host(whole(b), t.data(), n * sizeof(float));
      else if (mine) be_.copy_from_host(home(b), t.data() + displs_[b][rank_], mine * sizeof(float));
      continue;
    }
    h.resize(n);
    kernels::to_half(t.data(), h.data(), n, prec_);
    if (resident_[b]) be_.copy_from_host(whole(b), h.data(), n * sizeof(uint16_t));
    else if (mine) be_.copy_from_host(home(b), h.data() + displs_[b][rank_], mine * sizeof(uint16_t));
    if (cfg_.stage == 0) be_.copy_from_host(at<float>(master_, blocks[b].offset), t.data(), n * sizeof(float));
    else if (mine) be_.copy_from_host(master(b), t.data() + displs_[b][rank_], mine * sizeof(float));
  }
}

void DeviceEngine::visit_pieces(bool load, const std::function<void(const StatePiece&)>& fn) {
  settle();
  const auto& blocks = layout_.blocks();
  std::vector<float> pbuf, mbuf, vbuf;  // host copies, where the backend's memory is not the host's
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const int b = static_cast<int>(bi);
    StatePiece p;
    p.begin = shards_.begin(b, rank_);
    p.count = static_cast<size_t>(counts_[b][rank_]);
    if (p.count == 0) continue;
    const size_t idx = cfg_.stage == 0 ? p.begin : shards_.local_offset(b);  // stage 0 keeps full moments
    float* live[3] = {master(b), at<float>(m_, idx), at<float>(v_, idx)};
    float* host[3] = {live[0], live[1], live[2]};
    if (!host_) {
      std::vector<float>* bufs[3] = {&pbuf, &mbuf, &vbuf};
      for (int k = 0; k < 3; ++k) {
        bufs[k]->resize(p.count);
        host[k] = bufs[k]->data();
        if (!load) be_.copy_to_host(host[k], live[k], p.count * sizeof(float));
      }
    }
    p.params = host[0], p.exp_avg = host[1], p.exp_avg_sq = host[2];
    fn(p);
    if (load && !host_)
      for (int k = 0; k < 3; ++k) be_.copy_from_host(live[k], host[k], p.count * sizeof(float));
  }
}

void DeviceEngine::after_load() {
  settle();  // no started all-gather may copy old values over the loaded ones
  for (auto& [b, w] : widened_) give(std::move(w));  // widened before the load: the old values
  widened_.clear();
  const auto& blocks = layout_.blocks();
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const int b = static_cast<int>(bi);
    const size_t off = blocks[b].offset, n = blocks[b].numel;
    if (half_ && cfg_.stage == 0) {  // every rank's masters whole, then the 16-bit copy of them all
      allgather(at<float>(master_, off), b, MPI_FLOAT);
      be_.narrow_half(reinterpret_cast<uint16_t*>(whole(b)), at<float>(master_, off), n, prec_);
    } else if (half_) {  // this rank's loaded masters, rounded into its 16-bit slice, gathered if whole
      be_.narrow_half(home16(b), master(b), static_cast<size_t>(counts_[b][rank_]), prec_);
      if (resident_[b]) allgather(whole(b), b, MPI_UINT16_T);
    } else if (resident_[b]) {  // fp32: the masters are the parameters; a partitioned slice is loaded as it is
      allgather(whole(b), b, MPI_FLOAT);
    }
    if (cfg_.stage == 0) {
      allgather(at<float>(m_, off), b, MPI_FLOAT);
      allgather(at<float>(v_, off), b, MPI_FLOAT);
    }
  }
  bytes_sent_ = 0;
}

std::vector<float> DeviceEngine::gather_params() {
  settle();
  const auto& blocks = layout_.blocks();
  std::vector<float> out(layout_.numel());
  std::vector<float> mine;
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const int b = static_cast<int>(bi);
    float* dst = out.data() + blocks[b].offset;
    const size_t n = blocks[b].numel;
    if (half_ && cfg_.stage == 0) {  // the fp32 masters (16-bit runs gather masters, not their copies)
      be_.copy_to_host(dst, at<float>(master_, blocks[b].offset), n * sizeof(float));
    } else if (!half_ && resident_[b]) {
      be_.copy_to_host(dst, whole(b), n * sizeof(float));
    } else {  // this rank's fp32 master slice, gathered
      mine.resize(static_cast<size_t>(counts_[b][rank_]));
      be_.copy_to_host(mine.data(), master(b), mine.size() * sizeof(float));
      HPCT_CHECK_MPI(MPI_Allgatherv(mine.data(), counts_[b][rank_], MPI_FLOAT, dst, counts_[b].data(),
                                    displs_[b].data(), MPI_FLOAT, dp_.raw()));
    }
  }
  return out;
}

ZeroMemory DeviceEngine::memory() const {
  ZeroMemory m;
  m.on_device = !host_;
  m.params = params_.bytes() + shard_.bytes();
  m.grads = grads_.bytes();
  if (cfg_.stage >= 2) m.grads += grad_shard_.bytes();
  else m.grad_shard = grad_shard_.bytes();
  m.optimizer = master_.bytes() + m_.bytes() + v_.bytes();
  m.working_peak = working_peak_;
  return m;
}

}  // namespace hpct::parallel
