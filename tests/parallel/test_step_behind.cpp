// StepBehind on its own: the records reach the caller in the step's order, wait_for waits for the
// block asked for and no more (with a re-gather: exactly the records before it), the step's error
// comes back at join, and abandon drops what is left. The engine-level checks (bitwise the step run
// first, every layout) are tests/engine/test_optimizer_overlap.cpp.
#include "hpct/parallel/step_behind.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

using hpct::parallel::StepBehind;

namespace {

// A step that records blocks 0..n-1, each after `gate` lets it (gate counts the blocks allowed).
struct GatedStep {
  std::atomic<int> gate{0};
  void run(StepBehind& s, int n) {
    for (int b = 0; b < n; ++b) {
      while (gate.load() <= b) std::this_thread::sleep_for(std::chrono::microseconds(50));
      s.record(b);
    }
  }
};

}  // namespace

TEST(StepBehind, HandsOverInTheStepsOrderAndRunsAfterAtJoin) {
  StepBehind s(4);
  GatedStep g;
  std::vector<int> final_order;
  int afters = 0;
  s.start([&] { g.run(s, 4); }, [&] { ++afters; }, {}, [&](int b) { final_order.push_back(b); });
  EXPECT_TRUE(s.running());
  EXPECT_FALSE(s.final(0));
  g.gate = 2;  // blocks 0 and 1 only
  s.wait_for(1);
  EXPECT_TRUE(s.final(1));
  EXPECT_FALSE(s.final(3));  // not yet recorded: could not have been handed over
  EXPECT_EQ(afters, 0);      // `after` waits for the join
  g.gate = 4;
  s.join();
  EXPECT_FALSE(s.running());
  EXPECT_EQ(final_order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(afters, 1);
  EXPECT_EQ(s.steps(), 1);
  EXPECT_GT(s.uses_behind(), 0);  // block 1 was handed over while the step still ran
  s.join();                       // nothing runs: nothing happens
  EXPECT_EQ(afters, 1);
}

TEST(StepBehind, WithARegatherTakesExactlyTheRecordsUpToTheBlock) {
  StepBehind s(5);
  GatedStep g;
  g.gate = 5;  // the whole step may be recorded before the caller looks
  std::vector<int> regathered;
  s.start([&] { g.run(s, 5); }, {}, [&](int b) { regathered.push_back(b); }, {});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  s.count_use();
  s.wait_for(2);
  // In order, and never past the block asked for, however far the worker has got.
  EXPECT_EQ(regathered, (std::vector<int>{0, 1, 2}));
  s.count_use();
  s.join();
  EXPECT_EQ(regathered, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(StepBehind, RegatherOrderDependsOnWhereTheRegathersFall) {
  auto order = [](int uses_before) {
    StepBehind s(3);
    s.start([&] { for (int b = 0; b < 3; ++b) s.record(b); }, {}, [](int) {}, {});
    for (int i = 0; i < uses_before; ++i) s.count_use();
    s.wait_for(0);
    s.join();
    return s.regather_order();
  };
  EXPECT_EQ(order(1), order(1));
  EXPECT_NE(order(1), order(2));
}

TEST(StepBehind, TheStepsErrorComesBackAtJoinAndTheWorkerGoesOn) {
  StepBehind s(2);
  int afters = 0;
  s.start([&] {
    s.record(0);
    throw std::runtime_error("the step failed");
  }, [&] { ++afters; }, {}, {});
  EXPECT_THROW(s.join(), std::runtime_error);
  EXPECT_FALSE(s.running());
  EXPECT_EQ(afters, 0);  // a failed step runs no `after`
  std::vector<int> got;
  s.start([&] { s.record(1); }, [&] { ++afters; }, {}, [&](int b) { got.push_back(b); });
  s.join();
  EXPECT_EQ(got, (std::vector<int>{1}));
  EXPECT_EQ(afters, 1);
}

TEST(StepBehind, WaitingForABlockTheStepNeverMakesJoinsIt) {
  StepBehind s(3);
  s.start([&] {
    s.record(0);
    throw std::runtime_error("stopped before block 2");
  }, {}, [](int) {}, {});
  EXPECT_THROW(s.wait_for(2), std::runtime_error);
  EXPECT_FALSE(s.running());
}

TEST(StepBehind, AbandonActsOnNothingLeft) {
  StepBehind s(3);
  int acted = 0, afters = 0;
  s.start([&] { for (int b = 0; b < 3; ++b) s.record(b); }, [&] { ++afters; }, {}, [&](int) { ++acted; });
  s.abandon();
  EXPECT_FALSE(s.running());
  EXPECT_EQ(acted, 0);
  EXPECT_EQ(afters, 0);
}
