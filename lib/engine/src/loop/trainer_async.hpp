// trainer_async.hpp — private to the engine library: the Trainer's asynchronous save in flight,
// complete in trainer.cpp (the constructor and destructor) and trainer_checkpoint.cpp (its use).
#pragma once
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "hpct/core/timer.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/engine/loop/trainer.hpp"

namespace hpct::engine {

// An asynchronous save in flight: the file begun, the thread copying and writing this rank's state.
struct Trainer::AsyncSave {
  std::unique_ptr<Checkpointer> ck;
  std::unique_ptr<Checkpointer::PendingSave> pending;
  std::thread thread;
  Timer since_start;
  TrainSummary::Save record;
  double stall = 0;  // this rank's: the collective start, plus any wait at the snapshot fence
  std::mutex mu;
  std::condition_variable cv;
  bool copied = false;
  ~AsyncSave() {
    if (thread.joinable()) thread.join();
  }
};

}  // namespace hpct::engine
