// comm::AlarmGuard: a guarded call that overruns ends the process with the prepared line and code;
// one that finishes in time (disarmed, or re-armed before expiry) does not. Death tests fork, so
// no MPI is started here: the guard is plain POSIX.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "hpct/comm/deadline.hpp"
#include "hpct/core/error.hpp"

namespace hpct::comm {
namespace {

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

TEST(AlarmGuardDeathTest, OverrunWritesTheLineAndExitsWithTheCode) {
  EXPECT_EXIT(
      {
        AlarmGuard g("rank 3 (n3): no reply from rank 4 (n4) within 0 s", 7);
        g.arm(0.05);
        for (;;) sleep_s(1);  // a blocking call that never returns
      },
      ::testing::ExitedWithCode(7), "rank 3 \\(n3\\): no reply from rank 4 \\(n4\\)");
}

TEST(AlarmGuardDeathTest, ReArmingPushesTheDeadline) {
  // Re-armed every 30 ms for 0.3 s with a 0.5 s timer: never fires; then left to expire: fires.
  EXPECT_EXIT(
      {
        AlarmGuard g("expired after the last re-arm", 5);
        for (int i = 0; i < 10; ++i) {
          g.arm(0.5);
          sleep_s(0.03);
        }
        g.arm(0.05);
        for (;;) sleep_s(1);
      },
      ::testing::ExitedWithCode(5), "expired after the last re-arm");
}

TEST(AlarmGuard, DisarmedOrDestroyedNeverFires) {
  {
    AlarmGuard g("must not appear", 9);
    g.arm(0.05);
    g.disarm();
    sleep_s(0.15);
  }
  {
    AlarmGuard g("must not appear either", 9);
    g.arm(0.05);
  }  // destroyed armed: disarmed, previous action restored
  sleep_s(0.15);
  struct sigaction now {};
  sigaction(SIGALRM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
  SUCCEED();  // reaching here means neither fired
}

TEST(AlarmGuard, OnlyOneAtATime) {
  AlarmGuard g("x", 1);
  EXPECT_THROW(AlarmGuard("y", 1), Error);
}

}  // namespace
}  // namespace hpct::comm
