// The training loop. See trainer.hpp.
#include "hpct/engine/loop/trainer.hpp"

#include "trainer_async.hpp"
#include "train_log.hpp"

#include "hpct/engine/config/preflight.hpp"

#include <sys/mman.h>
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <algorithm>
#include <thread>

#include <csignal>
#include <cmath>
#include <iomanip>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "hpct/comm/deadline.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/core/sysinfo.hpp"
#include "hpct/core/timer.hpp"
#include "hpct/core/units.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/engine/records/moe_stats.hpp"
#include "hpct/parallel/device_engine.hpp"

namespace hpct::engine {

using detail::PhaseClock;

Trainer::Trainer(const TrainConfig& cfg, const comm::ProcessGrid& grid, std::unique_ptr<kernels::OpsBackend> backend,
                 DeviceCollectivesFactory dp_collectives)
    : cfg_(cfg), grid_(grid), ops_(std::move(backend)), dp_factory_(std::move(dp_collectives)),
      batches_(cfg.global_batch, (long long)cfg.micro_batch * grid.dp().size(), cfg.rampup),
      clock_(std::make_unique<PhaseClock>()) {
  setup_host_threads();
  if (!ops_ && cfg_.device == "cuda") {
    // One GPU per rank, picked by the node-local rank (modulo the GPUs seen). Taking it can fail on
    // one rank only (a busy exclusive-mode GPU, no memory), so every rank learns of it and stops.
    const auto& world = comm::Communicator::world();
    const int local = world.node_local_rank();
    comm::throw_if_any(world, comm::error_text_of([&] { ops_ = kernels::cuda_ops(local); }));
  }
  if (ops_) ops_->allow_fused_attention(cfg_.attention_kernel != "plain");
  const int ep = grid_.ep().size();
  if (grid_.tp().size() != cfg_.model.tensor_parallel)
    throw config_error("--tensor-model-parallel-size", "the process grid's tensor-parallel size " + std::to_string(grid_.tp().size()) +
                                                           " differs from --tensor-model-parallel-size " +
                                                           std::to_string(cfg_.model.tensor_parallel));
  model_ = std::make_unique<model::Gpt>(cfg_.model, compute_precision(), cfg_.recompute_activations, ops_.get(),
                                        ep > 1 ? &grid_.ep() : nullptr, grid_.tp().size() > 1 ? &grid_.tp() : nullptr);
  if (ops_ && grid_.tp().size() > 1) setup_tp_collectives();
  model_->set_communication_aware_checkpointing(cfg_.communication_aware_checkpointing);
  if (cfg_.random_ltd.enabled) model_->set_random_ltd_layers(cfg_.random_ltd.layers(cfg_.model.num_layers));
  // Sequence-length warmup (and random-LTD): the full length's activations now, for every shorter step.
  if (cfg_.curriculum.enabled || cfg_.random_ltd.enabled) model_->reserve(cfg_.micro_batch, cfg_.model.max_seq_length);
  comm::throw_if_any(grid_.world(), comm::error_text_of([&] { choose_attention_kernel(); }));
  check_device_fits();
  // Dense blocks are reduced over the dense data-parallel group; this rank's experts over the ranks
  // that hold the same experts. A dense model has one group: one engine over the whole layout.
  // With tensor parallelism the layout is this rank's parts and both groups keep its tp index.
  const ParamLayout& schema = model_->layout();
  std::vector<parallel::StoreGroup> groups;
  // Swap files are named per rank and engine on a node: tensor-parallel ranks share dp indices.
  const std::string tp_tag = grid_.tp().size() > 1 ? ".tp" + std::to_string(grid_.tp().rank()) : "";
  std::vector<int> dense, frozen;  // LoRA: the base's blocks are frozen, held whole without an engine
  for (int b : schema.blocks_of(ReduceGroup::dense)) (schema.blocks()[b].trains ? dense : frozen).push_back(b);
  groups.push_back({ReduceGroup::dense, dense, &grid_.dp(),
                    tp_tag.empty() ? "" : "zero" + tp_tag + ".dp" + std::to_string(grid_.dp().rank())});
  if (!frozen.empty()) groups.push_back({ReduceGroup::dense, frozen, nullptr, "", /*frozen=*/true});
  std::vector<int> experts;
  for (int b : model_->held_blocks())
    if (schema.blocks()[b].group == ReduceGroup::expert) experts.push_back(b);
  if (!experts.empty())
    groups.push_back({ReduceGroup::expert, experts, &grid_.expert_dp(),
                      "zero.expert" + tp_tag + ".ep" + std::to_string(grid_.ep().rank()) + ".dp" +
                          std::to_string(grid_.expert_dp().rank())});
  // GPU-resident (DeepSpeed's default on GPUs): each group's states in the model backend's memory.
  // Its collectives on device buffers (NCCL) where every rank has a GPU of its own.
  parallel::EngineFactory resident;
  std::string own_why;
  const bool own = cfg_.states_on_device() && own_gpus(&own_why);
  if (cfg_.states_on_device())
    resident = [this, own, own_why](const ParamLayout& layout, const parallel::StoreGroup& g) {
      std::string why = own_why;
      comm::DeviceCollectives* dc = open_dp_collectives(*g.comm, own, &why);
      if (g.comm->size() > 1 && dp_collectives_.empty())
        dp_collectives_ = !dc ? "MPI through host buffers (" + why + ")" : describe_dp_collectives(*dc);
      return std::make_unique<parallel::DeviceEngine>(layout, cfg_.zero, *g.comm, compute_precision(), model_->ops(), dc);
    };
  // A rank whose GPU cannot hold its states fails at its allocations, which are not collective:
  // every rank learns of it and stops, rather than wait in the first collective for that rank.
  comm::throw_if_any(grid_.world(), comm::error_text_of([&] {
    // LoRA's frozen base sits where the states do: on the GPU beside the resident engine.
    zero_ = std::make_unique<parallel::GroupedStore>(schema, std::move(groups), cfg_.zero, compute_precision(),
                                                     &grid_.ep(), &grid_.tp(), resident,
                                                     cfg_.states_on_device() ? &model_->ops() : nullptr);
  }));
  if ((ops_ && !cfg_.states_on_device()) || cfg_.via_device_store)
    device_store_ = std::make_unique<parallel::DeviceStore>(
        *zero_, model_->layout(), model_->ops(), /*cache_params=*/cfg_.zero.stage <= 2,
        zero_->half() ? compute_precision() : kernels::Precision::fp32,  // 16-bit runs: 2-byte device copies
        model_->held_blocks());
  decide_optimizer_overlap();
  // Every rank initialises from the same seed, block by block, keeping what it holds: replicas
  // (and shards) are consistent without a broadcast.
  zero_->init_params([&](int block, float* dst) { model_->init_block(block, dst, cfg_.seed); });
  init_stored_layout();
  if (cfg_.async_save && !cfg_.save_dir.empty()) map_staging();
  scaler_ = LossScaler(cfg_.loss_scale, cfg_.precision == PrecisionMode::fp16);
  const int T = cfg_.model.max_seq_length;
  // Step-based warmup with token-based decay: the decay starts from the tokens of the warmup's
  // steps (Megatron-DeepSpeed records them when the warmup ends; here they follow from the schedule).
  for (long long it = 0; it < cfg_.lr_warmup_iters; ++it)
    warmup_end_tokens_ += schedule_tokens(step_layer_tokens(it));
  // random-LTD's layer-token schedule: Megatron's token warmup and decay, counted in layer-tokens.
  lr_cfg_ = cfg_;
  if (cfg_.random_ltd.layer_token_lr) {
    lr_cfg_.lr_warmup_tokens = cfg_.random_ltd.warmup_layer_tokens;
    lr_cfg_.lr_decay_tokens = cfg_.random_ltd.total_layer_tokens;
  }
  sample_buf_.resize(T + 1);
  tokens_.resize((size_t)cfg_.micro_batch * T);
  targets_.resize((size_t)cfg_.micro_batch * T);
  mask_buf_.resize(T);
}

std::vector<float> Trainer::gather_full_params() {
  std::vector<float> local = gather_params();  // (after the step behind, if one runs)
  if (grid_.tp().size() == 1) return local;
  const auto& tensors = model_->layout().tensors();
  std::vector<size_t> at;  // each tensor's offset in the full flat buffer
  size_t total = 0;
  for (const auto& t : tensors) at.push_back(total), total += t.full_numel();
  std::vector<float> full(total, 0.0f);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    if (!t.primary()) continue;  // a replica comes from its primary copy's rank
    t.for_full_runs(0, t.numel, [&](uint64_t f, uint64_t l, uint64_t n) {
      std::copy_n(local.begin() + t.offset + l, n, full.begin() + at[i] + f);
    });
  }
  grid_.tp().allreduce_sum(full.data(), full.size());  // each element is nonzero on one rank only
  return full;
}

kernels::Precision Trainer::compute_precision() const {
  switch (cfg_.precision) {
    case PrecisionMode::bf16: return kernels::Precision::bf16;
    case PrecisionMode::fp16: return kernels::Precision::fp16;
    default: return kernels::Precision::fp32;
  }
}

Trainer::MemoryReport Trainer::memory_report() const {
  MemoryReport r;
  auto z = zero_->memory();
  r.params = z.params;
  r.grads = z.grads;
  r.optimizer = z.optimizer;
  r.frozen = z.frozen;
  r.grad_shard = z.grad_shard;
  r.working_peak = z.working_peak;
  r.nvme_params = z.nvme_params;
  r.nvme_optimizer = z.nvme_optimizer;
  r.nvme_file = z.nvme_file;
  r.activations = model_->activation_bytes();
  if (ops_ && device_store_) r.device_params_grads = device_store_->device_bytes();
  r.states_on_device = z.on_device;
  return r;
}

long long Trainer::step_layer_tokens(long long it) const {
  const int T = cfg_.curriculum.seqlen(it, cfg_.model.max_seq_length);
  return cfg_.random_ltd.step_layer_tokens(it, T, cfg_.model.num_layers, batches_.batch_of(it));
}

double Trainer::schedule_tokens(long long layer_tokens) const {
  if (cfg_.random_ltd.layer_token_lr) return double(layer_tokens);
  return double(layer_tokens) / cfg_.model.num_layers;  // tokens (random-LTD: Megatron-DS's effective tokens)
}

double Trainer::step(const io::TokenDataset& data, long long iteration, StepRecord& rec) {
  // Sequence-length warmup: this step's samples are truncated to the scheduled length.
  const int T = cfg_.curriculum.seqlen(iteration, cfg_.model.max_seq_length);
  const int mb = cfg_.micro_batch, dp = grid_.dp().size(), r = grid_.dp().rank();
  rec.seqlen = T;
  rec.ltd_kept = cfg_.random_ltd.kept(iteration, T);  // random-LTD: tokens per sample its layers keep
  // Curriculum by a data metric: the global batch's samples come from the sampler.
  prepare(data);
  const int64_t* batch_ids = sampler_ ? sampler_->batch(iteration).data() : nullptr;
  if (sampler_) {
    rec.difficulties = sampler_->difficulties(iteration);
    rec.difficulty = rec.difficulties[0], rec.allowed_samples = (long long)sampler_->allowed();
  }
  const long long GB = batches_.batch_of(iteration), base = first_sample(iteration);
  const int micro_steps = batches_.micro_steps(iteration);
  rec.global_batch = GB;
  const double scale = scaler_.scale();
  rec.targets = counted_targets(data, iteration, T, batch_ids);
  const float dloss = static_cast<float>(scale / double(rec.targets));  // mean over the global batch's targets
  const double sent0 = zero_->bytes_sent(), tp0 = model_->tensor_parallel().activation_bytes();
  const double tpw0 = model_->tensor_parallel().activation_wire_bytes();
  // Phase timers: the model times its halves, the ZeRO engines their waits, the swap its IO.
  PhaseClock& clk = *clock_;
  const model::Gpt::PhaseSeconds ph0 = model_->phase_seconds();
  const double gather0 = zero_->gather_wait_seconds(), reduce0 = zero_->reduce_wait_seconds();
  const auto nvme_seconds = [&] {
    const parallel::SwapTraffic tr = zero_->swap_traffic();
    return tr.optimizer_seconds - tr.optimizer_seconds_behind + tr.param_read_seconds;  // this thread's
  };
  const double nvme0 = nvme_seconds();
  const double behind0 = device_store_ ? device_store_->step_behind().seconds() : 0;
  const double behind_wait0 = device_store_ ? device_store_->step_behind().wait_seconds() : 0;
  // A step behind the forward clears the gradients once it is done (its `after`), not now.
  if (!device_store_ || !device_store_->updating()) zero_->begin_step();
  model_->clear_marks();
  detail::StepMarks marks;
  marks.start = model_->ops().mark();  // device time, read once a log interval (train_log.hpp)
  double loss_sum = 0;
  Timer t;
  for (int m = 0; m < micro_steps; ++m) {
    // Sample order is a function of (iteration, micro-step, dp rank) only: N ranks with k micro-steps
    // see exactly the samples one rank sees with N*k micro-steps.
    const long long first = base + ((long long)m * dp + r) * mb;
    t.reset();
    load_micro_batch(data, first, T, batch_ids ? batch_ids + (first - base) : nullptr);
    clk.seconds[detail::kData] += t.seconds();
    zero_->begin_micro_step(m == micro_steps - 1);
    if (device_store_) device_store_->begin_micro_step(m == 0, m == micro_steps - 1);
    model_->set_routing_seed(mix_seed(cfg_.seed, static_cast<uint64_t>(first), 0x726f757465));
    model_->set_kept_tokens(rec.ltd_kept, mix_seed(cfg_.seed, 0x6c7464), first);
    model_->set_dropout_seed(mix_seed(cfg_.seed, 0x64726f70), first);
    loss_sum += model_->forward_backward(store(), tokens_.data(), targets_.data(), mb, T, dloss);
    t.reset();
    if (device_store_) device_store_->end_micro_step();  // the gradients still on their way to the host
    zero_->end_micro_step();
    clk.seconds[detail::kGradReduce] += t.seconds();
  }
  t.reset();
  if (device_store_) device_store_->join();  // done at the first gradient handed over already; here for a step that handed none
  update(rec, loss_sum, scale, iteration);  // everything after the last micro-step is the optimizer's
  clk.seconds[detail::kOptimizer] += t.seconds();
  marks.end = model_->ops().mark();
  marks.passes = model_->marks();
  if (marks.start >= 0) clk.pending.push_back(std::move(marks));
  const model::Gpt::PhaseSeconds ph1 = model_->phase_seconds();
  clk.seconds[detail::kForward] += ph1.forward - ph0.forward;
  clk.seconds[detail::kBackward] += ph1.backward - ph0.backward;
  clk.seconds[detail::kGatherWait] += zero_->gather_wait_seconds() - gather0;
  clk.seconds[detail::kReduceWait] += zero_->reduce_wait_seconds() - reduce0;
  clk.seconds[detail::kNvme] += nvme_seconds() - nvme0;
  if (device_store_) {
    clk.seconds[detail::kOptimizerBehind] += device_store_->step_behind().seconds() - behind0;
    clk.seconds[detail::kOptimizerWait] += device_store_->step_behind().wait_seconds() - behind_wait0;
  }
  comm_bytes_ += zero_->bytes_sent() - sent0;
  consumed_tokens_ += GB * T;
  consumed_layer_tokens_ += step_layer_tokens(iteration);
  tp_bytes_ += model_->tensor_parallel().activation_bytes() - tp0;
  tp_wire_bytes_ += model_->tensor_parallel().activation_wire_bytes() - tpw0;
  ++comm_steps_;
  return rec.lm_loss;
}

void Trainer::start_sampler(const io::TokenDataset& data) {
  if (sample_base_ != 0)
    throw config_error("--global-batch-size", "the global batch changed at the resume, which the data-metric curriculum "
                                              "cannot replay (its batches are drawn per iteration)",
                       "resume with the global batch the run started with");
  sampler_ = open_curriculum_sampler(cfg_.metric_curricula, data.size(), cfg_.model.max_seq_length, cfg_.seed, cfg_.split,
                                     cfg_.global_batch, cfg_.data_path.size() == 1 ? cfg_.data_path[0] : "");
}

namespace {
volatile std::sig_atomic_t g_stop_flag = 0;
extern "C" void hpct_on_stop_signal(int) { g_stop_flag = 1; }

}  // namespace

int install_save_on_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = hpct_on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return kExitSavedOnSignal;
}

TrainSummary Trainer::train(const io::TokenDataset& train, const io::TokenDataset* valid, RunRecorder* records) {
  const bool root = grid_.world_rank() == 0;
  const int world = grid_.world_size();
  const RunRecordsConfig& rc = cfg_.records;
  TrainSummary sum;
  Timer total, interval;
  double excluded = 0;  // seconds of the interval spent evaluating and saving: not training throughput
  double loss_acc = 0;
  int n_acc = 0, n_steps_in_interval = 0;
  long long& skipped = skipped_;
  long long& nan_iters = nan_iters_;
  // Tokens and model FLOPs of the interval's steps at their real lengths (sequence-length warmup).
  double interval_tokens = 0, interval_flops = 0;
  // The learning rate of each step of the interval: the log line shows only the last, and a plot
  // of every iteration cannot rebuild the rest from the config (skipped fp16 steps, tokens under
  // seqlen warmup or random-LTD, batch ramp-up and DeepSpeed's schedules all move it).
  std::vector<double> interval_lrs;
  const long long tokens_at_start = consumed_tokens_;
  const bool saving = !cfg_.save_dir.empty();
  if (saving) install_save_on_signal_handlers();
  sum.start_iteration = iteration_;
  long long it = iteration_;
  auto run_evaluation = [&](long long at) {
    double vl = evaluate(*valid);  // (it joins the step behind first)
    sum.val_losses.emplace_back(at, vl);
    if (root) {
      char buf[256];
      std::snprintf(buf, sizeof buf, " validation loss at iteration %lld | lm loss value: %.6E | lm loss PPL: %.6E |",
                    at, vl, std::exp(vl));
      std::string line(std::strlen(buf), '-');
      std::cout << line << "\n" << buf << "\n" << line << std::endl;
    }
    if (records) {
      std::vector<Scalar> sc = {{"lm-loss-validation/lm loss validation", vl, at}};
      if (rc.log_validation_ppl) sc.push_back({"lm-loss-validation/lm loss validation ppl", std::exp(vl), at});
      records->record({{"type", "eval"}, {"iteration", at}, {"val_loss", vl}, {"val_ppl", std::exp(vl)}}, sc);
    }
  };
  // A run restarted after it finished (its checkpoint reached --train-iters or --train-tokens, e.g. a
  // requeued job) trains no step and saves nothing.
  const bool tokens_reached = cfg_.train_tokens > 0 && consumed_layer_tokens_ >= cfg_.train_tokens * cfg_.model.num_layers;
  const bool finished = !cfg_.skip_train && (it >= cfg_.train_iters || tokens_reached);
  if (finished && root)
    std::cout << "> nothing to train: the loaded checkpoint (iteration " << it << ") has reached "
              << (tokens_reached ? "--train-tokens " + std::to_string(cfg_.train_tokens)
                                 : "--train-iters " + std::to_string(cfg_.train_iters))
              << std::endl;
  if (cfg_.skip_train || finished) {  // Megatron's --skip-train: evaluate the loaded model and stop
    if (cfg_.skip_train && valid && cfg_.eval_iters > 0) run_evaluation(it);
    it = iteration_;
    sum.exit_reason = cfg_.skip_train ? "skip_train" : "already_complete";
    sum.start_iteration = sum.last_iteration = it;
    sum.seconds = total.seconds();
    sum.peak_rss_per_rank = grid_.world().allgather((double)peak_rss_bytes());
    for (double v : sum.peak_rss_per_rank) sum.peak_rss_bytes = std::max<uint64_t>(sum.peak_rss_bytes, (uint64_t)v);
    return sum;
  }
  clock_->clear();
  for (; it < cfg_.train_iters; ++it) {
    StepRecord rec;
    want_state_norms_ = (records && rc.log_optimizer_states && (rc.enabled() || !cfg_.metrics_file.empty()) &&
                         (it + 1) % rc.tensorboard_log_interval == 0) ||
                        (rc.log_params_norm && (it + 1) % cfg_.log_interval == 0);  // the log line's params norm
    step(train, it, rec);
    rec.iteration = it + 1;
    iteration_ = it + 1;
    if (rec.skipped) ++skipped;
    if (!std::isfinite(rec.lm_loss)) ++nan_iters;
    else {
      loss_acc += rec.lm_loss;
      ++n_acc;
    }
    ++n_steps_in_interval;
    interval_lrs.push_back(rec.learning_rate);
    interval_tokens += double(rec.global_batch) * rec.seqlen;
    interval_flops += model_->flops_per_iteration(rec.global_batch, rec.seqlen, rec.ltd_kept);
    // --train-tokens: this is the last step once that many tokens are consumed (Megatron-DeepSpeed).
    // (random-LTD: Megatron-DS's effective tokens, layer-tokens / layers; the same count without it)
    const bool tokens_done = cfg_.train_tokens > 0 && consumed_layer_tokens_ >= cfg_.train_tokens * cfg_.model.num_layers;
    const bool final_step = it + 1 == cfg_.train_iters || tokens_done;
    if (final_step) join_update_timed();  // the last step's update counts in its own log line
    sum.steps.push_back(rec);
    if (records) records->iteration(it + 1, detail::iteration_scalars(rec, rc, rec.global_batch));
    if ((it + 1) % cfg_.log_interval == 0 || final_step) {
      const double trained = interval.seconds() - excluded;
      double secs = trained / n_steps_in_interval;
      double tps = interval_tokens / trained;
      double tflops = interval_flops / trained / world / 1e12;
      double loss = n_acc ? loss_acc / n_acc : NAN;
      // Every rank's phase times and peak memory (one small all-gather per log line).
      clock_->seconds[detail::kIteration] = trained;
      detail::settle_device_marks(*clock_, model_->ops(), device_run_seconds_.data());
      const detail::IntervalTimers timers =
          detail::gather_interval(grid_.world(), *clock_, n_steps_in_interval, (double)peak_rss_bytes());
      // Samples drawn so far: the checkpoint's count plus this run's (the global batch may have
      // changed at the resume, or ramp up, so not iteration x batch).
      const long long consumed = first_sample(it + 1);
      // random-LTD: Megatron-DS's actual seqlen, the step's layer-tokens per sample per layer.
      const bool ltd = cfg_.random_ltd.enabled;
      const int actual_seqlen =
          static_cast<int>(step_layer_tokens(it) / (rec.global_batch * cfg_.model.num_layers));
      if (root) {
        std::cout << detail::log_timestamp() << format_log_line(it + 1, cfg_.train_iters, consumed, consumed_tokens_, secs * 1e3, rec.learning_rate,
                                     static_cast<int>(rec.global_batch), loss, rec.loss_scale, rec.grad_norm, skipped, nan_iters, tps,
                                     tps / world, tflops, rec.moe_loss, cfg_.curriculum.enabled ? rec.seqlen : -1,
                                     ltd ? rec.ltd_kept : -1, ltd ? actual_seqlen : -1,
                                     rc.log_params_norm ? rec.weight_l2 : NAN, rec.num_zeros)
                  << "\n";
        if (rc.timing_log_level > 0) std::cout << detail::timer_line(timers, rc.timing_log_level, rc.timing_log_option) << "\n";
        std::cout << std::flush;
      }
      if (records) {
        nlohmann::json j = {{"type", "train"},
                            {"iteration", it + 1},
                            {"consumed_samples", consumed},
                            {"consumed_tokens", consumed_tokens_},
                            {"elapsed_ms_per_iteration", secs * 1e3},
                            {"learning_rate", rec.learning_rate},
                            {"learning_rates", interval_lrs},  // one per iteration since the last record, ending with learning_rate
                            {"global_batch_size", rec.global_batch},
                            {"lm_loss", loss},
                            {"loss_scale", rec.loss_scale},
                            {"grad_norm", std::isfinite(rec.grad_norm) ? nlohmann::json(rec.grad_norm) : nlohmann::json(nullptr)},
                            {"skipped_iterations", skipped},
                            {"nan_iterations", nan_iters},
                            {"tokens_per_second", tps},
                            {"tokens_per_second_per_rank", tps / world},
                            {"tflops_per_rank", tflops},
                            {"timers_ms", detail::timers_json(timers, rc.timing_log_option)},
                            {"memory", {{"peak_rss_bytes", timers.peak_rss_max()}}}};
        if (!timers.device.empty()) j["device_timers_ms"] = detail::device_timers_json(timers, rc.timing_log_option);
        if (cfg_.curriculum.enabled) j["curriculum_seqlen"] = rec.seqlen;
        if (rc.log_params_norm && std::isfinite(rec.weight_l2)) j["params_norm"] = rec.weight_l2;
        if (std::isfinite(rec.num_zeros)) j["num_zeros"] = rec.num_zeros;
        if (std::isfinite(rec.weight_l2) && rc.log_optimizer_states)  // the optimizer/* TensorBoard scalars, where both intervals meet
          j["optimizer"] = {{"weight_l2", rec.weight_l2}, {"momentum_l2", rec.momentum_l2}, {"variance_l2", rec.variance_l2}};
        if (sampler_) {
          j["curriculum_difficulty"] = rec.difficulty;  // the first metric's; every metric's by name:
          for (size_t m = 0; m < rec.difficulties.size(); ++m)
            j["curriculum_difficulties"][cfg_.metric_curricula[m].metric] = rec.difficulties[m];
          j["curriculum_allowed_samples"] = rec.allowed_samples;
        }
        if (ltd) {
          j["random_ltd_reserved_length"] = rec.ltd_kept;
          j["actual_seqlen"] = actual_seqlen;
          j["consumed_layer_tokens"] = consumed_layer_tokens_;
        }
        if (std::isfinite(rec.moe_loss)) {
          j["moe_loss"] = rec.moe_loss;
          j["moe_layers"] = rec.moe_layers;
          j["alltoall_bytes_per_rank"] = model_->alltoall_bytes();
        }
        std::vector<Scalar> sc = {{"throughput/tokens per second", tps, it + 1}, {"throughput/TFLOPs per rank", tflops, it + 1}};
        if (rc.log_timers) detail::timer_scalars(timers, it + 1, sc);
        if (rc.log_memory) sc.push_back({"memory/peak resident bytes", timers.peak_rss_max(), it + 1});
        if (rc.log_world_size) sc.push_back({"world-size/world-size", double(world), it + 1});
        if (cfg_.curriculum.enabled) sc.push_back({"seqlen/curriculum seqlen", double(rec.seqlen), it + 1});
        if (sampler_) {
          for (size_t m = 0; m < rec.difficulties.size(); ++m)
            sc.push_back({"curriculum/" + cfg_.metric_curricula[m].metric + " difficulty", double(rec.difficulties[m]), it + 1});
          sc.push_back({"curriculum/allowed samples", double(rec.allowed_samples), it + 1});
        }
        if (ltd) {
          sc.push_back({"seqlen/random ltd reserved length", double(rec.ltd_kept), it + 1});
          sc.push_back({"seqlen/actual seqlen", double(actual_seqlen), it + 1});
          sc.push_back({"random-ltd/consumed layer tokens", double(consumed_layer_tokens_), it + 1});
        }
        records->record(j, sc);
      }
      loss_acc = 0;
      n_acc = 0;
      n_steps_in_interval = 0;
      interval_lrs.clear();
      interval_tokens = interval_flops = 0;
      clock_->clear();
      interval.reset();
      excluded = 0;
    }
    if (valid && cfg_.eval_iters > 0 && ((it + 1) % cfg_.eval_interval == 0 || final_step)) {
      join_update_timed();  // the update's time is the optimizer's, not the evaluation's
      Timer ev;
      run_evaluation(it + 1);
      excluded += ev.seconds();  // evaluation time is not training throughput
    }
    // Save and stop decisions are taken together by all ranks (a signal may reach only some).
    bool signalled = saving && grid_.world().allreduce_max(g_stop_flag ? 1.0 : 0.0) > 0;
    // --exit-duration-in-mins: Megatron's wall-clock limit, agreed by all ranks (clocks differ).
    const bool out_of_time = cfg_.exit_duration_mins > 0 &&
                             grid_.world().allreduce_max(total.seconds() / 60.0 >= cfg_.exit_duration_mins ? 1.0 : 0.0) > 0;
    bool exit_now = signalled || out_of_time || (cfg_.exit_interval > 0 && (it + 1) % cfg_.exit_interval == 0);
    bool last = final_step;
    const bool interval_save = cfg_.save_interval > 0 && (it + 1) % cfg_.save_interval == 0;
    if (exit_now || (saving && interval_save)) join_update_timed();  // the update's time is the optimizer's, not the checkpoint's
    Timer ckpt;  // saving is not training throughput either: its time goes to the checkpoint timer
    if (async_) {  // a background save finished? (one tiny all-reduce per iteration while one runs)
      TrainSummary::Save rec;
      std::string file;
      if (finish_async_save(/*wait=*/exit_now || last, &rec, &file)) {
        sum.saved.push_back(file);
        sum.saves.push_back(rec);
      }
    }
    if (saving && (interval_save || exit_now || last)) {
      if (cfg_.async_save && !exit_now && !last) {
        start_async_save();  // the final and the stop-on-signal saves stay synchronous: they must be done at exit
      } else {
        Timer t;
        sum.saved.push_back(save_checkpoint());
        TrainSummary::Save rec;
        rec.iteration = it + 1;
        rec.stall_seconds = rec.seconds = t.seconds();
        rec.bytes = 3.0 * model_->layout().numel() * sizeof(float);
        sum.saves.push_back(rec);
      }
    }
    clock_->seconds[detail::kCheckpoint] += ckpt.seconds();
    excluded += ckpt.seconds();
    if (exit_now) {
      sum.exit_reason = signalled ? "signal" : out_of_time ? "exit_duration" : "exit_interval";
      if (root)
        std::cout << (signalled ? "> stop requested by a signal: "
                                : out_of_time ? "> --exit-duration-in-mins reached: " : "> exit interval reached: ")
                  << "exiting after iteration " << it + 1 << std::endl;
      ++it;
      break;
    }
    if (tokens_done) {
      sum.exit_reason = "train_tokens";
      if (root)
        std::cout << "> --train-tokens reached: " << consumed_tokens_ << " tokens consumed after iteration " << it + 1
                  << std::endl;
      ++it;
      break;
    }
  }
  join_update();  // the last step's update is the run's result
  if (async_) {  // the loop ended without a final save (e.g. train_iters reached at an interval save)
    TrainSummary::Save rec;
    std::string file;
    if (finish_async_save(/*wait=*/true, &rec, &file)) {
      sum.saved.push_back(file);
      sum.saves.push_back(rec);
    }
  }
  sum.last_iteration = it;
  sum.seconds = total.seconds();
  sum.skipped_iterations = skipped;
  sum.tokens_per_second = double(consumed_tokens_ - tokens_at_start) / sum.seconds;
  static_assert(detail::kDevicePhases == std::tuple_size_v<decltype(device_run_seconds_)>);
  if (device_run_seconds_[detail::kDevStep] > 0)
    for (double s : device_run_seconds_) sum.device_ms.push_back(s * 1e3 / double(std::max(1LL, it - sum.start_iteration)));
  // Peak resident memory of every rank (measured, VmHWM), gathered everywhere for the summary.
  sum.peak_rss_per_rank = grid_.world().allgather((double)peak_rss_bytes());
  for (double v : sum.peak_rss_per_rank) sum.peak_rss_bytes = std::max<uint64_t>(sum.peak_rss_bytes, (uint64_t)v);
  return sum;
}

}  // namespace hpct::engine
