// hpct/parallel/step_behind.hpp — an optimizer step run on a worker thread while the caller's
// thread goes on into the next forward, with the blocks it makes final handed over in its order.
//
// What it is for: ZeRO-Offload's host AdamW beside the next step's forward (DeviceStore::
// update_behind). The numbers stay those of the step run first, unlike DeepSpeed's delayed
// parameter update (which trains step n + 1 on step n - 1's weights): the step reports each block
// as final (record(b), from the worker), and the caller waits for block b (wait_for(b)) before the
// forward uses it, so the forward runs a block behind the update instead of after all of it.
//
// Threads: the step runs on the worker and may only record(); everything else is the caller's
// thread's, which acts on each record there (on_final: the store's upload; regather: a collective,
// since MPI is FUNNELED). With a regather the records are acted on strictly in the step's order up
// to the block asked for, never more and never by timing, so every rank makes the same collectives
// in the same order whatever each worker's pace. Without one, whatever has been recorded when a
// block is waited for is acted on at once (the caller's own collectives, stage 3's gathers, may
// wait for blocks: each rank only waits, in the order its collectives come).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace hpct::parallel {

class StepBehind {
 public:
  /// blocks: how many blocks a step reports (indices 0 .. blocks - 1). The worker thread starts with
  /// the first step.
  explicit StepBehind(size_t blocks);
  /// abandon(), then stops the worker.
  ~StepBehind();
  StepBehind(const StepBehind&) = delete;
  StepBehind& operator=(const StepBehind&) = delete;

  /// Runs `step` on the worker and returns at once (a step still running is joined first). The
  /// step calls record(b) for each block it makes final. on_final(b), here, for each record acted
  /// on; regather(b), here, before it (empty: none); `after`, here, once the step is joined. The
  /// worker runs OpenMP teams one thread short of kernels::optimizer_threads(), so the thread
  /// driving the device keeps a core.
  void start(std::function<void()> step, std::function<void()> after, std::function<void(int)> regather,
             std::function<void(int)> on_final);
  /// From the step (the worker): block b is final.
  void record(int block);
  /// A step was started and not joined.
  bool running() const { return running_; }
  /// Block b's record has been acted on here (or no step runs).
  bool final(int block) const { return !running_ || finished_[static_cast<size_t>(block)]; }
  /// Until block b is final: its record and the ones before it acted on (with a regather: only the
  /// ones before it in order, each waited for). A step that ends without b is joined.
  void wait_for(int block);
  /// Waits for the step (nothing when none runs), rethrows its error, acts on the records left in
  /// their order, then runs its `after`.
  void join();
  /// Waits for a running step and ends it without acting on its records, its error, its `after` or
  /// its re-gathers (on an error path a collective could wait for ranks that never come): for an
  /// owner that drops the state the step was writing.
  void abandon();
  /// The caller's uses of the blocks (a forward's params() calls): where a re-gather falls among them
  /// is what regather_order() hashes.
  void count_use() { ++uses_; }

  /// Steps run since construction, their worker wall time, the time the caller waited for them, and
  /// the blocks made final here while the step still ran (the overlap).
  long long steps() const { return steps_; }
  double seconds() const;
  double wait_seconds() const { return wait_; }
  long long uses_behind() const { return uses_behind_; }
  /// Tests: a hash of when the re-gathers were made, as (count_use() calls before it, its index in
  /// its step) pairs in order: equal on every rank whatever each worker's speed, or the ranks'
  /// collectives could interleave differently.
  uint64_t regather_order() const { return regather_order_; }
  /// Tests: the worker sleeps this long before each record, and 10 times as long after the step, so
  /// that the forward catches up with it and the backward's first gradient comes before its end.
  void slow_for_tests(double seconds_per_block) { slow_ = seconds_per_block; }

 private:
  struct Worker;                        // the thread and what it shares with the caller's
  std::unique_ptr<Worker> worker_;
  bool running_ = false;
  std::function<void()> after_;
  std::function<void(int)> regather_, on_final_;
  size_t taken_ = 0;                    // records acted on in this step
  std::vector<char> finished_;          // per block: its record acted on
  long long steps_ = 0, uses_behind_ = 0, uses_ = 0, regathers_in_step_ = 0;
  uint64_t regather_order_ = 1469598103934665603ull;  // FNV-1a state
  double wait_ = 0, slow_ = 0;

  void take_records();  // every record not yet acted on
  bool finish_next();   // the next record in order (waited for); false: the step ended
  void finish(int b);   // a record acted on: regather_, finished_, on_final_
};

}  // namespace hpct::parallel
