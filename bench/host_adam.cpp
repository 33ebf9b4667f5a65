// The host AdamW step (kernels::adamw_runs) over a GPT-2 124M-sized state, for bench/host_adam.sh:
// fp32 gradients (what torch.optim.AdamW updates), and bf16 gradients with the 16-bit copy written
// (ZeRO-Offload's and bf16 CPU training's case). Prints one JSON line per case: the median of
// STEPS timed steps after one warm-up.
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
  return 0;
}
