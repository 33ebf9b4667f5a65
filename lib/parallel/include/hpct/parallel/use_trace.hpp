// hpct/parallel/use_trace.hpp — the order in which a model asks a stage-3 engine for its blocks,
// recorded on the first micro-step and followed on the later ones: what a prefetch gathers ahead.
//
// What it is: the record (every params() call, in order), the position of the current micro-step
// in it, and the blocks expected next. A call out of the recorded order (an evaluation, another
// shape) puts the micro-step off track: nothing is expected until the next one begins.
// What it is not: the prefetch itself (each engine gathers in its own way: ZeroEngine with MPI,
// DeviceEngine on the device collectives).
#pragma once
#include <cstddef>
#include <vector>

namespace hpct::parallel {

class UseTrace {
 public:
  /// A micro-step begins: the first records, the later ones follow the record from its start.
  void begin_micro_step() {
    if (state_ == State::none) {
      order_.clear();
      state_ = State::recording;
    } else if (state_ == State::ready) {
      pos_ = 0;
    }
  }
  /// The micro-step ended: the record (if this one made it) is complete; nothing is expected.
  void end_micro_step() {
    if (state_ == State::recording) state_ = State::ready;
    pos_ = -1;
  }
  /// The model asked for block b.
  void used(int b) {
    if (state_ == State::recording) {
      order_.push_back(b);
    } else if (on_track()) {
      if (static_cast<size_t>(pos_) < order_.size() && order_[pos_] == b) ++pos_;
      else pos_ = -1;  // another order (evaluation): no prefetch until the next micro-step
    }
  }
  /// True while this micro-step follows the record (so ahead() names what comes next).
  bool on_track() const { return state_ == State::ready && pos_ >= 0; }
  /// f(block) for each block expected next, in order, until f returns false (none off track).
  template <class F>
  void ahead(F&& f) const {
    if (!on_track()) return;
    for (size_t j = static_cast<size_t>(pos_); j < order_.size(); ++j)
      if (!f(order_[j])) return;
  }
  /// True when block b is expected next before more than `window` elements of other blocks
  /// (size_of(u): the elements block u counts for, 0 for those that take no room).
  template <class F>
  bool needed_within(int b, double window, F&& size_of) const {
    bool found = false;
    size_t before = 0;
    ahead([&](int u) {
      if (u == b) return !(found = true);
      before += size_of(u);
      return double(before) <= window;
    });
    return found;
  }
  /// A prefetch's walk over the blocks expected next: those of size_of(u) > 0 elements (the
  /// others take no room and are passed) already held (held(u)) counted in the window, the rest
  /// started (start(u)) in order while `window` elements ahead and `live_cap` held (from `live`
  /// now) allow.
  template <class Size, class Held, class Start>
  void prefetch(double window, double live_cap, size_t live, Size&& size_of, Held&& held, Start&& start) const {
    size_t before = 0;
    ahead([&](int u) {
      const size_t n = size_of(u);
      if (n == 0) return true;
      if (held(u)) {
        before += n;
        return true;
      }
      if (double(before + n) > window || double(live + n) > live_cap) return false;
      start(u);
      before += n;
      live += n;
      return true;
    });
  }

 private:
  enum class State { none, recording, ready };
  std::vector<int> order_;
  State state_ = State::none;
  long pos_ = -1;  // the next expected index in order_; -1: off track
};

}  // namespace hpct::parallel
