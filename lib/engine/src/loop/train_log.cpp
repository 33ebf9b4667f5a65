// Phase timers, interval reports and the Megatron iteration line of the training loop. See
// train_log.hpp and trainer.hpp.
#include "train_log.hpp"

#include "hpct/engine/loop/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>

namespace hpct::engine::detail {

// Megatron-LM's prefix of each log line: the local wall-clock time, " [2026-11-28 17:00:00]".
std::string log_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, " [%Y-%m-%d %H:%M:%S]", &local);
  return buf;
}

// The scalars of one iteration for TensorBoard / CSV (Megatron's tags).
std::vector<Scalar> iteration_scalars(const StepRecord& rec, const RunRecordsConfig& rc, int global_batch) {
  const long long it = rec.iteration;
  std::vector<Scalar> v = {{"lm-loss-training/lm loss", rec.lm_loss, it}};
  if (std::isfinite(rec.moe_loss)) v.push_back({"lm-loss-training/moe loss", rec.moe_loss, it});
  if (rc.log_learning_rate) v.push_back({"learning-rate/learning-rate", rec.learning_rate, it});
  if (rc.log_loss_scale) v.push_back({"loss-scale/loss-scale", rec.loss_scale, it});
  if (rc.log_batch_size) v.push_back({"batch-size/batch-size", double(global_batch), it});
  v.push_back({"grad-norm/grad-norm", rec.grad_norm, it});  // NaN (an overflow) is left out
  if (std::isfinite(rec.num_zeros)) v.push_back({"num-zeros/num-zeros", rec.num_zeros, it});
  if (std::isfinite(rec.weight_l2) && rc.log_params_norm) v.push_back({"params-norm/params-norm", rec.weight_l2, it});
  if (std::isfinite(rec.weight_l2) && rc.log_optimizer_states) {  // Megatron-DeepSpeed's optimizer/* tags (L2 norms after the update)
    v.push_back({"optimizer/weight_l2", rec.weight_l2, it});
    v.push_back({"optimizer/momentum_l2", rec.momentum_l2, it});
    v.push_back({"optimizer/variance_l2", rec.variance_l2, it});
  }
  return v;
}

const char* phase_name(int p) {
  static const char* names[kPhases] = {"data",        "forward",     "backward",         "grad_reduce",
                                       "optimizer",   "checkpoint",  "gather_wait",      "reduce_wait",
                                       "nvme",        "optimizer_behind", "optimizer_wait", "iteration"};
  return names[p];
}

const char* device_phase_name(int p) {
  static const char* names[kDevicePhases] = {"forward", "backward", "optimizer", "idle", "step"};
  return names[p];
}

void settle_device_marks(PhaseClock& c, kernels::OpsBackend& be, double* run_seconds) {
  if (c.pending.empty()) return;
  for (const StepMarks& s : c.pending) {
    if (s.start < 0 || s.end < 0) continue;
    double d[kDevicePhases] = {};
    int last = s.start;
    for (const model::Gpt::Marks& m : s.passes) {
      d[kDevForward] += be.marked_seconds(m.start, m.forward_end);
      d[kDevBackward] += be.marked_seconds(m.forward_end, m.backward_end);
      last = m.backward_end;
    }
    d[kDevOptimizer] = be.marked_seconds(last, s.end);
    d[kDevStep] = be.marked_seconds(s.start, s.end);
    d[kDevIdle] = std::max(0.0, d[kDevStep] - d[kDevForward] - d[kDevBackward] - d[kDevOptimizer]);
    for (int p = 0; p < kDevicePhases; ++p) c.device[p] += d[p], run_seconds[p] += d[p];
    c.device_timed = true;
  }
  c.pending.clear();
  be.clear_marks();
}

int phase_level(int p) {
  if (p == kIteration) return 0;
  return p >= kGatherWait ? 2 : 1;
}

double IntervalTimers::max(int p) const {
  double m = at(0, p);
  for (int r = 1; r < ranks; ++r) m = std::max(m, at(r, p));
  return m;
}

double IntervalTimers::min(int p) const {
  double m = at(0, p);
  for (int r = 1; r < ranks; ++r) m = std::min(m, at(r, p));
  return m;
}

double IntervalTimers::peak_rss_max() const { return max(kPhases); }

IntervalTimers gather_interval(const comm::Communicator& world, const PhaseClock& c, int iters, double peak_rss) {
  std::vector<double> mine(kPhases + 1);
  for (int p = 0; p < kPhases; ++p) mine[p] = c.seconds[p] * 1e3 / std::max(1, iters);
  mine[kPhases] = peak_rss;
  IntervalTimers t;
  t.ranks = world.size();
  t.values = world.allgather(mine);
  if (c.device_timed) {  // every rank alike: the same backend everywhere
    std::vector<double> dev(kDevicePhases);
    for (int p = 0; p < kDevicePhases; ++p) dev[p] = c.device[p] * 1e3 / std::max(1, iters);
    t.device = world.allgather(dev);
  }
  return t;
}

namespace {
// " name: value |" as --timing-log-option asks: the maximum, (min, max), or every rank's.
void add_timer(std::string& line, const char* name, const std::vector<double>& v, int ranks, int stride, int p,
               const std::string& option) {
  char buf[64];
  double lo = v[p], hi = v[p];
  for (int r = 1; r < ranks; ++r) lo = std::min(lo, v[(size_t)r * stride + p]), hi = std::max(hi, v[(size_t)r * stride + p]);
  line += std::string(" ") + name + ": ";
  if (option == "max") {
    std::snprintf(buf, sizeof buf, "%.2f", hi);
    line += buf;
  } else if (option == "minmax") {
    std::snprintf(buf, sizeof buf, "(%.2f, %.2f)", lo, hi);
    line += buf;
  } else {
    line += "[";
    for (int r = 0; r < ranks; ++r) {
      std::snprintf(buf, sizeof buf, "%s%.2f", r ? ", " : "", v[(size_t)r * stride + p]);
      line += buf;
    }
    line += "]";
  }
  line += " |";
}
}  // namespace

std::string timer_line(const IntervalTimers& t, int level, const std::string& option) {
  std::string line = " time (ms) |";
  for (int p = 0; p < kPhases; ++p) {
    if (phase_level(p) > level || p == kIteration) continue;
    add_timer(line, phase_name(p), t.values, t.ranks, kPhases + 1, p, option);
  }
  if (!t.device.empty()) {  // the device's own time (CUDA events), beside the host's above
    line += " device time (ms) |";
    for (int p = 0; p < kDevicePhases; ++p)
      if (p != kDevStep) add_timer(line, device_phase_name(p), t.device, t.ranks, kDevicePhases, p, option);
  }
  return line;
}

nlohmann::json timers_json(const IntervalTimers& t, const std::string& option) {
  nlohmann::json j = nlohmann::json::object();
  for (int p = 0; p < kPhases; ++p) {
    nlohmann::json e = {{"max", t.max(p)}, {"min", t.min(p)}};
    if (option == "all") {
      std::vector<double> v;
      for (int r = 0; r < t.ranks; ++r) v.push_back(t.at(r, p));
      e["ranks"] = v;
    }
    j[phase_name(p)] = e;
  }
  return j;
}

nlohmann::json device_timers_json(const IntervalTimers& t, const std::string& option) {
  if (t.device.empty()) return nullptr;
  nlohmann::json j = nlohmann::json::object();
  for (int p = 0; p < kDevicePhases; ++p) {
    std::vector<double> v;
    for (int r = 0; r < t.ranks; ++r) v.push_back(t.device[(size_t)r * kDevicePhases + p]);
    nlohmann::json e = {{"max", *std::max_element(v.begin(), v.end())}, {"min", *std::min_element(v.begin(), v.end())}};
    if (option == "all") e["ranks"] = v;
    j[device_phase_name(p)] = e;
  }
  return j;
}

void timer_scalars(const IntervalTimers& t, long long it, std::vector<Scalar>& out) {
  for (int p = 0; p < kPhases; ++p)
    out.push_back({p == kIteration ? "iteration-time/iteration-time" : std::string("timers/") + phase_name(p), t.max(p), it});
}

}  // namespace hpct::engine::detail

namespace hpct::engine {

std::string format_log_line(long long iteration, long long train_iters, long long consumed_samples,
                            long long consumed_tokens, double ms_per_iter, double lr, int global_batch, double loss,
                            double loss_scale, double grad_norm, long long skipped, long long nan_iters,
                            double tokens_per_sec, double tokens_per_sec_per_rank, double tflops_per_rank,
                            double moe_loss, int curriculum_seqlen, int ltd_reserved, int actual_seqlen,
                            double params_norm, double num_zeros) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                " iteration %8lld/%8lld | consumed samples: %12lld | consumed tokens: %12lld | elapsed time per "
                "iteration (ms): %.1f | learning rate: %.3E | global batch size: %5d | lm loss: %.6E | loss scale: "
                "%.1f | grad norm: %.3f | number of skipped iterations: %3lld | number of nan iterations: %3lld | "
                "tokens per second: %.1f | tokens per gpu per second (tgs): %.1f | TFLOPs: %.2f |",
                iteration, train_iters, consumed_samples, consumed_tokens, ms_per_iter, lr, global_batch, loss,
                loss_scale, grad_norm, skipped, nan_iters, tokens_per_sec, tokens_per_sec_per_rank, tflops_per_rank);
  std::string line = buf;
  if (std::isfinite(moe_loss)) {  // Megatron-DeepSpeed puts it right after the lm loss
    char m[64];
    std::snprintf(m, sizeof m, " moe loss: %.6E |", moe_loss);
    const size_t at = line.find(" loss scale:");
    line.insert(at == std::string::npos ? line.size() : at, m);
  }
  if (std::isfinite(num_zeros)) {  // Megatron: right after the grad norm, before the params norm
    char m[64];
    std::snprintf(m, sizeof m, " num zeros: %.1f |", num_zeros);
    const size_t at = line.find(" number of skipped iterations:");
    line.insert(at == std::string::npos ? line.size() : at, m);
  }
  if (std::isfinite(params_norm)) {  // Megatron: right after the grad norm (--log-params-norm)
    char m[64];
    std::snprintf(m, sizeof m, " params norm: %.3f |", params_norm);
    const size_t at = line.find(" number of skipped iterations:");
    line.insert(at == std::string::npos ? line.size() : at, m);
  }
  if (curriculum_seqlen > 0 || ltd_reserved > 0) {  // Megatron-DeepSpeed: after the grad norm, before the skipped count
    char m[160];
    int n = 0;
    if (curriculum_seqlen > 0) n += std::snprintf(m + n, sizeof m - n, " curriculum seqlen: %5d |", curriculum_seqlen);
    if (ltd_reserved > 0) n += std::snprintf(m + n, sizeof m - n, " random ltd reserved length: %5d |", ltd_reserved);
    std::snprintf(m + n, sizeof m - n, " actual seqlen: %5d |", actual_seqlen > 0 ? actual_seqlen : curriculum_seqlen);
    const size_t at = line.find(" number of skipped iterations:");
    line.insert(at == std::string::npos ? line.size() : at, m);
  }
  return line;
}

}  // namespace hpct::engine
