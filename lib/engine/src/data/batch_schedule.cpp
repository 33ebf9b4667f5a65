// The global batch of every iteration (see batch_schedule.hpp).
#include "hpct/engine/data/batch_schedule.hpp"

#include <algorithm>

#include "hpct/core/error.hpp"

namespace hpct::engine {

BatchSchedule::BatchSchedule(long long global_batch, long long micro_dp, const BatchRampup& ramp)
    : global_batch_(global_batch), micro_dp_(micro_dp), ramp_(ramp) {
  if (!ramp.on()) return;
  const char* f = "--rampup-batch-size";
  const std::string given = std::string(f) + " " + std::to_string(ramp.start) + " " + std::to_string(ramp.increment) +
                            " " + std::to_string(ramp.samples);
  if (ramp.increment <= 0 || ramp.samples <= 0)
    throw config_error(f, given + ": needs <start> <increment> <ramp-up samples>, all positive");
  if (ramp.start > global_batch)
    throw config_error(f, given + ": the start batch exceeds --global-batch-size " + std::to_string(global_batch));
  if ((global_batch - ramp.start) % ramp.increment != 0)
    throw config_error(f, given + ": --global-batch-size " + std::to_string(global_batch) + " minus the start batch is not a multiple of the increment");
  if (ramp.start % micro_dp != 0 || ramp.increment % micro_dp != 0)
    throw config_error(f, given + ": the start batch and the increment must be multiples of --micro-batch-size x data-parallel size = " +
                              std::to_string(micro_dp), "every step must be whole micro-batches on every rank");
  if (!ramps()) return;
  per_increment_ = double(ramp.samples) / double((global_batch - ramp.start) / ramp.increment);
  for (long long c = 0; batch_at(c) < global_batch_; c += batch_at(c)) consumed_.push_back(c);
}

long long BatchSchedule::batch_at(long long consumed) const {
  if (!ramps() || consumed > ramp_.samples) return global_batch_;
  const long long steps = static_cast<long long>(double(consumed) / per_increment_);
  return std::min(global_batch_, ramp_.start + steps * ramp_.increment);
}

long long BatchSchedule::consumed_before(long long iteration) const {
  const long long n = static_cast<long long>(consumed_.size());
  if (iteration < n) return consumed_[iteration];
  const long long end = n == 0 ? 0 : consumed_.back() + batch_at(consumed_.back());
  return end + (iteration - n) * global_batch_;
}

long long BatchSchedule::iterations_for(long long train_samples) const {
  if (!ramps()) return train_samples / global_batch_;
  long long it = 0, c = 0;
  while (c <= ramp_.samples) c += batch_at(c), ++it;  // Megatron's loop, consumed <= ramp samples
  if (train_samples < c)
    throw config_error("--train-samples", "--train-samples " + std::to_string(train_samples) + " ends inside the batch ramp-up (" +
                                              std::to_string(c) + " samples)", "give more samples, or a shorter --rampup-batch-size");
  return it + (train_samples - c) / global_batch_;
}

std::string BatchSchedule::describe() const {
  if (!ramps()) return "";
  return "ramped from " + std::to_string(ramp_.start) + " by " + std::to_string(ramp_.increment) + " over " +
         std::to_string(ramp_.samples) + " samples (" + std::to_string(consumed_.size()) + " steps) to " +
         std::to_string(global_batch_);
}

}  // namespace hpct::engine
