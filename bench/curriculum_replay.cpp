// How long a data-metric curriculum's resume takes: CurriculumSampler replays every batch drawn
// before the resume iteration (engine/data_sampling.hpp). Times the replay of ITERS iterations of a
// BATCH-sample global batch over an N-sample index (percentile 1 -> 100, fixed_root 2 over ITERS/2
// steps, so clusters keep forming), and prints microseconds per sample drawn.
//
//   inc=$(for d in lib/*/include; do printf -- "-I%s " "$d"; done)
//   mpicxx -O2 -std=c++20 $inc bench/curriculum_replay.cpp lib/engine/src/data/data_sampling.cpp \
//     lib/engine/src/data/curriculum.cpp lib/engine/src/data/random_ltd.cpp build/lib/core/libhpct_core.a -o /tmp/replay
//   /tmp/replay [N ITERS BATCH]     defaults: 1000000 2000 512
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "hpct/engine/data/data_sampling.hpp"

using namespace hpct::engine;

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000000;
  const long long iters = argc > 2 ? std::atoll(argv[2]) : 2000, batch = argc > 3 ? std::atoll(argv[3]) : 512;
  MetricIndex ix;
  ix.order.resize(n);
  ix.sorted.resize(n);
  for (size_t i = 0; i < n; ++i) ix.order[i] = static_cast<int64_t>(i), ix.sorted[i] = double(i);
  MetricCurriculumConfig c;
  c.enabled = true;
  c.metric = "bench";
  c.difficulty_type = "percentile";
  c.schedule.enabled = true;
  c.schedule.key = "bench";
  c.schedule.schedule_type = "fixed_root";
  c.schedule.root_degree = 2;
  c.schedule.min_difficulty = 1, c.schedule.max_difficulty = 100;
  c.schedule.total_curriculum_step = iters / 2, c.schedule.difficulty_step = 1;
  CurriculumSampler s(c, ix, 1, batch);
  const auto t0 = std::chrono::steady_clock::now();
  s.batch(iters - 1);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double samples = double(iters) * double(batch);
  std::printf("replayed %lld iterations x %lld = %.0f samples over a %zu-sample index in %.3f s: %.3f us per sample\n",
              iters, batch, samples, n, sec, sec / samples * 1e6);
}
