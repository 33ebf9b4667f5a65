// Private to lib/engine: the training loop's phase timers and what one log interval reports
// (the timer line under Megatron's log line, the metrics record's "timers_ms", TensorBoard tags).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/engine/records/run_records.hpp"
#include "hpct/engine/config/train_config.hpp"
#include "hpct/engine/loop/trainer.hpp"

namespace hpct::engine::detail {

/// Where an iteration's time goes, on one rank. The first five add up to the iteration (what the
/// log line's "elapsed time per iteration" measures); checkpoint time is kept out of it, as
/// evaluation is; the level-2 ones are parts of the first five.
enum Phase : int {
  kData,         // reading and checking the micro-batches' tokens
  kForward,      // embedding + layers' forward (with ZeRO-3 gathers waited for)
  kBackward,     // LM head (fused loss and gradient) + layers' backward, recompute, overlapped reductions
  kGradReduce,   // after backward: waiting for the gradient reductions still in flight
  kOptimizer,    // loss and grad-norm all-reduces, clipping, Adam (with the NVMe sweep), 16-bit copies
  kCheckpoint,   // saving (the whole save, or an async save's stall)
  kGatherWait,   // level 2: ZeRO-3 parameter gathers waited for (in forward and backward)
  kReduceWait,   // level 2: gradient reductions waited for (in backward and grad_reduce)
  kNvme,         // level 2: NVMe swap time (parameter reads, optimizer sweeps; a sweep behind the forward is optimizer_behind's)
  kOptimizerBehind,  // level 2: the host AdamW run behind the forward (its worker's wall time; in no level-1 phase)
  kOptimizerWait,    // level 2: of which the training thread waited for (in forward, backward or optimizer)
  kIteration,    // the rank's own wall time per iteration over the interval
  kPhases
};
const char* phase_name(int p);
int phase_level(int p);  // 1 or 2; kIteration 0

/// Where a step's time goes on a device with a stream of its own (OpsBackend::mark: CUDA events),
/// as the device ran it rather than as the host queued it: the forwards, the backwards (LM head,
/// layers, the reductions they wait for), from the last backward to the step's end (grad norm,
/// AdamW, re-gathering), the time the device waited for the host between those (idle), the step.
enum DevicePhase : int { kDevForward, kDevBackward, kDevOptimizer, kDevIdle, kDevStep, kDevicePhases };
const char* device_phase_name(int p);

/// One step's markers: its start and end, and each forward_backward's.
struct StepMarks {
  int start = -1, end = -1;
  std::vector<model::Gpt::Marks> passes;
};

struct PhaseClock {
  double seconds[kPhases] = {};
  double device[kDevicePhases] = {};  // seconds, from the markers settled in this interval
  bool device_timed = false;          // the backend has markers (every rank alike)
  std::vector<StepMarks> pending;     // steps not yet read (read once a log interval)
  void clear() { *this = PhaseClock{}; }
};
/// Reads the pending steps' markers (waiting for the last one: once a log interval, so no step
/// waits for its own device work), adds their times to c.device and to run_seconds (kDevicePhases,
/// the run's totals), and forgets every marker. Nothing on a backend without markers.
void settle_device_marks(PhaseClock& c, kernels::OpsBackend& be, double* run_seconds);

/// Collective over `world`: every rank's phase times (ms per iteration over `iters` iterations)
/// and peak resident bytes, gathered on every rank.
struct IntervalTimers {
  int ranks = 1;
  std::vector<double> values;  // ranks x (kPhases + 1): ms per iteration per phase, then peak RSS bytes
  std::vector<double> device;  // ranks x kDevicePhases: device ms per iteration; empty without markers
  double at(int rank, int p) const { return values[static_cast<size_t>(rank) * (kPhases + 1) + p]; }
  double max(int p) const;
  double min(int p) const;
  double peak_rss_max() const;
};
IntervalTimers gather_interval(const comm::Communicator& world, const PhaseClock& c, int iters, double peak_rss);

/// " time (ms) | forward: 12.34 | ..." for the phases up to `level`, as max, (min, max) or every rank.
std::string timer_line(const IntervalTimers& t, int level, const std::string& option);
/// {"forward": {"max": ms, "min": ms[, "ranks": [...]]}, ...} for every phase.
nlohmann::json timers_json(const IntervalTimers& t, const std::string& option);
/// The same for the device phases (null without markers).
nlohmann::json device_timers_json(const IntervalTimers& t, const std::string& option);
/// Megatron-LM's prefix of each log line: the local wall-clock time, " [2026-11-28 17:00:00]".
std::string log_timestamp();
/// The scalars of one iteration for TensorBoard / CSV (Megatron's tags).
std::vector<Scalar> iteration_scalars(const StepRecord& rec, const RunRecordsConfig& rc, int global_batch);
/// TensorBoard tags of the per-phase timers ("timers/forward", ...) and the iteration time.
void timer_scalars(const IntervalTimers& t, long long it, std::vector<Scalar>& out);

}  // namespace hpct::engine::detail
