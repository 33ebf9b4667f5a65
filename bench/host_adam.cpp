// The host AdamW step (kernels::adamw_runs) over a GPT-2 124M-sized state, for bench/host_adam.sh:
// fp32 gradients (what torch.optim.AdamW updates), and bf16 gradients with the 16-bit copy written
// (ZeRO-Offload's and bf16 CPU training's case); and, as the machine's ceiling, a loop that moves
// the fp32 step's bytes (p, m, v read and written, g read) with no division or root, over the same
// threads and chunks. Prints one JSON line per case: the median of STEPS timed steps after one warm-up.
//   host_adam THREADS [PARAMS=124439808] [STEPS=7]
// Compile line: bench/host_adam.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/optim.hpp"

using namespace hpct::kernels;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: host_adam THREADS [PARAMS] [STEPS]\n");
    return 2;
  }
  const int threads = std::atoi(argv[1]);
  const size_t P = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 124439808;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 7;
  BackendScope scope;
  set_optimizer_threads(threads);
  std::vector<float> p(P, 0.01f), m(P, 0.0f), v(P, 0.0f), g(P);
  for (size_t i = 0; i < P; ++i) g[i] = 1e-3f * float(int(i % 2001) - 1000);
  std::vector<uint16_t> g16(P), p16(P);
  to_half(g.data(), g16.data(), P, Precision::bf16);
  // GPT-2's tensors are 0.8K to 38.6M elements; runs of 1M elements cut the state the same way.
  const size_t run = 1 << 20;
  for (bool half : {false, true}) {
    std::vector<AdamwRun> runs;
    for (size_t lo = 0; lo < P; lo += run) {
      AdamwRun r;
      r.n = std::min(run, P - lo);
      r.param = p.data() + lo, r.m = m.data() + lo, r.v = v.data() + lo;
      if (half) r.grad16 = g16.data() + lo, r.param16 = p16.data() + lo;
      else r.grad = g.data() + lo;
      r.weight_decay = 0.1f;
      runs.push_back(r);
    }
    AdamwArgs a;
    a.lr = 1e-4f, a.precision = half ? Precision::bf16 : Precision::fp32;
    std::vector<double> t;
    for (int s = 0; s <= steps; ++s) {
      a.step = s + 1;
      const auto t0 = std::chrono::steady_clock::now();
      adamw_runs(runs.data(), runs.size(), a, nullptr);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > 0) t.push_back(dt);
    }
    std::sort(t.begin(), t.end());
    std::printf("{\"program\": \"hpctrain\", \"grad\": \"%s\", \"threads\": %d, \"isa\": \"%s\", \"params\": %zu, "
                "\"step_seconds\": %.6f}\n",
                half ? "bf16 (+bf16 copy)" : "fp32", optimizer_threads(), optimizer_isa(), P, t[t.size() / 2]);
  }
  // The ceiling: the same bytes, multiply-adds only (what the step would take if dividing and
  // rooting were free), chunked and shared as adamw_runs shares its chunks.
  std::vector<double> t;
  const float* gp = g.data();
  float *pp = p.data(), *mp = m.data(), *vp = v.data();
  for (int s = 0; s <= steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads)
    for (size_t lo = 0; lo < P; lo += 8192) {
      const size_t hi = std::min(P, lo + 8192);
#pragma omp simd
      for (size_t i = lo; i < hi; ++i) {
        const float mi = 0.9f * mp[i] + 0.1f * gp[i], vi = 0.999f * vp[i] + 0.001f * gp[i] * gp[i];
        mp[i] = mi, vp[i] = vi;
        pp[i] = pp[i] * 0.99999f - 1e-7f * (mi + vi);
      }
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) t.push_back(dt);
  }
  std::sort(t.begin(), t.end());
  std::printf("{\"program\": \"stream, the same bytes (no division)\", \"grad\": \"fp32\", \"threads\": %d, "
              "\"params\": %zu, \"step_seconds\": %.6f}\n",
              threads, P, t[t.size() / 2]);
  return 0;
}
