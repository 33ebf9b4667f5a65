// hpct/parallel/device_store.hpp — ZeRO-Offload: the model computes on a device, the ZeRO engine's
// states (and its optimizer step) stay in host memory.
//
// What it is: a ParamStore for a model on a device backend (kernels::cuda_ops()) that stands in
// front of a host ParamStore (the ZeroEngine). params(b) brings the block's parameters to the
// device; grads(b) hands the model a device buffer for the block's gradient, zeroed for the
// micro-step; grads_ready(b) copies that gradient back, adds it into the engine's gradient for the
// block, and tells the engine, which reduces and, after the step, runs AdamW on the host (CPU, or
// swapped through NVMe with offload_optimizer.device nvme: ZeRO-Infinity). This is DeepSpeed's
// ZeRO-Offload data flow: gradients device -> host, update on the host, parameters host -> device.
//
// What stays on the device:
// (the model: the blocks this rank holds, all but the other ranks' experts under expert parallelism)
//   stages 0-2, 16-bit runs (storage bf16/fp16): the engine's 16-bit parameters of the whole model
//     (2 bytes per parameter, copied once per step), each block widened to an fp32 working copy
//     only while the model uses it, and a 16-bit gradient accumulator of the whole model (2 bytes):
//     ZeRO-Offload's 2+2 bytes per parameter on the GPU;
//   stages 0-2, fp32: fp32 parameters and an fp32 gradient accumulator of the whole model (4+4);
//   stage 3: a block's fp32 parameters (what the engine gathered) only from params(b) to release(b).
// Gradients: a block's fp32 gradient lives from grads(b) to grads_ready(b) (stage 3 on a device: to
// the next block's grads_ready, its download under way), at every stage. At
// stages 0-2 grads_ready(b) folds it into the accumulator on the device (16-bit runs: rounded once
// per micro-step, bitwise as the engine's own accumulate_half), and only on the micro-step that ends
// the step (begin_micro_step) is the accumulated block copied back (2 or 4 bytes per parameter, once
// per step) and reported to the engine, which then reduces once per step. At stage 3 every
// micro-step's fp32 gradient goes back as it is (the engine reduce-scatters it at once).
// "Once per step": the parameter copy is kept until invalidate(), which the trainer calls after each
// optimizer step and checkpoint load.
//
// The hand-over on a device backend (host_memory() false) runs beside the ops, DeepSpeed's way:
//   gradients: each block's gradient (stages 0-2: the step's sum, once per step; stage 3: every
//     micro-step's) is downloaded into a page-locked host slot as soon as grads_ready(b) is called,
//     on the backend's download queue, while the backward goes on; the engine gets it (16-bit runs:
//     ParamStore::grads_ready_half, the 2-byte values as they are) when a slot is needed again, so
//     the host's part of one block runs while the device computes the next ones, and end_micro_step()
//     hands over what is left. The engine is called in the model's block order, a fixed number of
//     blocks late (kSlots - 1): the same sequence of collectives on every rank, whatever the timing.
//   parameters (stages 0-2): in 16-bit runs the engine's 16-bit copies are pinned where the backend
//     can (OpsBackend::pin_host, in runs of blocks that lie back to back) and each block is uploaded
//     straight from them as soon as the optimizer has updated it (updated(b), called from the
//     engine's step), while the next blocks are updated: no host copy, and the forward finds them
//     on the device. Blocks not pinned (fp32 runs, or where pinning fails) go as before: after
//     invalidate() or begin_update(), params(b) uploads the block through a host slot on the upload
//     queue, the blocks that followed b in the first step's order ahead of it (kSlots - 1), so the
//     copies run under the forward's compute. Either way the ops that use a block wait for its
//     upload on the device, not the host. Stage 3 copies what the engine gathered as before.
// On a host-memory backend (the CPU) every copy is done when it returns and each block is handed
// over at once, as before. The staged test backend with deferred transfers (tests/model/
// staged_cpu_ops.hpp) checks the ordering: a copy read before its ticket is done reads stale data.
// The optimizer step behind the next forward (update_behind): where the engine's step can be made
// free of collective calls (stages 0-2 in host memory: ShardedOptimizer::step_is_local, with the
// all-gathers left to this thread: AdamParams::regather_later), it runs on a worker thread
// (StepBehind, step_behind.hpp) while the trainer goes on into the next step, with the same
// numbers: params(b) waits for block b's update before uploading it. The first gradient handed to
// the engine waits for the whole step (the step reads the previous gradients), and so does anything
// that reads or writes the engine's state (a checkpoint, an evaluation: the trainer's join()). The
// worker makes no call on the backend: updated(b) only records b there, and this thread issues the
// uploads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "hpct/core/param_layout.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "hpct/model/gpt.hpp"
#include "hpct/parallel/sharded_optimizer.hpp"
#include "hpct/parallel/step_behind.hpp"

namespace hpct::parallel {

class DeviceStore final : public model::ParamStore {
 public:
  /// host: the engine (must outlive this); be: the model's backend. cache_params: stages 0-2 (the
  /// parameters change only in the step); storage: bf16/fp16 to keep the engine's 16-bit copies
  /// (ParamStore::params_half) on the device with cache_params, fp32 otherwise. held: the blocks
  /// this rank holds (expert parallelism: not the other ranks' experts); empty: every block.
  DeviceStore(model::ParamStore& host, const ParamLayout& layout, kernels::OpsBackend& be, bool cache_params,
              kernels::Precision storage = kernels::Precision::fp32, const std::vector<int>& held = {});
  /// What a store of these arguments keeps in the backend's memory at least: the resident parameters
  /// and gradient sum of the held blocks (cache_params), and one block's fp32 working copy (the
  /// largest). The blocks in use beside it (a gradient, the embedding's) are not counted: the
  /// pre-flight memory check's lower bound.
  static size_t device_bytes_needed(const ParamLayout& layout, bool cache_params, kernels::Precision storage,
                                    const std::vector<int>& held = {});
  /// Waits for its transfers (nothing more is handed to the engine), then frees its host slots.
  ~DeviceStore() override;
  DeviceStore(const DeviceStore&) = delete;
  DeviceStore& operator=(const DeviceStore&) = delete;
  /// Before the engine's parameters are written outside a step (a checkpoint load): waits for the
  /// uploads still reading them (pinned blocks are uploaded from the engine's own memory).
  void settle();
  /// The host parameters changed (a checkpoint load): copy every block again.
  void invalidate();
  /// Before an optimizer step: waits for the uploads still reading the engine's copies, marks the
  /// blocks that train stale (the frozen ones, LoRA's base, did not change and stay), and sets
  /// a.updated to updated(), for the engine to call during that step (this store must outlive it).
  void begin_update(AdamParams& a);
  /// From the engine's step (AdamParams::updated): block b's parameters are final; a pinned block
  /// is uploaded now, beside the update of the next ones (others wait for params(b)). From a step
  /// behind (update_behind's worker): only recorded; params(b) and join() issue the upload.
  void updated(int block);
  /// After begin_update(a): runs `step` (the engine's adam_step(a), which must make no MPI call nor
  /// any call on the backend: ShardedOptimizer::step_is_local, with a.regather_later where the
  /// engine regathers()) on the worker (StepBehind::start) and returns at once. Until join() the
  /// engine is the worker's: the caller may go on with the model through this store (params(b) waits
  /// for block b's update), not with the engine. `after` runs on the calling thread once the step is
  /// joined (the trainer clears the engine's gradients there, which the step reads). `regather`
  /// (stages 1-2 over several ranks, the step run with AdamParams::regather_later): called here for
  /// every block the step reports, strictly in its order, before the block is uploaded.
  void update_behind(std::function<void()> step, std::function<void()> after,
                     std::function<void(int block)> regather = {});
  /// Waits for the step behind (nothing when none runs), rethrows its error, issues the uploads it
  /// left, then runs its `after`. Called by the store itself before a gradient goes to the engine
  /// and before settle(), invalidate() and begin_update().
  void join() { behind_.join(); }
  /// A step runs behind (update_behind was called, join() not yet).
  bool updating() const { return behind_.running(); }
  /// The step behind's counters and its test knobs (StepBehind::steps, seconds, slow_for_tests...).
  const StepBehind& step_behind() const { return behind_; }
  StepBehind& step_behind() { return behind_; }
  /// Before each micro-step: `first` starts a step's gradient accumulation, `last` ends it (the
  /// accumulated gradients go to the engine then). Without calls every micro-step is first and last.
  void begin_micro_step(bool first, bool last);
  /// After the model's forward and backward of a micro-step, before the engine's end_micro_step: the
  /// gradients still on their way to the host arrive and go to the engine.
  void end_micro_step();

  const float* params(int block) override;
  /// The device's 16-bit copy of a block params(block) has made ready (cached 16-bit storage);
  /// nullptr otherwise (fp32 storage, stage 3, or a block not yet asked for).
  const uint16_t* params16(int block) override;
  float* grads(int block) override;
  void release(int block) override;
  void grads_ready(int block) override;

  /// High-water mark of the parameter and gradient bytes in the backend's memory (the resident
  /// copy, if any, and the blocks live at once).
  size_t device_bytes() const { return peak_; }
  /// The part of it kept between uses (cache_params): the held blocks' parameters and gradient sum.
  size_t resident_bytes() const { return dparams16_.bytes() + dparams_.bytes() + dgrads_.bytes(); }
  /// Bytes copied host -> device (parameters) and device -> host (gradients) since construction.
  double bytes_to_device() const { return to_device_; }
  double bytes_to_host() const { return to_host_; }
  /// Bytes of the engine's 16-bit parameters pinned for direct uploads (0: every block through slots).
  size_t pinned_bytes() const { return pinned_bytes_; }
  /// Uploads started from the optimizer step (updated), since construction.
  long long uploads_in_step() const { return uploads_in_step_; }

 private:
  /// Host slots per direction: one block being handed over while kSlots - 1 more are under way.
  static constexpr size_t kSlots = 3;
  using Transfer = kernels::OpsBackend::Transfer;
  struct Slot {
    kernels::HostBuffer host;  // page-locked, the largest block's bytes
    Transfer t = 0;            // the transfer that last used it
  };
  struct Pending {  // a block's gradient on its way to the engine (in slot `slot`)
    int block = 0;
    size_t slot = 0;
    Transfer t = 0;
    bool has_values = false;         // false: no gradient this step (the engine's buffer stays zero)
    kernels::BackendBuffer source;   // stage 3: the device gradient, freed once the next one is sent
  };

  model::ParamStore& host_;
  const ParamLayout& layout_;
  kernels::OpsBackend& be_;
  bool half16() const { return storage_ != kernels::Precision::fp32; }
  float* take(std::vector<kernels::BackendBuffer>& blocks, int b);  // allocate block b's buffer if absent
  void give_back(std::vector<kernels::BackendBuffer>& blocks, int b);

  void fold(int b);  // the block's micro-step gradient into the accumulator (stages 0-2)
  void send(int b, const void* dev, size_t bytes, kernels::BackendBuffer source);  // a gradient to the engine
  void finish_oldest();                 // the oldest pending gradient arrives and goes to the engine
  void upload(int b);                   // stages 0-2: block b's parameters towards the device copy
  void upload_ahead(int b);             // the blocks after b in the recorded order, if stale

  void queue_from_step(int b);          // updated()'s upload of a pinned block the step made final
  StepBehind behind_;                   // the step behind (update_behind)

  const bool pipelined_;  // the backend's copies run beside its ops (a device): keep kSlots in flight
  std::vector<Slot> down_, up_;
  size_t next_down_ = 0, next_up_ = 0;
  std::deque<Pending> pending_;
  kernels::BackendBuffer dparams_, dparams16_;  // cache_params: the whole model, fp32 or 16-bit
  kernels::BackendBuffer dgrads_;               // cache_params: the step's gradient sum, fp32 or 16-bit
  std::vector<char> active_;    // per block: its device gradient holds this micro-step's sum
  std::vector<char> summed_;    // per block: the accumulator holds this step's sum so far
  bool last_ = true;
  bool cache_;
  kernels::Precision storage_;
  std::vector<char> fresh_;     // per block: the device copy equals the host's (or its upload is awaited)
  std::vector<char> queued_;    // per block: its upload is queued since the last invalidate()
  std::vector<Transfer> upload_of_;  // per block: that upload
  std::vector<int> order_;      // blocks in the order the first pass asked for them (uploads ahead)
  std::vector<int> order_pos_;  // per block: its index in order_, -1: not in it
  bool order_done_ = false;
  std::vector<char> held_;      // per block: host_.params(b) was taken and not yet released
  std::vector<char> mine_;      // per block: this rank holds it (the host store serves it)
  std::vector<size_t> dev_off_; // per held block: its offset in the device copies (SIZE_MAX: not held)
  size_t dev_numel_ = 0;        // the held blocks' elements: the device copies' length
  size_t at(int b) const;       // dev_off_[b], or an error naming a block this rank does not hold
  std::vector<char> direct_;    // per block: uploaded straight from the engine's pinned 16-bit copy
  std::vector<void*> pins_;     // the runs pinned (unpinned at destruction)
  size_t pinned_bytes_ = 0;
  long long uploads_in_step_ = 0;
  void pin_runs();              // the constructor's: direct_ and pins_ for the engine's 16-bit copies
  std::vector<kernels::BackendBuffer> pblock_, gblock_;  // per block while in use: fp32 parameters, gradients
  size_t live_ = 0, peak_ = 0;
  double to_device_ = 0, to_host_ = 0;
};

}  // namespace hpct::parallel
