// hpct/engine/loop/trainer.hpp — the training loop: data-parallel GPT training with AdamW.
//
// One Trainer per rank. Each optimizer step runs grad_accum micro-batches through the ZeRO engine
// (parallel/zero.hpp), which is the model's ParamStore: it reduces each block's gradients as soon
// as backward finishes that block (all-reduce at stage 0, reduce-scatter into shards at 1-3) and,
// at stage 3, gathers each block's parameters just in time. Then: fp16 overflow check, global
// grad-norm clipping, AdamW on this rank's shard. Progress lines follow Megatron's format; the
// metrics file is JSON lines. Checkpoints: engine/checkpointer.hpp. With --device cuda the model
// computes on the node-local GPU; the states and the optimizer step stay there too
// (parallel::DeviceEngine, stages 0-2), or, with offload_optimizer, a parallel::DeviceStore copies
// each block's parameters to the GPU and its gradients back to the host engine (ZeRO-Offload).
#pragma once
#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hpct/comm/process_grid.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/engine/records/run_records.hpp"
#include "hpct/engine/loop/schedules.hpp"
#include "hpct/engine/config/train_config.hpp"
#include "hpct/io/gpt_dataset.hpp"
#include "hpct/model/gpt.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "hpct/parallel/device_store.hpp"
#include "hpct/parallel/grouped_store.hpp"
#include "hpct/parallel/zero.hpp"

namespace hpct::engine {
namespace detail {
struct PhaseClock;
}

struct StepRecord {
  long long iteration = 0;  // 1-based, after the step
  double lm_loss = 0;
  double grad_norm = 0;
  double learning_rate = 0;
  double loss_scale = 1;
  bool skipped = false;
  long long global_batch = 0;     // the samples this step trained on (--rampup-batch-size: growing)
  int seqlen = 0;                 // the tokens per sample this step trained on (sequence-length warmup)
  long long targets = 0;          // the targets its loss averaged over (global batch; masked ones excluded)
  int ltd_kept = 0;               // random-LTD: tokens per sample its layers kept (= seqlen when none dropped)
  int difficulty = 0;             // curriculum by data metrics: the first metric's difficulty the batch was drawn under
  std::vector<int> difficulties;  // every metric's (TrainConfig::metric_curricula order)
  long long allowed_samples = 0;  // ... and the training samples it allowed
  double moe_loss = NAN;          // MoE models: the load-balancing (and z) loss term of the step
  nlohmann::json moe_layers;      // MoE models: per layer expert load, dropped fraction, aux loss
  // --log-optimizer-states-to-tensorboard: L2 norms after the update (NaN when not computed)
  double weight_l2 = NAN, momentum_l2 = NAN, variance_l2 = NAN;
  // --log-num-zeros-in-grad: zero elements of the reduced gradient (NaN when not counted: a skipped step)
  double num_zeros = NAN;
};

struct TrainSummary {
  std::vector<StepRecord> steps;
  std::vector<std::pair<long long, double>> val_losses;  // (iteration, loss)
  double seconds = 0;
  double tokens_per_second = 0;
  // A backend with a stream of its own (--device cuda): this rank's device milliseconds per trained
  // iteration (CUDA events): forward, backward, optimizer, idle, step (train_log.hpp). Empty elsewhere.
  std::vector<double> device_ms;
  uint64_t peak_rss_bytes = 0;            // max over ranks
  std::vector<double> peak_rss_per_rank;  // bytes, index = world rank
  long long skipped_iterations = 0;
  long long start_iteration = 0;       // > 0 when resumed from a checkpoint
  long long last_iteration = 0;        // the iteration training stopped after
  // "completed", "exit_interval", "exit_duration", "signal", "train_tokens", "skip_train", or
  // "already_complete" (the loaded checkpoint had reached --train-iters / --train-tokens: no step)
  std::string exit_reason = "completed";
  std::vector<std::string> saved;      // checkpoint files written, in order
  struct Save {
    long long iteration = 0;
    bool async = false;
    double stall_seconds = 0;  // training stood still this long (sync: the whole save)
    double seconds = 0;        // from the start of the save to the file published
    double bytes = 0;
  };
  std::vector<Save> saves;
};

/// Installs SIGUSR1/SIGTERM handlers that ask a training run to save and stop at the next
/// iteration boundary (how a Slurm job survives its time limit). Returns the documented exit code
/// an app uses after such a stop.
int install_save_on_signal_handlers();
inline constexpr int kExitSavedOnSignal = 75;  // EX_TEMPFAIL: saved; requeue and resume with --load

class Trainer {
 public:
  /// Collectives over one data-parallel group on the model backend's memory (called collectively
  /// over that group).
  using DeviceCollectivesFactory = std::function<std::unique_ptr<comm::DeviceCollectives>(const comm::Communicator& group)>;
  /// Collective over grid's world: builds the model and initialises parameters identically everywhere.
  /// backend: the model's backend in place of the one --device names (tests: a CPU backend whose
  /// memory counts as a device's, so the device paths run where there is no GPU); nullptr: --device's.
  /// dp_collectives: the GPU-resident engine's data-parallel collectives (tests: a transport on that
  /// backend's memory); empty: NCCL where every rank of a --device cuda job has a GPU of its own.
  Trainer(const TrainConfig& cfg, const comm::ProcessGrid& grid, std::unique_ptr<kernels::OpsBackend> backend = nullptr,
          DeviceCollectivesFactory dp_collectives = {});
  ~Trainer();

  /// Collective over the world. If cfg.load_path names a checkpoint (a file, or a directory with a
  /// `latest`), loads it and training continues from its iteration. Returns the file loaded, or ""
  /// for a fresh start (a --load directory without a checkpoint yet, e.g. the first job of a chain).
  std::string load_checkpoint();
  /// --finetune-resume-optimizer: file's weights and optimizer states (Adam moments, loss scale),
  /// at any layout, as load_checkpoint reads them; the iteration, samples, schedule and data order
  /// start afresh, and Adam's bias correction continues from the file's step count. Collective.
  void load_for_finetune(const std::string& file);
  /// Replaces the parameters with `full` (the whole model in layout() order: a finetuning start),
  /// each rank keeping what it holds; optimizer state and counters are untouched (fresh).
  void load_weights(const std::vector<float>& full);
  /// Collective over the world: saves the current state into cfg.save_dir (atomic). Returns the file.
  std::string save_checkpoint();
  /// Collective: starts an asynchronous save; a previous one is finished first. The file and its
  /// datasets are created at once (collective); a background thread then copies the state to host
  /// memory and writes it. The state does not change until the next optimizer step, so the copy
  /// overlaps the next forward and backward, and that step waits for it (snapshot_fence). State
  /// that lives in a swap file (NVMe offload) is copied here instead, before returning.
  void start_async_save();
  /// Collective: finishes a pending asynchronous save when every rank has written its part (or,
  /// with wait, after waiting for them). Returns the record of the save finished, if any.
  bool finish_async_save(bool wait, TrainSummary::Save* done = nullptr, std::string* file = nullptr);
  long long iteration() const { return iteration_; }
  /// Training tokens consumed so far (sequence-length warmup: at the truncated lengths), checkpointed.
  long long consumed_tokens() const { return consumed_tokens_; }
  /// Layer-tokens consumed so far: tokens x layers, less what random-LTD dropped (DeepSpeed's
  /// consumed_layer_tokens), checkpointed.
  long long consumed_layer_tokens() const { return consumed_layer_tokens_; }

  /// Collective over the world. Trains up to cfg.train_iters steps (from the loaded iteration);
  /// saves every save_interval, at exit_interval, at the end, and on SIGUSR1/SIGTERM when --save is
  /// set. valid may be null (no evaluation). With cfg.skip_train it only evaluates (Megatron's
  /// --skip-train). Log-interval, evaluation and per-iteration records go to `records` when given
  /// (its segment begun by the caller); the phase timers are always kept (docs/run-records.md).
  TrainSummary train(const io::TokenDataset& train, const io::TokenDataset* valid, RunRecorder* records = nullptr);
  /// Checks and opens what training on `train` needs beyond the model (a data-metric curriculum's
  /// index files, against train's samples); throws naming the file. Every rank alike, so an app
  /// calls it during its set-up; train() does it itself otherwise.
  void prepare(const io::TokenDataset& train) {
    if (!cfg_.metric_curricula.empty() && !sampler_) start_sampler(train);
  }
  /// Collective: mean token loss over eval_iters global batches of `data` from sample 0.
  double evaluate(const io::TokenDataset& data);

  const model::Gpt& model() const { return *model_; }
  /// How the tensor-parallel collectives of a --device cuda run go ("" on the CPU or without tensor
  /// parallelism): NCCL on device buffers, or host buffers and why.
  const std::string& tp_collectives() const { return tp_collectives_; }
  /// GPU-resident runs over more than one rank: how the data-parallel gradients and parameters
  /// travel ("NCCL on device buffers", or MPI and why); "" otherwise.
  const std::string& dp_collectives() const { return dp_collectives_; }
  /// The model's attention kernel for its micro-batch, in words (the backend's choice).
  const std::string& attention_kernel() const { return attention_kernel_; }
  /// What checkpoints store: the model's trained tensors (ParamLayout::trained(): without LoRA's
  /// frozen base, every tensor).
  const ParamLayout& stored_layout() const { return stored_; }
  /// Collective: this rank's flat parameters in model().layout() (gathered from the shards at ZeRO
  /// stage 3; with tensor parallelism, this rank's parts).
  std::vector<float> gather_params() {
    join_update();
    return zero_->gather_params();
  }
  /// Collective over the world: every tensor whole (tensor-parallel parts assembled), in layout
  /// order, each of its full shape's size: what a T = 1 run's gather_params() holds. Tests, export.
  std::vector<float> gather_full_params();
  const parallel::GroupedStore& zero() const { return *zero_; }
  /// ZeRO-Offload's bridge to the GPU model (--device cuda), nullptr on the CPU backend.
  const parallel::DeviceStore* device_store() const { return device_store_.get(); }
  parallel::DeviceStore* device_store() { return device_store_.get(); }
  /// ZeRO-Offload on a device: "" where the host AdamW runs beside the next step's forward, else
  /// why it does not (said on the start line). Meaningless without a DeviceStore.
  const std::string& optimizer_overlap_off() const { return overlap_off_; }
  parallel::GroupedStore& zero() { return *zero_; }
  /// Bytes this rank holds of parameters, gradients and optimizer states (all on the host here),
  /// the ZeRO working buffers' high-water mark, and activations. frozen: the parameters that do not
  /// train (LoRA's base), apart from `params` (the trained ones).
  struct MemoryReport {
    size_t params = 0, grads = 0, optimizer = 0, grad_shard = 0, working_peak = 0, activations = 0, frozen = 0;
    // --device cuda: parameter and gradient bytes in GPU memory, the high-water mark of the resident
    // copy (stages 0-2) and the blocks in use (parallel::DeviceStore); the activations above are
    // then GPU memory too. 0 on the CPU backend.
    size_t device_params_grads = 0;
    // The model states above are in the GPU's memory (GPU-resident ZeRO, parallel::DeviceEngine).
    bool states_on_device = false;
    size_t nvme_params = 0, nvme_optimizer = 0, nvme_file = 0;  // in this rank's swap file (ZeRO offload)
  };
  MemoryReport memory_report() const;
  /// Bytes this rank sent in collectives per optimizer step, averaged over the steps trained so far.
  double comm_bytes_per_step() const { return comm_steps_ ? comm_bytes_ / comm_steps_ : 0; }
  /// Payload bytes of the tensor-parallel all-reduces (f and g) per optimizer step, averaged the same way.
  double tp_bytes_per_step() const { return comm_steps_ ? tp_bytes_ / comm_steps_ : 0; }
  /// Of those, the bytes a ring moves per rank (TensorParallel::activation_wire_bytes).
  double tp_wire_bytes_per_step() const { return comm_steps_ ? tp_wire_bytes_ / comm_steps_ : 0; }

 private:
  double step(const io::TokenDataset& data, long long iteration, StepRecord& rec);
  void update(StepRecord& rec, double loss_sum, double scale, long long iteration);  // the step after its micro-steps
  /// Layer-tokens iteration `it` consumes: global batch x (its length x layers), less what random-LTD drops.
  long long step_layer_tokens(long long it) const;
  /// What token-based learning-rate schedules count, from a layer-token count: tokens (with
  /// random-LTD, Megatron-DS's effective tokens = layer-tokens / layers), or layer-tokens under
  /// random-LTD's layer-token schedule.
  double schedule_tokens(long long layer_tokens) const;
  /// Fills tokens_/targets_ (micro_batch, T) with samples first_sample .. first_sample+micro_batch-1.
  /// The micro-batch's samples truncated to T tokens (and their T next-token targets), packed (mb, T).
  /// ids: the dataset samples of the global batch from first_sample on (a metric curriculum's
  /// sampler), or null for samples first_sample, first_sample + 1, ... in order.
  /// A target the dataset masks out (get_loss_mask) becomes -1: it adds nothing to loss or gradient.
  void load_micro_batch(const io::TokenDataset& data, long long first_sample, int T, const int64_t* ids = nullptr);
  /// The targets that count in the global batch of `iteration` (ids as load_micro_batch's), summed
  /// over the data-parallel ranks: GB*T unless the dataset masks some. The loss is their mean.
  long long counted_targets(const io::TokenDataset& data, long long iteration, int T, const int64_t* batch_ids);
  /// Curriculum by a data metric: the sampler over `data`'s samples (built on the first step).
  void start_sampler(const io::TokenDataset& data);
  std::unique_ptr<CurriculumSampler> sampler_;
  kernels::Precision compute_precision() const;
  CheckpointMeta checkpoint_meta() const;
  /// This rank's pieces of the stored tensors, in stored_layout()'s flat indices.
  void visit_stored(bool load, const std::function<void(const parallel::StatePiece&)>& fn);
  void init_stored_layout();  // stored_ and stored_at_ from the model's layout
  ParamLayout stored_;
  std::vector<size_t> stored_at_;  // per model block: its offset in stored_ (trained blocks only)
  std::string lora_base_;          // LoRA: the fingerprint of the base weights loaded ("" : initialised)

  TrainConfig cfg_;
  const comm::ProcessGrid& grid_;
  std::unique_ptr<kernels::OpsBackend> ops_;  // --device cuda: the GPU backend (declared before the model)
  std::unique_ptr<comm::NcclComm> tp_nccl_;   // tensor parallelism on GPUs of their own (before the model too)
  std::string tp_collectives_;
  DeviceCollectivesFactory dp_factory_;                       // tests' data-parallel transport
  std::vector<std::unique_ptr<comm::DeviceCollectives>> dp_dc_;  // per engine group (before zero_: outlives it)
  std::string dp_collectives_;
  std::string attention_kernel_;
  std::unique_ptr<model::Gpt> model_;
  std::unique_ptr<parallel::GroupedStore> zero_;  // one ZeRO engine per reducing group
  std::unique_ptr<parallel::DeviceStore> device_store_;  // ZeRO-Offload: in front of zero_
  /// What the model reads parameters from and writes gradients to.
  model::ParamStore& store() { return device_store_ ? static_cast<model::ParamStore&>(*device_store_) : *zero_; }
  struct AsyncSave;
  std::unique_ptr<AsyncSave> async_;
  // --async-save: the copy of this rank's state a background save writes. Mapped and populated at
  // start (MAP_POPULATE: ~1 s for 2 GB here, against ~7 s of page faults inside the first save's
  // copy on a pinned core), so every save's stall is a warm copy.
  float* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  void map_staging();
  void setup_tp_collectives();  // tp_nccl_ and tp_collectives_ (a --device cuda run with T > 1)
  /// Collective over the world: every rank of a --device cuda job has a GPU of its own (else why).
  bool own_gpus(std::string* why) const;
  /// Collective over group: its device collectives for the resident engine (nullptr: MPI, and why).
  comm::DeviceCollectives* open_dp_collectives(const comm::Communicator& group, bool own, std::string* why);
  std::string describe_dp_collectives(const comm::DeviceCollectives& dc) const;
  void choose_attention_kernel();  // attention_kernel_, and --attention-kernel fused's check
  void check_device_fits();        // a device run: the pre-flight memory check (preflight.hpp), every rank
  void setup_host_threads();    // the host AdamW's threads (--optimizer-threads, the environment)
  /// Before the state changes (the optimizer step): waits until a background save's copy is done.
  void snapshot_fence();
  /// Before anything but the next step reads or writes the engine's state: the optimizer step
  /// running behind the forward (DeviceStore::update_behind) is done. Between steps: the
  /// re-gathers it makes here count in the step's traffic (comm_bytes_per_step).
  void join_update() {
    if (!device_store_ || !device_store_->updating()) return;
    const double sent0 = zero_->bytes_sent();
    device_store_->join();
    comm_bytes_ += zero_->bytes_sent() - sent0;
  }
  void join_update_timed();  // join_update(), its time in the phase timers (optimizer, and the level-2 ones)
  std::string overlap_off_;  // optimizer_overlap_off()
  void decide_optimizer_overlap();  // overlap_off_, once the engines and the DeviceStore exist
  TrainingState training_state() const;
  /// Collective: file's tensors (weights and optimizer states) into the store, checked against meta.
  /// fresh_moments: the file's Adam moments are replaced by zeros as they are loaded (--no-load-optim).
  TrainingState read_checkpoint(const std::string& file, const CheckpointMeta& meta, bool fresh_moments = false);
  double comm_bytes_ = 0, tp_bytes_ = 0, tp_wire_bytes_ = 0;
  long long comm_steps_ = 0;
  LossScaler scaler_;
  long long adam_step_ = 0;
  long long adam_base_ = 0;          // Adam steps the moments took before this run (--finetune-resume-optimizer)
  long long iteration_ = 0;          // optimizer steps taken, including skipped ones
  long long sample_base_ = 0;        // consumed samples - the batches' (the global batch changed at a resume)
  BatchSchedule batches_;            // each iteration's global batch (--rampup-batch-size)
  /// The run's index of iteration's first sample: the samples consumed before it.
  long long first_sample(long long iteration) const { return sample_base_ + batches_.consumed_before(iteration); }
  long long consumed_tokens_ = 0;    // training tokens so far (sequence-length warmup: the truncated lengths)
  long long consumed_layer_tokens_ = 0;  // their layer-tokens (random-LTD: kept tokens in its layers)
  TrainConfig lr_cfg_;               // cfg_ with random-LTD's layer-token schedule as the token schedule
  double warmup_end_tokens_ = 0;     // tokens of the --lr-warmup-iters steps (token-based decay starts there)
  long long skipped_ = 0, nan_iters_ = 0;
  std::unique_ptr<detail::PhaseClock> clock_;
  std::array<double, 5> device_run_seconds_{};  // the device phases (train_log.hpp), summed over the run
  bool want_state_norms_ = false;  // this step also reports the optimizer states' norms  // this rank's phase times since the last log line
  std::vector<int32_t> sample_buf_, tokens_, targets_;
  std::vector<uint8_t> mask_buf_;
};

/// Megatron's log line for one interval (printed by rank 0).
std::string format_log_line(long long iteration, long long train_iters, long long consumed_samples,
                            long long consumed_tokens, double ms_per_iter, double lr, int global_batch, double loss,
                            double loss_scale, double grad_norm, long long skipped, long long nan_iters,
                            double tokens_per_sec, double tokens_per_sec_per_rank, double tflops_per_rank,
                            double moe_loss = NAN, int curriculum_seqlen = -1, int ltd_reserved = -1,
                            int actual_seqlen = -1, double params_norm = NAN, double num_zeros = NAN);

}  // namespace hpct::engine
