// An optimizer step on a worker thread, its blocks handed over in order (see step_behind.hpp).
#include "hpct/parallel/step_behind.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "hpct/core/timer.hpp"
#include "hpct/kernels/optim.hpp"

namespace hpct::parallel {

// What the worker shares with the caller's thread (under mu): the job, the blocks it has made
// final, in order, and how it ended.
struct StepBehind::Worker {
  std::mutex mu;
  std::condition_variable cv;  // both ways: a job (or stop) for the worker; a record (or the end) for the caller
  std::function<void()> job;
  bool has_job = false, stop = false, done = true;
  std::exception_ptr error;
  std::vector<char> ready;     // per block: final in the running step
  std::vector<int> recorded;   // the same blocks in the order the step made them final
  double seconds = 0;          // the jobs' wall time, summed
  std::thread thread;          // last: started once the rest exists

  explicit Worker(size_t blocks) : ready(blocks, 0) {
    // One thread short of the host optimizer's team, for the thread that drives the device.
    const int threads = std::max(1, kernels::optimizer_threads() - 1);
    thread = std::thread([this, threads] { run(threads); });
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
  void run(int threads) {
    kernels::set_optimizer_threads_here(threads);
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return has_job || stop; });
        if (!has_job) return;
        f = std::move(job);
        has_job = false;
      }
      Timer t;
      std::exception_ptr err;
      try {
        f();
      } catch (...) {
        err = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> l(mu);
        error = err;
        seconds += t.seconds();
        done = true;
      }
      cv.notify_all();
    }
  }
  // Until the running job (if any) has ended; the caller holds no lock.
  double wait_done() {
    std::unique_lock<std::mutex> l(mu);
    if (done) return 0;
    Timer t;
    cv.wait(l, [&] { return done; });
    return t.seconds();
  }
};

StepBehind::StepBehind(size_t blocks) : finished_(blocks, 0) {}

StepBehind::~StepBehind() {
  abandon();
  worker_.reset();
}

void StepBehind::abandon() {
  // No re-gather, no `after`, no hand-over: the state is being dropped, and a collective here could
  // wait for ranks that never come. The worker's step still has to end.
  regather_ = nullptr;
  after_ = nullptr;
  on_final_ = nullptr;
  if (!running_) return;
  wait_ += worker_->wait_done();
  running_ = false;
}

void StepBehind::start(std::function<void()> step, std::function<void()> after, std::function<void(int)> regather,
                       std::function<void(int)> on_final) {
  join();
  if (!worker_) worker_ = std::make_unique<Worker>(finished_.size());
  {
    std::lock_guard<std::mutex> l(worker_->mu);
    std::fill(worker_->ready.begin(), worker_->ready.end(), 0);
    worker_->recorded.clear();
    worker_->error = nullptr;
    worker_->done = false;
    worker_->job = [this, step = std::move(step)] {
      step();
      // Tests: a tail after the last block too, so the backward reaches the engine before the end.
      if (slow_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(10 * slow_));
    };
    worker_->has_job = true;
    taken_ = 0;
    running_ = true;  // before the worker can call record()
  }
  std::fill(finished_.begin(), finished_.end(), 0);
  regathers_in_step_ = 0;
  after_ = std::move(after);
  regather_ = std::move(regather);
  on_final_ = std::move(on_final);
  ++steps_;
  worker_->cv.notify_all();
}

void StepBehind::record(int b) {
  if (slow_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(slow_));
  {
    std::lock_guard<std::mutex> l(worker_->mu);
    worker_->ready[static_cast<size_t>(b)] = 1;
    worker_->recorded.push_back(b);
  }
  worker_->cv.notify_all();
}

// A record acted on: the block re-gathered (a collective, on this thread), then handed on.
void StepBehind::finish(int c) {
  if (regather_) {
    for (uint64_t v : {static_cast<uint64_t>(uses_), static_cast<uint64_t>(regathers_in_step_++)})
      for (int byte = 0; byte < 8; ++byte) regather_order_ = (regather_order_ ^ ((v >> (8 * byte)) & 0xffu)) * 1099511628211ull;
    regather_(c);
  }
  finished_[static_cast<size_t>(c)] = 1;
  if (on_final_) on_final_(c);
}

void StepBehind::take_records() {
  std::vector<int> fresh;
  {
    std::lock_guard<std::mutex> l(worker_->mu);
    fresh.assign(worker_->recorded.begin() + static_cast<std::ptrdiff_t>(taken_), worker_->recorded.end());
    taken_ = worker_->recorded.size();
  }
  for (int c : fresh) finish(c);
}

bool StepBehind::finish_next() {
  int c;
  bool running;
  {
    std::unique_lock<std::mutex> l(worker_->mu);
    if (taken_ == worker_->recorded.size() && !worker_->done) {
      Timer t;
      worker_->cv.wait(l, [&] { return taken_ < worker_->recorded.size() || worker_->done; });
      wait_ += t.seconds();
    }
    if (taken_ == worker_->recorded.size()) return false;
    c = worker_->recorded[taken_++];
    running = !worker_->done;
  }
  finish(c);
  uses_behind_ += running;
  return true;
}

void StepBehind::wait_for(int b) {
  if (!running_) return;
  if (regather_) {
    // Every rank must make the same collectives in the same order, whatever the timing: the
    // records in their order up to b, each waited for, never more (nor an early join).
    while (!finished_[static_cast<size_t>(b)])
      if (!finish_next()) return join();  // the step ended without b (a failure: join rethrows it)
    return;
  }
  bool ended;
  {
    std::unique_lock<std::mutex> l(worker_->mu);
    if (!worker_->ready[static_cast<size_t>(b)] && !worker_->done) {
      Timer t;
      worker_->cv.wait(l, [&] { return worker_->ready[static_cast<size_t>(b)] || worker_->done; });
      wait_ += t.seconds();
    }
    ended = worker_->done;
  }
  if (ended) {  // finished (or failed): over, as the first gradient would end it
    join();
    return;
  }
  ++uses_behind_;
  take_records();  // b and the blocks before it go on now, the forward's next ones as they come
}

void StepBehind::join() {
  if (!running_) return;
  wait_ += worker_->wait_done();
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> l(worker_->mu);
    err = worker_->error;
    worker_->error = nullptr;
  }
  running_ = false;
  std::function<void()> after = std::move(after_);
  after_ = nullptr;
  if (err) {
    regather_ = nullptr;
    on_final_ = nullptr;
    std::rethrow_exception(err);
  }
  take_records();  // the blocks no forward asked for yet: re-gathered and handed on in their order
  regather_ = nullptr;
  on_final_ = nullptr;
  if (after) after();
}

double StepBehind::seconds() const {
  if (!worker_) return 0;
  std::lock_guard<std::mutex> l(worker_->mu);
  return worker_->seconds;
}

}  // namespace hpct::parallel
