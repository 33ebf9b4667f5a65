// ZeRO stages 0-3 (see zero.hpp): configuration, shards, set-up, gradient reduction. Stage-3
// gathers are in zero_gather.cpp; the optimizer step and checkpoint pieces in zero_step.cpp.
#include "hpct/parallel/zero.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hpct/core/error.hpp"
#include "hpct/core/timer.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/host_copy.hpp"
#include "hpct/kernels/ops.hpp"
#include "hpct/kernels/optim.hpp"
#include "zero_internal.hpp"

namespace hpct::parallel {

namespace {
// Emulates fp16 gradient storage/communication: values beyond fp16's range become inf, which the
// overflow check must then catch (as it would on a GPU with fp16 gradients).
void round_to_fp16(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<kernels::ieee_half>(x[i]));
}

// MPI reduction operators for 16-bit gradients (MPI has no bf16/fp16 sum): in MPI_UINT16_T
// buffers, inout = round(inout + in), added in fp32.
void sum_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  kernels::add_half(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), static_cast<size_t>(*len),
                    kernels::Precision::bf16);
}
void sum_fp16(void* in, void* inout, int* len, MPI_Datatype*) {
  kernels::add_half(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), static_cast<size_t>(*len),
                    kernels::Precision::fp16);
}
}  // namespace

MPI_Op make_sum16_op(kernels::Precision p) {
  MPI_Op op = MPI_OP_NULL;
  HPCT_CHECK_MPI(MPI_Op_create(p == kernels::Precision::fp16 ? &sum_fp16 : &sum_bf16, /*commute=*/1, &op));
  return op;
}

void ZeroConfig::validate() const {
  if (stage < 0 || stage > 3)
    throw config_error("zero_optimization.stage", "ZeRO stage must be 0, 1, 2 or 3, not " + std::to_string(stage));
  auto pos = [](double v, const char* key) {
    if (!(v > 0)) throw config_error(std::string("zero_optimization.") + key, "must be a positive number of elements");
  };
  pos(reduce_bucket_size, "reduce_bucket_size");
  pos(allgather_bucket_size, "allgather_bucket_size");
  pos(prefetch_bucket_size, "stage3_prefetch_bucket_size");
  pos(max_live_parameters, "stage3_max_live_parameters");
  if (param_persistence_threshold < 0)
    throw config_error("zero_optimization.stage3_param_persistence_threshold", "must be >= 0 elements");
  pos(sub_group_size, "sub_group_size");
  for (const auto* o : {&offload_optimizer, &offload_param}) {
    const std::string key = std::string("zero_optimization.") + (o == &offload_optimizer ? "offload_optimizer" : "offload_param");
    if (o->device != "none" && o->device != "cpu" && o->device != "nvme")
      throw config_error(key + ".device", "'" + o->device + "' is not a device: use none, cpu or nvme");
    if (o->nvme() && o->nvme_path.empty())
      throw config_error(key + ".nvme_path", "device nvme needs nvme_path: a directory on the NVMe drive");
    if (o->buffer_count < 2)
      throw config_error(key + ".buffer_count", "must be >= 2 (one tile computed while the next is read)");
  }
  if (offload_optimizer.device != "none" && stage == 0)
    throw config_error("zero_optimization.offload_optimizer.device", "offloading the optimizer needs ZeRO stage 1, 2 or 3");
  if (offload_param.device != "none" && stage != 3)
    throw config_error("zero_optimization.offload_param.device", "offloading parameters needs ZeRO stage 3");
  if (offload_optimizer.nvme() && offload_param.nvme() && offload_optimizer.nvme_path != offload_param.nvme_path)
    throw config_error("zero_optimization.offload_param.nvme_path",
                       "must equal offload_optimizer.nvme_path ('" + offload_optimizer.nvme_path +
                           "'): one swap file per rank holds both");
  if (offload_optimizer.nvme() || offload_param.nvme()) aio.validate("aio");
}

// ---------------------------------------------------------------------------------------------
ShardLayout::ShardLayout(const ParamLayout& layout, int n) : layout_(layout), n_(n) {
  const auto& blocks = layout.blocks();
  slice_.resize(blocks.size());
  local_off_.resize(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    slice_[b] = (blocks[b].numel + n - 1) / n;
    local_off_[b] = local_numel_;
    local_numel_ += slice_[b];
  }
}

size_t ShardLayout::begin(int block, int r) const {
  const auto& b = layout_.blocks()[block];
  return b.offset + std::min(b.numel, slice_[block] * r);
}

size_t ShardLayout::count(int block, int r) const {
  const auto& b = layout_.blocks()[block];
  size_t lo = std::min(b.numel, slice_[block] * r), hi = std::min(b.numel, slice_[block] * (r + 1));
  return hi - lo;
}

// ---------------------------------------------------------------------------------------------
ZeroEngine::ZeroEngine(const ParamLayout& layout, const ZeroConfig& cfg, const comm::Communicator& dp,
                       kernels::Precision precision, std::string swap_tag)
    : layout_(layout), cfg_(cfg), dp_(dp), prec_(precision), half_(precision != kernels::Precision::fp32),
      fp16_(precision == kernels::Precision::fp16), red16_(half_ && !cfg.fp32_communication), n_(dp.size()),
      rank_(dp.rank()), swap_tag_(swap_tag.empty() ? "zero.dp" + std::to_string(dp.rank()) : std::move(swap_tag)),
      shards_(layout, dp.size()) {
  cfg_.validate();
  for (const auto& t : layout.tensors()) all_primary_ = all_primary_ && t.primary();
  const auto& blocks = layout.blocks();
  const size_t nb = blocks.size();
  resident_.assign(nb, 1);
  res_off_.assign(nb, 0);
  counts_.assign(nb, std::vector<int>(n_));
  displs_.assign(nb, std::vector<int>(n_));
  size_t full = 0;
  for (size_t b = 0; b < nb; ++b) {
    as_count(blocks[b].numel, "ZeRO");
    for (int r = 0; r < n_; ++r) {
      counts_[b][r] = static_cast<int>(shards_.count((int)b, r));
      displs_[b][r] = static_cast<int>(shards_.begin((int)b, r) - blocks[b].offset);
    }
    if (cfg_.stage == 3 && static_cast<double>(blocks[b].numel) >= cfg_.param_persistence_threshold) resident_[b] = 0;
    if (resident_[b]) {
      res_off_[b] = full;
      full += blocks[b].numel;
    }
  }
  // Stages 0-2 keep every block, at its layout offset (full == numel): the flat layout stays.
  if (half_) full16_.assign(full, 0);
  else full_params_.assign(full, 0.0f);
  const size_t L = shards_.local_numel();
  auto full_grads = [&] {  // stages 0-1: every rank holds every gradient
    if (half_) grads16_.assign(layout.numel(), 0);
    else full_grads_.assign(layout.numel(), 0.0f);
  };
  switch (cfg_.stage) {
    case 0:
      full_grads();
      exp_avg_.assign(layout.numel(), 0.0f);
      exp_avg_sq_.assign(layout.numel(), 0.0f);
      if (half_) master32_.assign(layout.numel(), 0.0f);
      break;
    case 1:
      full_grads();
      [[fallthrough]];
    default:
      if (half_) grad_shard16_.assign(L, 0);
      else grad_shard_.assign(L, 0.0f);
      if (!cfg_.offload_optimizer.nvme()) {
        exp_avg_.assign(L, 0.0f);
        exp_avg_sq_.assign(L, 0.0f);
      }
      // 16-bit runs keep the fp32 masters with the moments: in the swap file when either is offloaded.
      if (half_ && !cfg_.offload_optimizer.nvme() && !cfg_.offload_param.nvme()) master32_.assign(L, 0.0f);
      if (cfg_.stage == 3 && !cfg_.offload_param.nvme()) {
        // Only the slices of partitioned blocks live here; resident blocks' slices are in full_params_.
        size_t need = 0;
        for (size_t b = 0; b < nb; ++b)
          if (!resident_[b]) need = shards_.local_offset((int)b) + shards_.slice((int)b);
        if (half_) shard16_.assign(need, 0);
        else shard_params_.assign(need, 0.0f);
      }
  }
  setup_swap();
  // The runs of this rank's shard inside each tensor (weight decay per tensor), for the sweeps.
  if (cfg_.stage >= 1) {
    for (size_t bi = 0; bi < nb; ++bi) {
      const int b = static_cast<int>(bi);
      const size_t lo = shards_.begin(b, rank_), cnt = static_cast<size_t>(counts_[b][rank_]);
      for (const auto& t : layout.tensors()) {
        if (t.block != b) continue;
        const size_t s0 = std::max(lo, t.offset), e0 = std::min(lo + cnt, t.offset + t.numel);
        if (s0 >= e0) continue;
        Segment seg;
        seg.local = shards_.local_offset(b) + (s0 - lo);
        seg.count = e0 - s0;
        seg.block = b;
        seg.decay = t.weight_decay;
        seg.primary = t.primary();
        seg.param = master_in_swap(b) ? nullptr : master(b) + (s0 - lo);
        segments_.push_back(seg);
      }
    }
  }
  // Last, so that nothing above can throw after it (the destructor, which frees it, would not run).
  if (red16_) sum16_ = make_sum16_op(prec_);
}

void ZeroEngine::setup_swap() {
  // The parameter array holds fp32 parameters (fp32 runs: only with offload_param) or, in 16-bit
  // runs, the fp32 masters (with either offload: they are optimizer state, read by the sweep).
  const bool opt = cfg_.offload_optimizer.nvme(), par = cfg_.offload_param.nvme() || (half_ && opt);
  if (!opt && !par) return;
  int k = 0;
  if (par) k_param_ = k++;
  if (opt) {
    k_m_ = k++;
    k_v_ = k++;
  }
  const OffloadConfig& oc = opt ? cfg_.offload_optimizer : cfg_.offload_param;
  io::SwapStoreConfig sc;
  sc.nvme_path = oc.nvme_path;
  sc.tag = swap_tag_;
  sc.num_arrays = k;
  sc.elems = shards_.local_numel();
  // Tiles: sub_group_size, but at least 4 per sweep (so reads, updates and writes overlap) and at
  // most 16M elements (64 MiB per array and slot) so the swap buffers stay small next to the states.
  const double quarter = std::ceil(double(sc.elems) / 4.0);
  sc.chunk_elems = static_cast<size_t>(std::max(4096.0, std::min({cfg_.sub_group_size, quarter, double(1 << 24)})));
  sc.buffer_count = oc.buffer_count;
  sc.pin_memory = oc.pin_memory;
  sc.aio = cfg_.aio;
  sc.config_key = std::string("zero_optimization.") + (opt ? "offload_optimizer" : "offload_param") + ".nvme_path";
  // Ranks of one node share its drive: each checks room for all of them, so none fails mid-run.
  MPI_Comm node;
  HPCT_CHECK_MPI(MPI_Comm_split_type(dp_.raw(), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  int node_ranks = 1;
  MPI_Comm_size(node, &node_ranks);
  MPI_Comm_free(&node);
  std::string err = comm::error_text_of([&] {
    const uint64_t mine = io::SwapStore::file_bytes(k, sc.elems);
    io::SwapStore::check_path(sc.nvme_path, mine * static_cast<uint64_t>(node_ranks), sc.aio.direct, sc.config_key);
    swap_ = std::make_unique<io::SwapStore>(sc);
  });
  comm::throw_if_any(dp_, err);
}

void ZeroEngine::read_slice(int b, float* dst) {
  const size_t c = static_cast<size_t>(counts_[b][rank_]);
  if (c == 0) return;  // this rank owns none of the block (N > numel)
  if (!master_in_swap(b)) {
    std::memcpy(dst, master(b), c * sizeof(float));
    return;
  }
  Timer t;
  swap_->read(k_param_, shards_.local_offset(b), c, dst);
  traffic_.param_read_seconds += t.seconds();
  traffic_.bytes_read += double(c) * sizeof(float);
}

ZeroEngine::~ZeroEngine() {
  for (auto* r : reductions_) {
    MPI_Wait(&r->req, MPI_STATUS_IGNORE);
    delete r;
  }
  for (auto& [b, g] : gathered_) {
    MPI_Wait(&g->req, MPI_STATUS_IGNORE);
    delete g;
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (sum16_ != MPI_OP_NULL && !finalized) MPI_Op_free(&sum16_);
}

float* ZeroEngine::master(int b) {
  if (half_) {
    if (cfg_.stage == 0) return master32_.data() + layout_.blocks()[b].offset + displs_[b][rank_];
    return master32_.data() + shards_.local_offset(b);
  }
  if (resident_[b]) return full_params_.data() + res_off_[b] + displs_[b][rank_];
  return shard_params_.data() + shards_.local_offset(b);
}

uint16_t* ZeroEngine::home16(int b) {
  if (resident_[b]) return full16_.data() + res_off_[b] + displs_[b][rank_];
  return shard16_.empty() ? nullptr : shard16_.data() + shards_.local_offset(b);
}

void ZeroEngine::publish(int b, const float* slice) {
  if (uint16_t* h = half_ ? home16(b) : nullptr) kernels::to_half(slice, h, static_cast<size_t>(counts_[b][rank_]), prec_);
}

void ZeroEngine::init_params(const std::function<void(int, float*)>& init) {
  const auto& blocks = layout_.blocks();
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (resident_[b] && !half_) {
      init((int)b, full_params_.data() + res_off_[b]);
      continue;
    }
    auto tmp = pool_.acquire(blocks[b].numel * sizeof(float));
    float* t = reinterpret_cast<float*>(tmp.data());
    init((int)b, t);
    if (half_ && cfg_.stage == 0) {  // every rank keeps every master
      std::memcpy(master32_.data() + blocks[b].offset, t, blocks[b].numel * sizeof(float));
      kernels::to_half(t, full16_.data() + res_off_[b], blocks[b].numel, prec_);
      continue;
    }
    if (half_ && resident_[b]) kernels::to_half(t, full16_.data() + res_off_[b], blocks[b].numel, prec_);
    else publish((int)b, t + displs_[b][rank_]);
    if (master_in_swap((int)b)) {
      swap_->write(k_param_, shards_.local_offset((int)b), t + displs_[b][rank_], counts_[b][rank_]);
      traffic_.bytes_written += double(counts_[b][rank_]) * sizeof(float);
    } else {
      std::memcpy(master((int)b), t + displs_[b][rank_], counts_[b][rank_] * sizeof(float));
    }
  }
  if (k_m_ >= 0) {  // Adam moments start at zero
    const io::ArrayMask mv = (1u << k_m_) | (1u << k_v_);
    auto st = swap_->sweep(0, mv, [&](const io::SweepChunk& c) {
      std::memset(c.array(k_m_), 0, c.count * sizeof(float));
      std::memset(c.array(k_v_), 0, c.count * sizeof(float));
    });
    traffic_.bytes_written += double(st.bytes_written);
  }
  note_working();
}

void ZeroEngine::note_working() {
  working_peak_ = std::max(working_peak_, pool_.allocated_bytes() + (swap_ ? swap_->host_bytes() : 0));
}

void ZeroEngine::poll() {
  // Open MPI progresses nonblocking collectives only inside MPI calls: nudge them between blocks,
  // and finish those that are done at once, so their gradient buffers go back to the pool now
  // rather than when reduce_bucket_size forces a wait. Each reduction adds into its own block's
  // shard (disjoint), so finishing them in any order gives the same bits.
  for (size_t i = 0; i < reductions_.size();) {
    int done = 0;
    HPCT_CHECK_MPI(MPI_Test(&reductions_[i]->req, &done, MPI_STATUS_IGNORE));
    if (!done) {
      ++i;
      continue;
    }
    Reduction* r = reductions_[i];
    reductions_.erase(reductions_.begin() + static_cast<std::ptrdiff_t>(i));
    finish_reduction(*r);  // MPI_Wait on the completed (now null) request returns at once
    delete r;
  }
}

// ---- gradients ---------------------------------------------------------------------------------
float* ZeroEngine::grads(int b) {
  const auto& blk = layout_.blocks()[b];
  if (cfg_.stage <= 1 && !half_) return full_grads_.data() + blk.offset;
  auto it = grad_blocks_.find(b);
  if (it == grad_blocks_.end()) {
    auto lease = pool_.acquire(blk.numel * sizeof(float));
    std::memset(lease.data(), 0, blk.numel * sizeof(float));
    note_working();
    it = grad_blocks_.emplace(b, std::move(lease)).first;
  }
  return reinterpret_cast<float*>(it->second.data());
}

void ZeroEngine::start_reduction(int b) {
  const auto& blk = layout_.blocks()[b];
  auto* r = new Reduction;
  r->block = b;
  r->numel = blk.numel;
  const MPI_Datatype type = red16_ ? MPI_UINT16_T : MPI_FLOAT;
  const MPI_Op sum = red16_ ? sum16_ : MPI_SUM;
  const double elem = red16_ ? sizeof(uint16_t) : sizeof(float);
  auto take_block = [&] {  // stage 2/3, and 16-bit runs reducing in fp32: the block's working buffer
    io::BufferPool::Lease l = std::move(grad_blocks_.at(b));
    grad_blocks_.erase(b);
    return l;
  };
  if (cfg_.stage == 0) {
    void* g;
    if (red16_) {  // the 16-bit gradient, in place
      g = grads16_.data() + blk.offset;
    } else if (half_) {  // the fp32 working buffer; finish_reduction rounds the sum into grads16_
      r->send = take_block();
      g = r->send.data();
    } else {
      g = full_grads_.data() + blk.offset;
    }
    if (fp16_ && !red16_) round_to_fp16(static_cast<float*>(g), blk.numel);
    if (n_ > 1) HPCT_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, g, (int)blk.numel, type, sum, dp_.raw(), &r->req));
    bytes_sent_ += 2.0 * (n_ - 1) / n_ * blk.numel * elem;
  } else {
    const void* send;
    void* recv;
    if (cfg_.stage == 1 && !(half_ && !red16_)) {
      // Stage 1 reduces once per step, from the full gradient straight into the shard.
      send = red16_ ? static_cast<const void*>(grads16_.data() + blk.offset) : full_grads_.data() + blk.offset;
      recv = red16_ ? static_cast<void*>(grad_shard16_.data() + shards_.local_offset(b))
                    : grad_shard_.data() + shards_.local_offset(b);
    } else if (red16_) {  // stage 2/3: round the block into a 16-bit send buffer; the fp32 one goes back now
      if (auto given = half_sends_.find(b); given != half_sends_.end()) {  // grads_ready_half's: as they are
        r->send = std::move(given->second);
        half_sends_.erase(given);
      } else {
        io::BufferPool::Lease work = take_block();
        r->send = pool_.acquire(blk.numel * sizeof(uint16_t));
        kernels::to_half(reinterpret_cast<const float*>(work.data()), reinterpret_cast<uint16_t*>(r->send.data()),
                         blk.numel, prec_);
      }
      r->recv = pool_.acquire(shards_.slice(b) * sizeof(uint16_t));
      note_working();
      send = r->send.data();
      recv = r->recv.data();
    } else {
      r->send = take_block();
      r->recv = pool_.acquire(shards_.slice(b) * sizeof(float));
      note_working();
      if (fp16_) round_to_fp16(reinterpret_cast<float*>(r->send.data()), blk.numel);
      send = r->send.data();
      recv = r->recv.data();
    }
    // One rank: the reduction is a copy, made on the host optimizer's threads instead of MPI's one
    // (the request stays null: finished at once).
    if (n_ == 1) kernels::host_copy(recv, send, static_cast<size_t>(counts_[b][0]) * static_cast<size_t>(elem));
    else HPCT_CHECK_MPI(MPI_Ireduce_scatter(send, recv, counts_[b].data(), type, sum, dp_.raw(), &r->req));
    bytes_sent_ += double(n_ - 1) / n_ * blk.numel * elem;
  }
  reductions_.push_back(r);
  reducing_elems_ += blk.numel;
}

void ZeroEngine::finish_reduction(Reduction& r) {
  HPCT_CHECK_MPI(MPI_Wait(&r.req, MPI_STATUS_IGNORE));
  if (red16_) {
    // Stages 0-1 reduced in place / into the shard; stages 2-3 add the received slice to the shard.
    if (cfg_.stage >= 2)
      kernels::add_half(reinterpret_cast<const uint16_t*>(r.recv.data()), grad_shard16_.data() + shards_.local_offset(r.block),
                        static_cast<size_t>(counts_[r.block][rank_]), prec_);
  } else if (cfg_.stage == 0 && half_) {
    kernels::to_half(reinterpret_cast<const float*>(r.send.data()), grads16_.data() + layout_.blocks()[r.block].offset,
                     r.numel, prec_);
  } else if (cfg_.stage >= 2 || (cfg_.stage == 1 && half_)) {
    // Accumulate over micro-steps into the shard (the first one adds to zeros: exact in fp32, one
    // rounding in 16 bits). Stage 1 reduces once per step, onto zeros.
    const size_t off = shards_.local_offset(r.block), c = static_cast<size_t>(counts_[r.block][rank_]);
    const float* src = reinterpret_cast<const float*>(r.recv.data());
    if (half_) {
      kernels::accumulate_half(src, grad_shard16_.data() + off, c, prec_);
    } else {
      float* dst = grad_shard_.data() + off;
      for (size_t i = 0; i < c; ++i) dst[i] += src[i];
    }
  }
  reducing_elems_ -= r.numel;
}

void ZeroEngine::drain_reductions(size_t keep_elems) {
  if (reductions_.empty() || reducing_elems_ <= keep_elems) return;
  Timer t;
  while (!reductions_.empty() && reducing_elems_ > keep_elems) {
    Reduction* r = reductions_.front();
    reductions_.erase(reductions_.begin());
    finish_reduction(*r);
    delete r;
  }
  reduce_wait_ += t.seconds();
}

void ZeroEngine::grads_ready(int b) {
  const bool reduce = cfg_.stage >= 2 || last_micro_;
  if (half_ && cfg_.stage <= 1) {
    // The micro-step's fp32 gradient meets the 16-bit accumulator of the earlier micro-steps:
    // folded into it (one rounding), or, on the last micro-step, added to it for the reduction.
    auto it = grad_blocks_.find(b);
    if (it == grad_blocks_.end()) throw Error("ZeRO: block '" + layout_.blocks()[b].name + "' reported ready without gradients");
    const auto& blk = layout_.blocks()[b];
    float* work = reinterpret_cast<float*>(it->second.data());
    if (!reduce || red16_) {  // 16-bit reductions start from the 16-bit gradient
      kernels::accumulate_half(work, grads16_.data() + blk.offset, blk.numel, prec_);
      grad_blocks_.erase(it);
      if (!reduce) return;
    } else {
      kernels::add_from_half(grads16_.data() + blk.offset, work, blk.numel, prec_);
    }
  }
  if (!reduce) return;
  start_reduction(b);
  if (!cfg_.overlap_comm) drain_reductions(0);
  else drain_reductions(static_cast<size_t>(cfg_.reduce_bucket_size));
  poll();
}

void ZeroEngine::grads_ready_half(int b, const uint16_t* g, size_t n, kernels::Precision p) {
  const auto& blk = layout_.blocks()[b];
  if (cfg_.stage < 2 || !half_ || p != prec_ || grad_blocks_.count(b) || half_sends_.count(b)) {
    ParamStore::grads_ready_half(b, g, n, p);
    return;
  }
  if (n != blk.numel)
    throw Error("ZeRO: block '" + blk.name + "' handed over with " + std::to_string(n) + " gradient values, not " +
                std::to_string(blk.numel));
  if (red16_) {
    io::BufferPool::Lease send = pool_.acquire(n * sizeof(uint16_t));
    kernels::host_copy(send.data(), g, n * sizeof(uint16_t));
    half_sends_.emplace(b, std::move(send));
  } else {
    io::BufferPool::Lease work = pool_.acquire(n * sizeof(float));
    kernels::from_half(g, reinterpret_cast<float*>(work.data()), n, prec_);
    grad_blocks_.emplace(b, std::move(work));
  }
  note_working();
  grads_ready(b);
}

void ZeroEngine::begin_step() {
  if (!full_grads_.empty()) std::memset(full_grads_.data(), 0, full_grads_.size() * sizeof(float));
  if (!grad_shard_.empty()) std::memset(grad_shard_.data(), 0, grad_shard_.size() * sizeof(float));
  std::fill(grads16_.begin(), grads16_.end(), uint16_t(0));  // +0 in bf16 and fp16
  std::fill(grad_shard16_.begin(), grad_shard16_.end(), uint16_t(0));
  half_sends_.clear();  // a step abandoned by an exception left none behind
}

void ZeroEngine::begin_micro_step(bool last) {
  last_micro_ = last;
  trace_.begin_micro_step();
}

void ZeroEngine::end_micro_step() {
  drain_reductions(0);
  if (!grad_blocks_.empty())
    throw Error("ZeRO: gradients of block '" + layout_.blocks()[grad_blocks_.begin()->first].name +
                "' were written but never reported ready (model bug)");
  trace_.end_micro_step();
}

double ZeroEngine::grad_sumsq() {
  return over_grads([&](size_t at, size_t n, bool shard) {  // 16-bit gradients widened tile by tile
    if (!half_) return kernels::sum_of_squares((shard ? grad_shard_ : full_grads_).data() + at, n);
    return kernels::sum_of_squares_half((shard ? grad_shard16_ : grads16_).data() + at, n, prec_);
  });
}

double ZeroEngine::grad_zeros() {
  return over_grads([&](size_t at, size_t n, bool shard) {
    if (!half_) return kernels::count_zeros((shard ? grad_shard_ : full_grads_).data() + at, n);
    return kernels::count_zeros_half((shard ? grad_shard16_ : grads16_).data() + at, n);
  });
}

double ZeroEngine::over_grads(const std::function<double(size_t at, size_t n, bool shard)>& sumsq) {
  // Tensor-parallel replicas count on their primary copy's rank only (the caller sums over the
  // tensor-parallel group); without them the whole buffer is summed at once.
  double s = 0;
  if (cfg_.stage == 0) {  // identical everywhere
    if (all_primary_) return sumsq(0, layout_.numel(), false);
    for (const auto& t : layout_.tensors())
      if (t.primary()) s += sumsq(t.offset, t.numel, false);
    return s;
  }
  if (all_primary_) {
    s = sumsq(0, half_ ? grad_shard16_.size() : grad_shard_.size(), true);  // padding is zero
  } else {
    for (const auto& sg : segments_)
      if (sg.primary) s += sumsq(sg.local, sg.count, true);
  }
  dp_.allreduce_sum(&s, 1);
  return s;
}

void ZeroEngine::all_gather_resident(int b) {
  if (n_ == 1) return;  // one rank holds the whole block already: no MPI call
  const auto& blk = layout_.blocks()[b];
  const MPI_Datatype type = half_ ? MPI_UINT16_T : MPI_FLOAT;
  void* buf = half_ ? static_cast<void*>(full16_.data() + res_off_[b]) : full_params_.data() + res_off_[b];
  HPCT_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, type, buf, counts_[b].data(), displs_[b].data(), type, dp_.raw()));
  bytes_sent_ += double(n_ - 1) / n_ * blk.numel * (half_ ? sizeof(uint16_t) : sizeof(float));
}

}  // namespace hpct::parallel
