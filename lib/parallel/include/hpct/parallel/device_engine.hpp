// hpct/parallel/device_engine.hpp — GPU-resident ZeRO: every training state in the memory of the
// model's backend, the optimizer step there too (DeepSpeed's default on GPUs).
//
// What it is: a ShardedOptimizer whose parameters, gradients, fp32 masters and Adam moments live in
// an OpsBackend's memory (the GPU with kernels::cuda_ops()), laid out as ZeroEngine lays them
// (zero.hpp: the same ShardLayout, the same stage semantics, the same 16-bit rounding points), so
// that on a backend computing as the CPU does it gives ZeroEngine's losses bitwise. Per step the
// host sees only scalars: the gradient's sum of squares (one reduction on the device) and the
// optimizer's arguments; AdamW is one multi-tensor launch (OpsBackend::adamw) that also writes the
// 16-bit copy the model computes with. Stages:
//   0  everything whole; gradients all-reduced block by block on the step's last micro-step;
//   1  the masters and moments partitioned; the full gradient reduce-scattered once per step;
//   2  the gradients too: each micro-step's block reduce-scattered as backward finishes it and
//      accumulated into the shard, the block's working buffer reused.
//   3  the parameters too: a block under stage3_param_persistence_threshold elements stays whole
//      on every rank; every other block is kept as this rank's slice and all-gathered into a
//      working buffer when the model asks for it (16-bit slices in 16-bit runs, then widened),
//      until release(). Gradients as at stage 2.
// After the update the parameters are all-gathered (stages 1-2; stage 3: the whole blocks only).
// Collectives: on the device through a comm::DeviceCollectives when the caller gives one (NCCL,
// where every rank of the group has a GPU of its own): the gradient reduce-scatters and all-reduces
// and the parameter all-gathers on device buffers, blocks padded to N equal slices (NCCL's layout;
// the padding is zeros and never leaves the engine), 16-bit sums added in fp32 and rounded per
// partial sum as the host engine's operator adds. Otherwise MPI with ZeroEngine's calls and
// operators, on the buffers themselves where the backend's memory is the host's, else staged
// through host copies (ranks sharing a GPU). Scalars (norms) go through MPI either way. Checkpoints: pieces staged through host buffers, so a
// background save copies them at once (pieces_are_live() is false).
// Overlap (overlap_comm, on by default): with device collectives that queue (NCCL), each gradient
// reduction is started behind the backend's stream as backward finishes its block and runs on
// NCCL's stream while the backward goes on; the work on its result (the add into the shard) and
// the reuse of its buffers are queued behind it once more than reduce_bucket_size elements are in
// flight, or at the micro-step's end, where the host waits (bounded) for them all. The parameter
// all-gathers after a step (stages 1-2, stage 3's whole blocks) are started likewise, at most
// allgather_bucket_size elements at once, and the next forward's stream waits for each block's
// only when the model asks for it.
// At stage 3 a partitioned block's all-gather is started likewise when the model asks for it, and
// the next blocks of the order recorded on the first micro-step are started ahead of use (up to
// stage3_prefetch_bucket_size elements), as ZeroEngine prefetches.
// What it is not (yet): NVMe offload (the host ZeroEngine's), overlap and prefetch on the MPI route.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hpct/comm/gpu.hpp"
#include "hpct/comm/mpi.hpp"
#include "hpct/core/param_layout.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "hpct/parallel/sharded_optimizer.hpp"
#include "hpct/parallel/started_collectives.hpp"
#include "hpct/parallel/use_trace.hpp"
#include "hpct/parallel/zero.hpp"

namespace hpct::parallel {

class DeviceEngine final : public ShardedOptimizer {
 public:
  /// Collective over dp. be: the model's backend (must outlive this). dc: collectives over the
  /// same ranks on be's memory (nullptr: MPI), each bounded by dc_timeout seconds; a failed or late
  /// one stops the step with one line naming it and the rank. Throws config_error for an offload
  /// setting (offload_optimizer / offload_param), which the host engine runs.
  DeviceEngine(const ParamLayout& layout, const ZeroConfig& cfg, const comm::Communicator& dp,
               kernels::Precision precision, kernels::OpsBackend& be, comm::DeviceCollectives* dc = nullptr,
               double dc_timeout = 600);
  ~DeviceEngine() override;
  DeviceEngine(const DeviceEngine&) = delete;
  DeviceEngine& operator=(const DeviceEngine&) = delete;

  int stage() const override { return cfg_.stage; }
  bool half() const override { return half_; }

  // ---- ParamStore: pointers in the backend's memory ----
  const float* params(int block) override;
  /// 16-bit runs: the stored 16-bit block (stage 3: the gathered one, kept beside its widened copy
  /// until release); nullptr in fp32 runs.
  const uint16_t* params16(int block) override;
  float* grads(int block) override;
  void release(int block) override;
  void grads_ready(int block) override;

  void init_params(const std::function<void(int block, float* dst)>& init) override;
  void begin_step() override;
  void begin_micro_step(bool last) override;
  void end_micro_step() override;
  double grad_sumsq() override;
  double grad_zeros() override;
  void adam_step(const AdamParams& a) override;
  std::array<double, 3> state_sumsq() const override;
  void visit_pieces(bool load, const std::function<void(const StatePiece&)>& fn) override;
  bool pieces_are_live() const override { return false; }
  void after_load() override;
  std::vector<float> gather_params() override;

  ZeroMemory memory() const override;
  size_t local_numel() const override { return shards_.local_numel(); }
  double bytes_sent() const override { return bytes_sent_; }
  double reduce_wait_seconds() const override { return reduce_wait_; }
  double gather_wait_seconds() const override { return gather_wait_; }
  long long gathers() const override { return gathers_; }

 private:
  struct Run {  // a run of this rank's state inside one tensor (per-tensor weight decay)
    kernels::AdamwRun run;
    bool decay = true, primary = true;
  };
  void build_runs();
  float* master(int b);        // this rank's slice of block b's fp32 master
  // Block b's stored parameters (fp32, or the 16-bit copy): whole(b) the whole block (a resident
  // block: stages 0-2 all, stage 3 those under the persistence threshold), home(b) this rank's slice.
  char* whole(int b);
  char* home(int b);
  uint16_t* home16(int b) { return reinterpret_cast<uint16_t*>(home(b)); }
  const float* gather(int b);  // stage 3: a partitioned block all-gathered into a working buffer
  // Stage 3 through device collectives that queue: block b's all-gather started into its working
  // buffers (joined by await_gather), and the blocks the recorded order asks for next started
  // ahead of use, up to stage3_prefetch_bucket_size elements (ZeroEngine's prefetch).
  void start_gather(int b);
  void prefetch();
  size_t partitioned_numel(int b) const { return resident_[b] ? 0 : layout_.blocks()[b].numel; }
  bool queued() const { return dc_ != nullptr && n_ > 1 && dc_->queues(); }
  void reduce(int b);          // block b's gradient over the group, into the full gradient or the shard
  // Working buffers in the backend's memory, reused by size.
  kernels::BackendBuffer take(size_t bytes);
  void give(kernels::BackendBuffer&& buf);
  // The gradient reductions: MPI on backend memory (in place where marked), directly where the
  // backend's memory is the host's, through host copies otherwise; or started on the device
  // collectives. Either way `then` runs on the result and `hold` goes back to the pool after it.
  using Held = StartedCollectives::Held;
  void allreduce(void* buf, size_t count, MPI_Datatype type, MPI_Op op, Held hold, std::function<void()> then);
  void reduce_scatter(const void* send, bool padded, void* recv, bool room, int b, MPI_Datatype type, MPI_Op op,
                      Held hold, std::function<void()> then);
  // Started collectives (device collectives that queue): the gradient reductions, bounded by
  // reduce_bucket_size elements in flight (none without overlap_comm), and the parameter
  // all-gathers, bounded by allgather_bucket_size (stage 3's by its prefetch) and joined when the
  // model asks for their block. settle(): all of them joined and completed (the host waits).
  using Kind = StartedCollectives::Kind;
  using Start = StartedCollectives::Start;
  void await_gather(int b);  // block b's started all-gather joined (nothing where none is)
  void settle();
  void allgather_after_step(int b);  // block b's parameters, started where the collectives queue
  // The gradient work buffers are N slices long (the padding zero), so the device collectives
  // reduce them as they are.
  bool padded_work() const { return dc_ != nullptr && n_ > 1; }
  size_t reduce_keep() const { return cfg_.overlap_comm ? static_cast<size_t>(cfg_.reduce_bucket_size) : 0; }
  void allgather(void* block_buf, int b, MPI_Datatype type);  // in place: the block's rank slices
  // The device-collective path: the backend's stream drained, f(deadline, why) run, a failure thrown.
  void on_device(const char* what, const std::function<bool(double deadline, std::string* why)>& f);
  comm::DeviceCollectives::Elem elem(MPI_Datatype type) const;
  double sumsq(const void* buf, size_t n);                   // a gradient run (fp32 or 16-bit)
  // f over the reduced gradient's primary runs, summed over the data-parallel group (grad_sumsq's
  // and grad_zeros's traversal).
  double over_grads(const std::function<double(const void* buf, size_t n)>& f);

  const ParamLayout& layout_;
  ZeroConfig cfg_;
  const comm::Communicator& dp_;
  kernels::Precision prec_;
  kernels::OpsBackend& be_;
  comm::DeviceCollectives* dc_;
  double dc_timeout_;
  bool half_, fp16_, red16_, host_;
  bool all_primary_ = true;
  int n_, rank_;
  ShardLayout shards_;
  std::vector<std::vector<int>> counts_, displs_;
  MPI_Op sum16_ = MPI_OP_NULL;

  std::vector<char> resident_;   // block kept whole on every rank (all of them at stages 0-2)
  std::vector<size_t> res_off_;  // a resident block's offset in params_ (its layout offset at stages 0-2)

  // persistent state, in the backend's memory (layouts as ZeroEngine's)
  kernels::BackendBuffer params_;      // the resident blocks whole: fp32, or the 16-bit copy
  kernels::BackendBuffer shard_;       // stage 3: this rank's slices of the other blocks (local offsets)
  kernels::BackendBuffer master_;      // 16-bit runs: fp32 masters (stage 0 all, else this rank's slices)
  kernels::BackendBuffer m_, v_;       // stage 0 all, else this rank's slices
  kernels::BackendBuffer grads_;       // stages 0-1: the full gradient, fp32 or 16-bit
  kernels::BackendBuffer grad_shard_;  // stages 1-2: this rank's reduced slices, fp32 or 16-bit
  std::vector<Run> runs_;              // this rank's update, in ZeroEngine's order
  std::vector<kernels::AdamwRun> step_runs_;

  // working buffers
  std::map<int, kernels::BackendBuffer> widened_;  // blocks widened (16-bit runs) or gathered (stage 3) for the model
  std::map<int, kernels::BackendBuffer> gathered16_;  // stage 3, 16-bit runs: a gathered block's 16-bit values
  std::map<int, kernels::BackendBuffer> work_;     // fp32 gradient blocks being written
  std::multimap<size_t, kernels::BackendBuffer> free_;
  size_t working_ = 0, working_peak_ = 0;
  std::vector<char> stage_a_, stage_b_;  // host copies for staged collectives
  bool last_micro_ = true;
  UseTrace trace_;  // stage 3: the order of params() calls on the first micro-step (as ZeroEngine's)

  double bytes_sent_ = 0, reduce_wait_ = 0, gather_wait_ = 0;
  long long gathers_ = 0;
  std::array<double, 3> state_sumsq_{};
  // Last: destroyed first, so that a started collective ends before the buffers it uses are freed.
  std::unique_ptr<StartedCollectives> started_;
};

}  // namespace hpct::parallel
