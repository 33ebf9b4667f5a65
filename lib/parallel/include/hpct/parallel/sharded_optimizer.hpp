// hpct/parallel/sharded_optimizer.hpp — what the trainer asks of whoever holds a data-parallel
// group's training state: the model's ParamStore plus the step protocol around it.
//
// What it is: one abstract type for the engines that keep parameters, gradients and Adam states
// partitioned over a data-parallel group (ZeRO stages 0-3). ZeroEngine (zero.hpp) keeps them in
// host memory (with NVMe offload); DeviceEngine (device_engine.hpp) keeps them in a backend's memory
// (the GPU) and runs the optimizer there. GroupedStore holds one per reducing group through this
// interface and never asks which one it has.
// The protocol, per optimizer step: begin_step(); per micro-step begin_micro_step(last), the
// model's params/grads/release/grads_ready calls, end_micro_step(); then grad_sumsq() (collective)
// and adam_step() (collective). Checkpoints read and write the state as pieces in host memory.
#pragma once
#include <array>
#include <cstddef>
#include <functional>
#include <vector>

#include "hpct/io/aio_config.hpp"
#include "hpct/kernels/optim.hpp"
#include "hpct/model/param_store.hpp"

namespace hpct::parallel {

struct AdamParams {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  int step = 1;            // 1-based, after increment
  float grad_scale = 1;    // multiplies gradients (unscaling and clipping)
  bool state_norms = false;  // also sum the squares of the updated weights and moments (state_sumsq)
  /// Where set, the host engine calls it with each block once that block's parameters as the model
  /// reads them (ParamStore::params / params_half) are final for this step, in block order, on every
  /// rank between the same collectives: ZeRO-Offload uploads a block while the others are updated.
  std::function<void(int block)> updated;
  /// The re-replication of each updated block (stages 1-2's all-gather over the group) is left to
  /// the caller: it calls regather(block) for every block `updated` reports, in that order, on the
  /// thread that makes the run's MPI calls (the step itself may then run on another thread).
  bool regather_later = false;
};

/// One rank's piece of the flat (unpadded) state: elements [begin, begin + count) of the global
/// buffers; the pointers address element `begin`. Pieces of all ranks cover every element once.
struct StatePiece {
  size_t begin = 0, count = 0;
  float* params = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
};

/// Bytes this rank holds, by kind. "Model states" are the persistent arrays the ZeRO formulas count;
/// working buffers (gathered blocks, gradient blocks in flight) are reported apart, as a high-water mark.
/// In bf16/fp16 runs `params` and `grads` are the 16-bit copies and `optimizer` counts the fp32
/// master weights with the moments (K = 12, as the ZeRO paper counts them).
struct ZeroMemory {
  bool on_device = false;                       // the persistent states below are in device memory
  size_t params = 0, grads = 0, optimizer = 0;  // persistent, in host memory (on_device: the device's)
  size_t frozen = 0;                            // frozen blocks (LoRA's base), whole on every rank
  size_t grad_shard = 0;                        // stage 1: the reduced-gradient shard besides the full gradients
  size_t working_peak = 0;                      // high-water mark of gather/reduce/swap buffers
  size_t nvme_params = 0, nvme_optimizer = 0;   // in this rank's swap file (payload bytes; fp32 masters count as optimizer)
  size_t nvme_file = 0;                         // the swap file's size (payload + alignment padding)
  size_t model_states() const { return params + grads + optimizer + frozen; }
};

/// NVMe traffic of the swap store since construction.
struct SwapTraffic {
  double bytes_read = 0, bytes_written = 0;
  double optimizer_seconds = 0;  // wall time of the optimizer sweeps
  double optimizer_io_wait = 0;  // of which the update waited for IO
  double optimizer_bytes = 0;    // read + written by the sweeps
  double param_read_seconds = 0; // time spent waiting for parameter slices
  double optimizer_seconds_behind = 0;  // of optimizer_seconds: sweeps run off the engine's thread (behind the forward)
};

/// The step's scalars as the optimizer kernels take them.
inline kernels::AdamwArgs adamw_args(const AdamParams& a, kernels::Precision p) {
  kernels::AdamwArgs k;
  k.lr = a.lr, k.beta1 = a.beta1, k.beta2 = a.beta2, k.eps = a.eps, k.step = a.step, k.grad_scale = a.grad_scale;
  k.precision = p;
  return k;
}

class ShardedOptimizer : public model::ParamStore {
 public:
  ~ShardedOptimizer() override = default;

  virtual int stage() const = 0;
  /// bf16/fp16 runs: parameters and gradients are stored in 16 bits beside fp32 masters.
  virtual bool half() const = 0;

  /// Initialises the parameters block by block: init(block, dst) writes the whole block into dst
  /// (host memory). Every rank calls it alike; each keeps what it holds.
  virtual void init_params(const std::function<void(int block, float* dst)>& init) = 0;
  /// Before the first micro-step of an optimizer step: clears gradients.
  virtual void begin_step() = 0;
  /// Before each micro-step; `last` = the micro-step that ends the step.
  virtual void begin_micro_step(bool last) = 0;
  /// After each micro-step's backward: waits for its reductions.
  virtual void end_micro_step() = 0;
  /// Collective: sum of squares of the reduced gradient over the primary tensors (a tensor-parallel
  /// replica counts on the rank holding copy 0); every rank gets the same value.
  virtual double grad_sumsq() = 0;
  /// Collective: how many elements of that reduced gradient are zero, counted as grad_sumsq sums
  /// (Megatron's --log-num-zeros-in-grad); every rank gets the same value.
  virtual double grad_zeros() = 0;
  /// Collective: AdamW on this rank's shard, then re-replication of what must be whole.
  virtual void adam_step(const AdamParams& a) = 0;
  /// adam_step without state_norms and with regather_later makes no MPI call and no call on a
  /// backend, and nothing else touches its swap file meanwhile (host states, or NVMe-swapped
  /// optimizer states at stages 1-2, whose sweep only this step reads; stage 3 after
  /// release_gathered(), without a swap file): another thread may run it while this one goes on
  /// with the model (parallel::DeviceStore::update_behind).
  /// Meanwhile this thread may call begin_micro_step, end_micro_step of a micro-step that handed no
  /// gradient, params and params_half of blocks the step has reported (stage 3: any block, with a
  /// before_gather hook that waits for the step's report of it), release, regather, and the
  /// counters (bytes_sent, the wait times, swap_traffic); nothing that reads or writes gradients or
  /// optimizer states.
  virtual bool step_is_local() const { return false; }
  /// Stage 3: hook(block) is called on this thread before the engine reads a block's parameters to
  /// gather or widen them (the block asked for, and each one prefetched), so that a step running on
  /// another thread can be waited for block by block (empty: none). Engines that gather nothing
  /// ignore it.
  virtual void set_before_gather(std::function<void(int block)> /*hook*/) {}
  /// Stage 3: drops the gathered working copies (waiting for their collectives), which an update
  /// makes stale; adam_step does it itself on the engine's thread, and must find none elsewhere.
  virtual void release_gathered() {}
  /// After an adam_step with regather_later: block's re-replication (collective over the group where
  /// regathers() is true; nothing otherwise).
  virtual void regather(int /*block*/) {}
  /// Whether regather() does anything: some updated block is all-gathered over more than one rank.
  virtual bool regathers() const { return false; }
  /// Collective, after an adam_step with state_norms: the sums of squares of the updated fp32
  /// weights, exp_avg and exp_avg_sq over every element the group holds.
  virtual std::array<double, 3> state_sumsq() const = 0;

  /// Calls fn on each of this rank's pieces of (params, exp_avg, exp_avg_sq) in host memory, block
  /// slice by block slice in block order; with load, what fn wrote is stored back.
  virtual void visit_pieces(bool load, const std::function<void(const StatePiece&)>& fn) = 0;
  /// True when visit_pieces' pointers address the live state in host memory (valid until the next
  /// adam_step), so a background thread may copy them later; false when they are staged copies
  /// (swap file, device memory) valid only during fn.
  virtual bool pieces_are_live() const = 0;
  /// After the pieces were filled (checkpoint load): rebuild what every rank must hold. Collective.
  virtual void after_load() = 0;
  /// Collective: the full flat parameters on every rank, in host memory (tests, export).
  virtual std::vector<float> gather_params() = 0;

  virtual ZeroMemory memory() const = 0;
  /// This rank's shard elements (padded): what a checkpoint's pieces of this rank hold at most.
  virtual size_t local_numel() const = 0;
  /// Bytes this rank sent in collectives since construction, counted as the ring algorithms move them.
  virtual double bytes_sent() const = 0;
  /// Seconds waited for parameter gathers (stage 3) and for gradient reductions.
  virtual double gather_wait_seconds() const { return 0; }
  virtual double reduce_wait_seconds() const { return 0; }
  /// Stage-3 gathers issued (tests of prefetch and reuse).
  virtual long long gathers() const { return 0; }
  /// States in an NVMe swap file (ZeRO-Infinity), its engine and traffic.
  virtual bool offloaded() const { return false; }
  virtual io::AioEngine swap_engine() const { return io::AioEngine::automatic; }
  virtual SwapTraffic swap_traffic() const { return {}; }
};

}  // namespace hpct::parallel
