// hpct/parallel/zero.hpp — ZeRO: data-parallel training with model states partitioned over the N
// ranks of a data-parallel group, so nothing is stored N times (Rajbhandari et al., arXiv 1910.02054).
//
// The engine is the model's ParamStore: the model code is the same for every stage.
//   stage 0  every rank holds all parameters, gradients and Adam moments; gradients are all-reduced
//            block by block as backward finishes each block.
//   stage 1  the Adam moments (and the update) are partitioned: full gradients are accumulated
//            over micro-steps, reduce-scattered on the last one into each owner's shard, each rank
//            updates its shard, and the updated parameters are all-gathered.
//   stage 2  the gradients too: a block's gradient lives in a working buffer only while backward
//            writes it, is reduce-scattered into the owners' shards as soon as the block is done
//            (every micro-step, overlapped with the rest of backward), and the buffer is reused.
//   stage 3  the parameters too: each block is all-gathered just before its forward or backward
//            and released after; the next blocks (in the order recorded on the first micro-step)
//            are prefetched up to prefetch_bucket_size elements; blocks under
//            param_persistence_threshold elements stay whole on every rank; at most
//            max_live_parameters gathered elements are live besides the one in use.
//
// Partition (ShardLayout): every block is cut into N equal slices, the last ones padded, rank r
// owning slice r. It is a pure function of (ParamLayout, N), so a checkpoint written with one N is
// read with another (the checkpoint stores full tensors; each rank reads its slices).
//
// Precision of the stored states (docs/zero.md has the formulas):
//   fp32 runs: fp32 parameters (which are also the master copy), fp32 gradients, fp32 Adam moments:
//     4+4+8 bytes per parameter.
//   bf16/fp16 runs (mixed precision, the paper's K = 12): 16-bit parameters (the copy the model
//     computes with: replicated at stages 0-2, this rank's slices at stage 3), 16-bit gradients, and
//     fp32 master weights + Adam moments for what this rank updates: 2+2+12. params(block) widens a
//     block into an fp32 working buffer (stage 3: after a 16-bit all-gather) until release(block);
//     grads(block) is an fp32 working buffer that grads_ready(block) folds into the 16-bit gradient
//     (one rounding per micro-step, as a GPU's 16-bit .grad accumulates). Gradients are reduced
//     in 16 bits (each addition in fp32, rounded: DeepSpeed's default communication_data_type),
//     or in fp32 and rounded once with fp32_communication; parameter all-gathers move 16-bit values.
// Offload (ZeRO-Infinity): offload_optimizer.device nvme keeps this rank's Adam moments in its own
// swap file (io::SwapStore) and runs the update as a pipelined sweep (read tile i+1, update tile i,
// write tile i-1); offload_param.device nvme (stage 3) keeps the parameter shard there too, read
// slice by slice for each gather. In bf16/fp16 runs the swap file holds the fp32 master slices
// instead, and a gather rounds the slice it reads (no separate 16-bit copy is stored). Gradients
// stay in host memory. device cpu: on the CPU backend the
// states already live in host memory, so it places nothing differently (reported as the host tier).
// One engine serves one reducing group; parallel/grouped_store.hpp puts one per group behind one store.
#pragma once
#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hpct/comm/mpi.hpp"
#include "hpct/core/param_layout.hpp"
#include "hpct/io/async_io.hpp"
#include "hpct/io/swap_store.hpp"
#include "hpct/kernels/precision.hpp"
#include "hpct/model/gpt.hpp"
#include "hpct/parallel/sharded_optimizer.hpp"
#include "hpct/parallel/use_trace.hpp"

namespace hpct::parallel {

/// ds_config zero_optimization.offload_optimizer / offload_param (DeepSpeed's names and defaults).
struct OffloadConfig {
  std::string device = "none";  // none | cpu | nvme
  std::string nvme_path;        // directory on the NVMe device (device nvme)
  bool pin_memory = false;      // mlock the swap buffers
  int buffer_count = 4;         // swap slots: tiles in flight (read ahead, compute, write behind)
  bool nvme() const { return device == "nvme"; }
};

/// ds_config zero_optimization knobs this engine uses (DeepSpeed's names and source defaults).
struct ZeroConfig {
  int stage = 0;
  double reduce_bucket_size = 5e8;             // gradient elements in flight before the oldest reduction is waited for
  bool overlap_comm = true;                    // reduce during backward (false: each reduction completes before backward goes on)
  double allgather_bucket_size = 5e8;          // GPU-resident through NCCL: parameter elements being all-gathered at once after a step
  double prefetch_bucket_size = 5e7;           // stage3_prefetch_bucket_size: elements gathered ahead of use
  double param_persistence_threshold = 1e5;    // stage3_param_persistence_threshold: smaller blocks are not partitioned
  double max_live_parameters = 1e9;            // stage3_max_live_parameters: cap on gathered elements held
  double sub_group_size = 1e9;                 // elements per optimizer tile when the states are swapped (capped, see zero.md)
  bool fp32_communication = false;             // 16-bit runs: reduce gradients in fp32 (ds_config communication_data_type "fp32")
  OffloadConfig offload_optimizer, offload_param;
  io::AioConfig aio;                           // ds_config `aio` block, for NVMe offload
  /// Throws config_error naming "zero_optimization.<key>" for a value out of range.
  void validate() const;
};

/// Every block of a ParamLayout cut into N equal slices (ceil(numel/N) elements, the tail padded).
class ShardLayout {
 public:
  ShardLayout(const ParamLayout& layout, int n);
  int ranks() const { return n_; }
  size_t slice(int block) const { return slice_[block]; }            // padded slice length
  size_t local_offset(int block) const { return local_off_[block]; }  // slice's place in a rank's shard
  size_t local_numel() const { return local_numel_; }                 // one rank's shard, padded
  /// Rank r's real (unpadded) elements of block b: global flat indices [begin, begin + count).
  size_t begin(int block, int r) const;
  size_t count(int block, int r) const;

 private:
  const ParamLayout& layout_;
  int n_;
  std::vector<size_t> slice_, local_off_;
  size_t local_numel_ = 0;
};

class ZeroEngine final : public ShardedOptimizer {
 public:
  /// Collective over dp. `precision` is the training precision: fp32 stores fp32 states; bf16 and
  /// fp16 store 16-bit parameters and gradients beside fp32 masters (see above). fp16 also rounds
  /// every gradient to fp16 before it is reduced, so the overflow check sees what fp16 training would.
  /// swap_tag names this engine's swap file (unique per rank and engine on a node; "" = "zero.dp<rank>").
  ZeroEngine(const ParamLayout& layout, const ZeroConfig& cfg, const comm::Communicator& dp,
             kernels::Precision precision, std::string swap_tag = "");
  ~ZeroEngine() override;
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  int stage() const override { return cfg_.stage; }
  /// bf16/fp16 runs: parameters and gradients are stored in 16 bits.
  bool half() const override { return half_; }
  const ShardLayout& shards() const { return shards_; }

  /// Initialises the parameters block by block: init(block, dst) writes the whole block into dst.
  /// Every rank calls it alike; each keeps what it holds (no full copy for stage 3).
  void init_params(const std::function<void(int block, float* dst)>& init) override;

  // ---- ParamStore ----
  const float* params(int block) override;
  float* grads(int block) override;
  void release(int block) override;
  /// Mixed-precision runs: the 16-bit copy of a block every rank holds whole (stages 0-2; persistent
  /// blocks at stage 3); nullptr otherwise.
  const uint16_t* params_half(int block) override;
  void grads_ready(int block) override;
  /// Stages 2-3 of 16-bit runs take the 16-bit values as the reduction's input (16-bit
  /// communication) or widen them straight into it, without grads(block)'s zeroed fp32 buffer and
  /// the rounding back; other cases as ParamStore's default. Bitwise the same: 0 + x rounds back to
  /// x, up to the sign of a zero, which the shard's +0 + x erases.
  void grads_ready_half(int block, const uint16_t* g, size_t n, kernels::Precision p) override;

  /// Before the first micro-step of an optimizer step: clears gradients.
  void begin_step() override;
  /// Before each micro-step; `last` = the micro-step that ends the step (stages 0/1 reduce on it).
  void begin_micro_step(bool last) override;
  /// After each micro-step's backward: waits for its reductions.
  void end_micro_step() override;
  /// Collective: sum of squares of the reduced gradient (every rank gets the same value), over the
  /// primary tensors only: a tensor-parallel replica counts on the rank holding copy 0, so the sum
  /// over the tensor-parallel group counts every element once.
  double grad_sumsq() override;
  double grad_zeros() override;
  /// AdamW on this rank's shard (per-tensor weight decay from the layout), then re-replication of
  /// what must be whole (stage 1/2: all parameters; stage 3: persistent blocks). Collective.
  void adam_step(const AdamParams& a) override;
  /// Stages 0-2 (the re-gathers left to regather()), the states in memory or swept from NVMe (the
  /// forward reads only the in-memory copies); stage 3 without a swap file, whose gathers would
  /// read the parameters from it beside the sweep.
  bool step_is_local() const override { return !swap_ || cfg_.stage < 3; }
  void set_before_gather(std::function<void(int block)> hook) override { before_gather_ = std::move(hook); }
  void release_gathered() override;
  void regather(int block) override;
  bool regathers() const override;

  /// Calls fn on each of this rank's pieces of (params, exp_avg, exp_avg_sq), for checkpoints: its
  /// slice of each block, in block order (stage 0 too: every rank holds everything and writes its
  /// part). States in the swap file are staged through host buffers one block slice at a time;
  /// with load, what fn wrote is stored back.
  void visit_pieces(bool load, const std::function<void(const StatePiece&)>& fn) override;
  bool pieces_are_live() const override { return !offloaded(); }
  /// After the pieces were filled (checkpoint load): rebuild what every rank must hold. Collective.
  void after_load() override;
  /// Collective: the full flat parameters on every rank (tests, export). Not for large models.
  std::vector<float> gather_params() override;

  ZeroMemory memory() const override;
  size_t local_numel() const override { return shards_.local_numel(); }
  /// Bytes this rank sent in collectives since the last reset, counted as the ring algorithms move
  /// them: all-reduce 2(N-1)/N, reduce-scatter and all-gather (N-1)/N of the buffer.
  double bytes_sent() const override { return bytes_sent_; }
  void reset_bytes_sent() { bytes_sent_ = 0; }
  /// Gathers issued (stage 3), for tests of prefetch and reuse.
  long long gathers() const override { return gathers_; }
  bool offloaded() const override { return swap_ != nullptr; }
  /// The async IO engine the swap file runs on (what `auto` became here); only when offloaded().
  io::AioEngine swap_engine() const override { return swap_->engine(); }
  SwapTraffic swap_traffic() const override {
    std::lock_guard<std::mutex> lock(traffic_mu_);  // a sweep behind the forward adds to it
    return traffic_;
  }
  /// Seconds waited since construction: for stage-3 parameter gathers to arrive (with any NVMe
  /// read of the slice), and for gradient reductions to complete (with folding them into the shard).
  double gather_wait_seconds() const override { return gather_wait_; }
  /// Collective over the engine's group, after an adam_step with state_norms: the sums of squares
  /// of the updated fp32 weights, exp_avg and exp_avg_sq over every element the group holds.
  std::array<double, 3> state_sumsq() const override;
  double reduce_wait_seconds() const override { return reduce_wait_; }

 private:
  // f(offset, count, in the shard?) over the reduced gradient's primary ranges, summed over the
  // data-parallel group (grad_sumsq's and grad_zeros's traversal).
  double over_grads(const std::function<double(size_t at, size_t n, bool shard)>& f);
  struct Gathered;
  struct Reduction;
  bool resident(int b) const { return resident_[b]; }
  float* master(int b);  // this rank's slice of block b's fp32 master (in memory)
  bool master_in_swap(int b) const { return k_param_ >= 0 && (half_ || !resident_[b]); }
  uint16_t* home16(int b);                    // 16-bit runs: this rank's slice's 16-bit copy (nullptr: none stored)
  void publish(int b, const float* slice);    // 16-bit runs: round this rank's updated slice into home16
  void update_block(int b, const AdamParams& a);  // AdamW on this rank's range of block b
  void update(float* p, const float* g, const uint16_t* g16, float* m, float* v, size_t n, float weight_decay,
              const AdamParams& a, uint16_t* pub, bool primary);
  void finish_gather(Gathered& g);
  void start_gather(int b);
  void wait_gather(int b);
  void post_gather(int b);
  void prefetch();
  bool needed_soon(int b) const;
  size_t partitioned_numel(int b) const;  // a block's elements where stage 3 partitions it, else 0  // a partitioned block the trace asks for again within the prefetch window
  void start_reduction(int b);
  void finish_reduction(Reduction& r);
  void drain_reductions(size_t keep_elems);
  void all_gather_resident(int b);
  void note_working();
  void poll();
  void setup_swap();
  void swept_adam(const AdamParams& a, bool off_thread);
  void read_slice(int b, float* dst);  // this rank's slice of block b's parameters, wherever it lives
  struct Segment {                     // a run of this rank's shard inside one tensor
    size_t local = 0, count = 0;       // local shard index, length
    int block = 0;
    bool decay = true;
    bool primary = true;               // counted in norms (TensorSpec::primary)
    float* param = nullptr;            // in memory (nullptr: in the swap file at `local`)
  };
  std::vector<Segment> segments_;

  const ParamLayout& layout_;
  ZeroConfig cfg_;
  const comm::Communicator& dp_;
  kernels::Precision prec_;
  bool half_, fp16_;
  bool all_primary_ = true;      // no tensor-parallel replica copies in the layout (norms sum whole buffers)
  bool red16_;                   // gradients reduced in 16 bits (half_ unless fp32_communication)
  MPI_Op sum16_ = MPI_OP_NULL;   // their sum: 16-bit + 16-bit, added in fp32, rounded
  int n_, rank_;
  std::string swap_tag_;
  ShardLayout shards_;
  std::vector<char> resident_;                    // block kept whole on every rank
  std::thread::id mpi_thread_ = std::this_thread::get_id();  // the constructing thread: MPI's
  std::vector<size_t> res_off_;                   // resident block's offset in full_params_ (full16_ in 16-bit runs)
  std::vector<std::vector<int>> counts_, displs_; // per block: MPI counts/displacements (elements)

  // persistent state
  std::vector<float> full_params_;   // stage 0-2: all parameters (layout offsets); stage 3: resident blocks only
  std::vector<float> full_grads_;    // stage 0-1: all gradients
  std::vector<float> shard_params_;  // stage 3: this rank's slices of non-resident blocks
  std::vector<float> grad_shard_;    // stage 1-3: reduced gradients of this rank's slices
  std::vector<float> exp_avg_, exp_avg_sq_;  // stage 0: full; 1-3: this rank's slices
  // 16-bit runs instead of full_params_/shard_params_/full_grads_/grad_shard_ (same layouts):
  std::vector<uint16_t> full16_, shard16_, grads16_, grad_shard16_;
  std::vector<float> master32_;      // fp32 masters: stage 0 all (layout offsets); 1-3 this rank's slices

  // working buffers
  io::BufferPool pool_;
  std::map<int, Gathered*> gathered_;        // stage 3: blocks gathered or being gathered
  std::function<void(int)> before_gather_;   // set_before_gather's hook
  std::map<int, io::BufferPool::Lease> grad_blocks_;  // stage 2/3: gradient blocks being written
  std::map<int, io::BufferPool::Lease> half_sends_;   // stage 2/3, 16-bit communication: grads_ready_half's values
  std::vector<Reduction*> reductions_;       // in flight, oldest first
  size_t reducing_elems_ = 0;
  bool last_micro_ = true, first_micro_ = true;
  size_t working_peak_ = 0;

  UseTrace trace_;  // stage-3 prefetch: the order of params() calls on the first micro-step

  double bytes_sent_ = 0;
  double gather_wait_ = 0, reduce_wait_ = 0;
  std::array<double, 3> state_sumsq_{};  // this rank's part, from the last adam_step with state_norms
  long long gathers_ = 0;

  // NVMe swap: arrays of this rank's shard (local indices), roles below (-1 = in memory)
  std::unique_ptr<io::SwapStore> swap_;
  int k_param_ = -1, k_m_ = -1, k_v_ = -1;
  SwapTraffic traffic_;
  mutable std::mutex traffic_mu_;  // traffic_: written by a step on another thread, read on this one
};

}  // namespace hpct::parallel
