// CPU optimizer step and whole-array reductions (see ops.hpp, optim.hpp): AdamW (serial, and the
// threaded step over a rank's runs of state, DeepSpeed CPU-Adam's class: OpenMP threads, AVX-512 or
// AVX2 chosen at run time, one pass that reads a 16-bit gradient and writes the 16-bit copy), the
// sum of squares behind the gradient norm, the finite check behind the fp16 overflow test, scaling.
#include <Kokkos_Core.hpp>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "bits.hpp"
#include "cpu_loops.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/ops.hpp"
#include "hpct/kernels/optim.hpp"

namespace hpct::kernels {

using detail::bits_as;
using detail::for_chunks;
using detail::kChunk;
using detail::Policy;
using detail::require;
using detail::require_backend;

namespace {
// AdamW's element loop over [lo, hi): the one body the serial op (adamw_update) and the threaded
// step (adamw_runs) run, so both give the same bits. Compiled for three instruction sets and picked
// once at run time (the build may target an older CPU than the one it runs on); each has FMA where
// the CPU has it, so the choice can move a result by an ulp between CPUs, never between runs.
// The bias corrections are folded into two constants as PyTorch's AdamW and DeepSpeed's CPU-Adam
// fold them: p * (1 - lr wd) - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), with 1 / sqrt(bc2) a
// factor. One square root and one division per element (instead of three divisions and a root):
// those are what bound the loop on a core that streams memory faster than it divides.
struct AdamCoef {
  float beta1, beta2, eps, grad_scale;
  float step_size;     // lr / bc1
  float inv_sqrt_bc2;  // 1 / sqrt(bc2)
  float decay;         // 1 - lr * weight_decay
};
#define HPCT_ADAMW_SPAN(NAME, ATTR)                                                                         \
  ATTR void NAME(float* __restrict param, const float* __restrict grad, float* __restrict m,               \
                 float* __restrict v, size_t lo, size_t hi, AdamCoef c) {                                  \
    _Pragma("omp simd") for (size_t i = lo; i < hi; ++i) {                                                 \
      const float g = grad[i] * c.grad_scale;                                                              \
      const float mi = c.beta1 * m[i] + (1.0f - c.beta1) * g;                                              \
      const float vi = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;                                          \
      m[i] = mi;                                                                                           \
      v[i] = vi;                                                                                           \
      const float denom = __builtin_sqrtf(vi) * c.inv_sqrt_bc2 + c.eps;                                    \
      param[i] = param[i] * c.decay - c.step_size * (mi / denom);                                          \
    }                                                                                                      \
  }
#if defined(__x86_64__)
HPCT_ADAMW_SPAN(adamw_span_v4, __attribute__((target("arch=x86-64-v4"))))
HPCT_ADAMW_SPAN(adamw_span_v3, __attribute__((target("arch=x86-64-v3"))))
#endif
HPCT_ADAMW_SPAN(adamw_span_base, )
#undef HPCT_ADAMW_SPAN

using SpanFn = void (*)(float*, const float*, float*, float*, size_t, size_t, AdamCoef);
struct SpanChoice {
  SpanFn fn;
  const char* isa;
};
SpanChoice pick_span() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return {adamw_span_v4, "AVX-512"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {adamw_span_v3, "AVX2"};
#endif
  return {adamw_span_base, "baseline"};
}
const SpanChoice& span() {
  static const SpanChoice s = pick_span();
  return s;
}

// The constants from the step's scalars, in float as the CUDA kernels compute them from the same
// bias corrections (cuda/optim.cu), so both sides fold alike.
AdamCoef coef(float lr, float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale) {
  const float bc1 = (float)(1.0 - std::pow((double)beta1, step)), bc2 = (float)(1.0 - std::pow((double)beta2, step));
  return {beta1, beta2, eps, grad_scale, lr / bc1, 1.0f / std::sqrt(bc2), 1.0f - lr * weight_decay};
}

std::atomic<int> g_optimizer_threads{0};  // 0: not set, use default_optimizer_threads()
}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int step, float grad_scale) {
  require_backend("adamw_update");
  require(step >= 1, "adamw_update", "step is 1-based, got " + std::to_string(step));
  const AdamCoef c = coef(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  const SpanFn fn = span().fn;
  for_chunks("adamw_update", n, [=](size_t lo, size_t hi) { fn(param, grad, m, v, lo, hi, c); });
}

double sum_of_squares(const float* x, size_t n) {
  require_backend("sum_of_squares");
  const size_t chunks = (n + kChunk - 1) / kChunk;
  double total = 0.0;
  Kokkos::parallel_reduce("sum_of_squares", Policy(0, chunks), KOKKOS_LAMBDA(size_t ch, double& acc) {
    const size_t lo = ch * kChunk, hi = std::min(n, lo + kChunk);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = lo; i < hi; ++i) s += (double)x[i] * (double)x[i];
    acc += s;
  }, total);
  return total;
}

// Looks at the exponent bits (all ones = inf or NaN) instead of summing: an integer OR-reduction
// vectorizes without fast-math, and a sum could overflow to inf on large finite values.
bool all_finite(const float* x, size_t n) {
  require_backend("all_finite");
  const size_t chunks = (n + kChunk - 1) / kChunk;
  int bad = 0;
  Kokkos::parallel_reduce("all_finite", Policy(0, chunks), KOKKOS_LAMBDA(size_t ch, int& acc) {
    const size_t lo = ch * kChunk, hi = std::min(n, lo + kChunk);
    uint32_t any = 0;
#pragma omp simd reduction(| : any)
    for (size_t i = lo; i < hi; ++i) any |= (bits_as<uint32_t>(x[i]) & 0x7f800000u) == 0x7f800000u;
    acc += any ? 1 : 0;
  }, bad);
  return bad == 0;
}

void scale(float* x, float s, size_t n) {
  require_backend("scale");
  for_chunks("scale", n, [=](size_t lo, size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; ++i) x[i] *= s;
  });
}

int default_optimizer_threads() {
  for (const char* var : {"OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"}) {
    const char* e = std::getenv(var);
    char* end = nullptr;
    const long n = e ? std::strtol(e, &end, 10) : 0;
    if (e && end != e && n >= 1 && n <= 4096) return static_cast<int>(n);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

void set_optimizer_threads(int n) {
  require(n >= 0 && n <= 4096, "set_optimizer_threads", "threads must be 0 (the default) to 4096, got " + std::to_string(n));
  g_optimizer_threads = n;
}

namespace {
thread_local int t_thread_cap = 0;  // set_optimizer_threads_here
}

void set_optimizer_threads_here(int n) {
  require(n >= 0 && n <= 4096, "set_optimizer_threads_here", "threads must be 0 (no cap) to 4096, got " + std::to_string(n));
  t_thread_cap = n;
}

int optimizer_threads() {
  const int n = g_optimizer_threads.load();
  const int threads = n > 0 ? n : default_optimizer_threads();
  return t_thread_cap > 0 ? std::min(threads, t_thread_cap) : threads;
}

const char* optimizer_isa() { return span().isa; }

// The step over every run: cut into chunks of kOptimChunk elements (a run's tail is a short
// chunk), the chunks shared among the threads. A chunk is one pass over memory: a 16-bit gradient
// is widened into the thread's tile, the update runs, and the 16-bit copy is rounded from the
// result while it is still in cache. Element-wise, so the threads and their number change no bit.
void adamw_runs(const AdamwRun* runs, size_t count, const AdamwArgs& a, double* sums) {
  require(a.step >= 1, "adamw_runs", "step is 1-based, got " + std::to_string(a.step));
  constexpr size_t kOptimChunk = 8192;
  struct Chunk {
    size_t run, lo, hi;
  };
  std::vector<Chunk> chunks;
  for (size_t k = 0; k < count; ++k) {
    const AdamwRun& r = runs[k];
    if (r.n == 0) continue;  // an empty run may carry no pointers
    require((r.grad != nullptr) != (r.grad16 != nullptr), "adamw_runs", "each run needs exactly one of grad and grad16");
    for (size_t lo = 0; lo < r.n; lo += kOptimChunk) chunks.push_back({k, lo, std::min(r.n, lo + kOptimChunk)});
  }
  const SpanFn fn = span().fn;
  std::vector<AdamCoef> coefs;  // per run (weight decay is per tensor); two pow()s each, once a step
  coefs.reserve(count);
  for (size_t k = 0; k < count; ++k)
    coefs.push_back(coef(a.lr, a.beta1, a.beta2, a.eps, runs[k].weight_decay, a.step, a.grad_scale));
  const int threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(optimizer_threads()), chunks.size()));
  std::string failure;  // an exception may not leave an OpenMP region
#pragma omp parallel num_threads(std::max(threads, 1))
  {
    std::vector<float> tile(kOptimChunk);
#pragma omp for schedule(dynamic, 4)
    for (size_t i = 0; i < chunks.size(); ++i) {
      const Chunk& ch = chunks[i];
      const AdamwRun& r = runs[ch.run];
      const AdamCoef& c = coefs[ch.run];
      const size_t n = ch.hi - ch.lo;
      try {
        if (r.grad) {
          fn(r.param + ch.lo, r.grad + ch.lo, r.m + ch.lo, r.v + ch.lo, 0, n, c);
        } else {
          from_half(r.grad16 + ch.lo, tile.data(), n, a.precision);
          fn(r.param + ch.lo, tile.data(), r.m + ch.lo, r.v + ch.lo, 0, n, c);
        }
        if (r.param16) to_half(r.param + ch.lo, r.param16 + ch.lo, n, a.precision);
      } catch (const std::exception& e) {
#pragma omp critical(hpct_adamw_failure)
        if (failure.empty()) failure = e.what();
      }
    }
  }
  if (!failure.empty()) throw Error("adamw_runs: " + failure);
  if (!sums) return;
  for (size_t k = 0; k < count; ++k) {  // the state norms (a logging option), run by run in order
    const AdamwRun& r = runs[k];
    if (!r.norms || r.n == 0) continue;
    sums[0] += sum_of_squares(r.param, r.n);
    sums[1] += sum_of_squares(r.m, r.n);
    sums[2] += sum_of_squares(r.v, r.n);
  }
}

double count_zeros(const float* x, size_t n) {
  size_t z = 0;
#pragma omp simd reduction(+ : z)
  for (size_t i = 0; i < n; ++i) z += x[i] == 0.0f;
  return static_cast<double>(z);
}

double count_zeros_half(const uint16_t* x, size_t n) {
  size_t z = 0;
#pragma omp simd reduction(+ : z)
  for (size_t i = 0; i < n; ++i) z += (x[i] & 0x7fffu) == 0;
  return static_cast<double>(z);
}

// Tile by tile: each tile widened and summed as sum_of_squares sums (chunks of kChunk, each a SIMD
// reduction, added in order), the tiles' sums added in order; the tiles themselves spread over the
// host optimizer's threads, which changes no bit.
double sum_of_squares_half(const uint16_t* x, size_t n, Precision p) {
  const size_t tiles = (n + kOptimTile - 1) / kOptimTile;
  std::vector<double> part(tiles, 0.0);
  const int threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(optimizer_threads()), tiles));
  std::string failure;
#pragma omp parallel num_threads(std::max(threads, 1))
  {
    std::vector<float> tile(std::min(kOptimTile, n));
#pragma omp for schedule(static)
    for (size_t k = 0; k < tiles; ++k) {
      const size_t lo = k * kOptimTile, t = std::min(kOptimTile, n - lo);
      try {
        from_half(x + lo, tile.data(), t, p);
      } catch (const std::exception& e) {
#pragma omp critical(hpct_sumsq_failure)
        if (failure.empty()) failure = e.what();
        continue;
      }
      double acc = 0.0;
      for (size_t c = 0; c < t; c += kChunk) {
        const size_t hi = std::min(t, c + kChunk);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = c; i < hi; ++i) s += (double)tile[i] * (double)tile[i];
        acc += s;
      }
      part[k] = acc;
    }
  }
  if (!failure.empty()) throw Error("sum_of_squares_half: " + failure);
  double total = 0.0;
  for (double v : part) total += v;
  return total;
}

}  // namespace hpct::kernels
