// Phase timers and interval reports of the training loop. See train_log.hpp.
#include "train_log.hpp"

#include <algorithm>
#include <cstdio>

namespace hpct::engine::detail {

const char* phase_name(int p) {
  static const char* names[kPhases] = {"data",        "forward",     "backward", "grad_reduce", "optimizer",
                                       "checkpoint",  "gather_wait", "reduce_wait", "nvme",     "iteration"};
  return names[p];
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
  return t;
}

std::string timer_line(const IntervalTimers& t, int level, const std::string& option) {
  std::string line = " time (ms) |";
  char buf[64];
  for (int p = 0; p < kPhases; ++p) {
    if (phase_level(p) > level || p == kIteration) continue;
    line += std::string(" ") + phase_name(p) + ": ";
    if (option == "max") {
      std::snprintf(buf, sizeof buf, "%.2f", t.max(p));
      line += buf;
    } else if (option == "minmax") {
      std::snprintf(buf, sizeof buf, "(%.2f, %.2f)", t.min(p), t.max(p));
      line += buf;
    } else {
      line += "[";
      for (int r = 0; r < t.ranks; ++r) {
        std::snprintf(buf, sizeof buf, "%s%.2f", r ? ", " : "", t.at(r, p));
        line += buf;
      }
      line += "]";
    }
    line += " |";
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

void timer_scalars(const IntervalTimers& t, long long it, std::vector<Scalar>& out) {
  for (int p = 0; p < kPhases; ++p)
    out.push_back({p == kIteration ? "iteration-time/iteration-time" : std::string("timers/") + phase_name(p), t.max(p), it});
}

}  // namespace hpct::engine::detail
