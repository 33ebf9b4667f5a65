// hpct/engine/data/batch_schedule.hpp — the global batch of every iteration: fixed, or ramped up as
// Megatron's --rampup-batch-size <start> <increment> <ramp-up samples> does.
//
// Megatron (RampupBatchsizeNumMicroBatches): the batch starts at `start` and grows by `increment`
// each time another (ramp samples / number of increments) samples have been consumed, reaching the
// global batch once the ramp's samples are consumed; the step beginning at c consumed samples takes
// start + floor(c / (ramp / increments)) * increment samples (the global batch once c > ramp).
// Every batch is a multiple of micro-batch x data-parallel size, so a step is a whole number of
// micro-steps on every rank.
// What it is: pure functions of the iteration (the samples consumed before it, its batch), so the
// trainer, the checkpoint and the schedules all agree. What it is not: a batch that changes with
// anything but the consumed samples.
#pragma once
#include <string>
#include <vector>

namespace hpct::engine {

struct BatchRampup {
  long long start = 0, increment = 0, samples = 0;  // --rampup-batch-size; start 0: no ramp
  bool on() const { return start > 0; }
};

class BatchSchedule {
 public:
  /// micro_dp = micro-batch x data-parallel size. Throws config_error naming --rampup-batch-size
  /// (Megatron's conditions: increment > 0, start <= global batch, global batch - start a multiple
  /// of the increment, start and increment multiples of micro_dp).
  BatchSchedule(long long global_batch, long long micro_dp, const BatchRampup& ramp = {});

  bool ramps() const { return ramp_.on() && global_batch_ > ramp_.start; }
  /// The batch of the step that begins after `consumed` samples.
  long long batch_at(long long consumed) const;
  /// Samples consumed by iterations [0, iteration).
  long long consumed_before(long long iteration) const;
  long long batch_of(long long iteration) const { return consumed_before(iteration + 1) - consumed_before(iteration); }
  /// Micro-steps of iteration's step on each rank.
  int micro_steps(long long iteration) const { return static_cast<int>(batch_of(iteration) / micro_dp_); }
  /// Megatron's iteration count for --train-samples: the ramp's steps (while the consumed samples
  /// are within the ramp), then whole global batches of what is left (a partial last batch dropped).
  long long iterations_for(long long train_samples) const;
  long long global_batch() const { return global_batch_; }
  /// "start S, +I every N samples, to G" or "" when the batch is fixed.
  std::string describe() const;

 private:
  long long global_batch_, micro_dp_;
  BatchRampup ramp_;
  double per_increment_ = 0;          // ramp samples / increments (Megatron divides in floating point)
  std::vector<long long> consumed_;   // consumed_[i]: samples before ramp step i, while batch < global
};

}  // namespace hpct::engine
