// The optimizer's part of a training step (see trainer.hpp): after the micro-steps, the loss and
// gradient norm over the ranks, the loss scaler's verdict, clipping and AdamW, which ZeRO-Offload
// on a device runs behind the next step's forward where it can (DeviceStore::update_behind).
#include <cmath>
#include <functional>

#include "hpct/core/timer.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "hpct/engine/records/moe_stats.hpp"
#include "train_log.hpp"

namespace hpct::engine {

// Why the host step cannot run beside the next forward here ("" where it can): it must make no
// collective call (MPI is used from one thread: the all-gathers are left to this thread), share
// no swap file with the forward (NVMe at stages 1-2 is the step's alone), and there must be a
// forward to run beside it (a device whose copies run beside its ops). Every rank decides alike.
void Trainer::decide_optimizer_overlap() {
  if (!device_store_) overlap_off_ = "no ZeRO-Offload on a device";
  else if (!cfg_.optimizer_overlap) overlap_off_ = "--no-optimizer-overlap";
  else if (model_->ops().host_memory()) overlap_off_ = "the model's backend computes in host memory";
  else if (!zero_->step_is_local())
    overlap_off_ = zero_->offloaded() ? "NVMe offload at stage 3: the forward's gathers read the swap file the step sweeps"
                                      : "the optimizer step makes MPI calls";
  else overlap_off_.clear();
  // Stage 3: the forward's gathers (and prefetches) wait for each block's update on this rank; the
  // gathers themselves come in the forward's order on every rank, whatever each step's pace (a
  // re-gather of the persistent blocks makes the hand-over strictly ordered, as at stages 1-2).
  if (overlap_off_.empty() && cfg_.zero.stage == 3)
    zero_->set_before_gather([this](int block) { device_store_->step_behind().wait_for(block); });
}

void Trainer::join_update_timed() {
  if (!device_store_ || !device_store_->updating()) return;
  Timer t;
  const double behind0 = device_store_->step_behind().seconds(), wait0 = device_store_->step_behind().wait_seconds();
  join_update();
  clock_->seconds[detail::kOptimizer] += t.seconds();
  clock_->seconds[detail::kOptimizerBehind] += device_store_->step_behind().seconds() - behind0;
  clock_->seconds[detail::kOptimizerWait] += device_store_->step_behind().wait_seconds() - wait0;
}

// After the micro-steps: the loss and grad norm over the ranks, the loss scaler's verdict, AdamW.
void Trainer::update(StepRecord& rec, double loss_sum, double scale, long long iteration) {
  grid_.dp().allreduce_sum(&loss_sum, 1);
  rec.lm_loss = loss_sum / double(rec.targets);
  if (cfg_.model.moe.enabled(cfg_.model.num_layers)) {
    MoeStepStats ms = gather_moe_stats(*model_, grid_.dp());
    rec.moe_loss = ms.moe_loss;
    rec.moe_layers = std::move(ms.layers);
  }
  rec.loss_scale = scale;
  // Token-based schedules see the tokens through this step (as steps count the one being taken).
  const double lr_tokens = schedule_tokens(consumed_layer_tokens_ + step_layer_tokens(iteration));
  // Sample-based schedules count the samples through this step; the n-th optimizer step's count is
  // the batch schedule's first n batches (Megatron adds each successful step's batch: the same unless
  // an fp16 step is skipped while the batch ramps).
  const double lr_samples = double(batches_.consumed_before(adam_step_ + 1));

  double sumsq = zero_->grad_sumsq();
  bool overflow = !std::isfinite(sumsq);
  // The sum of squares is the same on every rank (all-reduced), so every rank decides alike.
  bool ok = scaler_.update(overflow);
  rec.grad_norm = overflow ? NAN : std::sqrt(sumsq) / scale;
  if (!ok) {
    rec.skipped = true;
    rec.learning_rate = learning_rate(lr_cfg_, adam_step_, lr_tokens, warmup_end_tokens_, lr_samples);
    return;
  }
  // Collective, decided by the config alone: every rank counts. Before the update, which leaves the
  // gradients as they are (the count is of the reduced gradient, unscaled or not: zeros stay zeros).
  if (cfg_.records.log_num_zeros) rec.num_zeros = zero_->grad_zeros();
  double clip = 1.0;
  if (cfg_.clip_grad > 0 && rec.grad_norm > cfg_.clip_grad) clip = cfg_.clip_grad / (rec.grad_norm + 1e-6);
  const double lr = learning_rate(lr_cfg_, adam_step_, lr_tokens, warmup_end_tokens_, lr_samples);
  rec.learning_rate = lr;
  ++adam_step_;
  parallel::AdamParams ap;
  ap.lr = (float)lr;
  ap.beta1 = (float)cfg_.beta1;
  ap.beta2 = (float)cfg_.beta2;
  ap.eps = (float)cfg_.eps;
  ap.weight_decay = (float)cfg_.weight_decay;
  ap.step = (int)(adam_base_ + adam_step_);  // bias correction counts the moments' every step
  ap.grad_scale = static_cast<float>(clip / scale);
  ap.state_norms = want_state_norms_;
  snapshot_fence();  // a background save may still be copying the state this step changes
  if (device_store_) device_store_->begin_update(ap);  // ZeRO-Offload: blocks go up as they are updated
  if (device_store_ && overlap_off_.empty() && !want_state_norms_) {
    // Behind the next forward: the store hands the forward each block once the step has updated
    // it, and joins before the first gradient reaches the engine, clearing the gradients then.
    // Stages 1-2 over several ranks: the step's all-gathers are made here (MPI stays on this
    // thread), each block's before its upload, in the step's order.
    zero_->release_gathered();  // stage 3: the forward gathers again, after each block's update
    std::function<void(int)> regather;
    if (zero_->regathers()) {
      ap.regather_later = true;
      regather = [this](int block) { zero_->regather(block); };
    }
    device_store_->update_behind([this, ap] { zero_->adam_step(ap); }, [this] { zero_->begin_step(); },
                                 std::move(regather));
    return;
  }
  zero_->adam_step(ap);
  if (want_state_norms_) {  // collective: every rank decides alike (config and iteration only)
    const std::array<double, 3> n = zero_->state_sumsq();
    rec.weight_l2 = std::sqrt(n[0]);
    rec.momentum_l2 = std::sqrt(n[1]);
    rec.variance_l2 = std::sqrt(n[2]);
  }
}

}  // namespace hpct::engine
