// hpct/core/timer.hpp — wall-clock timing on the steady clock.
#pragma once
#include <chrono>

namespace hpct {
class Timer {
 public:
  Timer() : start_(clock::now()) {}
  void reset() { start_ = clock::now(); }
  double seconds() const { return std::chrono::duration<double>(clock::now() - start_).count(); }
  double ms() const { return seconds() * 1e3; }

 private:
  using clock = std::chrono::steady_clock;
  clock::time_point start_;
};
}  // namespace hpct
