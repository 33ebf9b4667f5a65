// CPU optimizer step and whole-array reductions (see ops.hpp): AdamW, the sum of squares behind the
// gradient norm, the finite check behind the fp16 overflow test, and scaling. Split from cpu_ops.cpp;
// the same chunked SIMD loops (cpu_loops.hpp).
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int step, float grad_scale) {
  require_backend("adamw_update");
  require(step >= 1, "adamw_update", "step is 1-based, got " + std::to_string(step));
  const float bc1 = (float)(1.0 - std::pow((double)beta1, step));
  const float bc2 = (float)(1.0 - std::pow((double)beta2, step));
  for_chunks("adamw_update", n, [=](size_t lo, size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; ++i) {
      const float g = grad[i] * grad_scale;
      const float mi = beta1 * m[i] + (1.0f - beta1) * g;
      const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
      m[i] = mi;
      v[i] = vi;
      const float mhat = mi / bc1, vhat = vi / bc2;
      param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
    }
  });
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

void adamw_runs(const AdamwRun* runs, size_t count, const AdamwArgs& a, double* sums) {
  std::vector<float> tile;
  for (size_t k = 0; k < count; ++k) {
    const AdamwRun& r = runs[k];
    if (r.n == 0) continue;  // an empty run may carry no pointers
    require((r.grad != nullptr) != (r.grad16 != nullptr), "adamw_runs", "each run needs exactly one of grad and grad16");
    auto adam = [&](size_t i, size_t t, const float* g) {
      adamw_update(r.param + i, g, r.m + i, r.v + i, t, a.lr, a.beta1, a.beta2, a.eps, r.weight_decay, a.step,
                   a.grad_scale);
    };
    if (r.grad) {
      adam(0, r.n, r.grad);
    } else {
      tile.resize(std::min(kOptimTile, r.n));
      for (size_t i = 0; i < r.n; i += kOptimTile) {
        const size_t t = std::min(kOptimTile, r.n - i);
        from_half(r.grad16 + i, tile.data(), t, a.precision);
        adam(i, t, tile.data());
      }
    }
    if (r.param16) to_half(r.param, r.param16, r.n, a.precision);
    if (sums && r.norms) {
      sums[0] += sum_of_squares(r.param, r.n);
      sums[1] += sum_of_squares(r.m, r.n);
      sums[2] += sum_of_squares(r.v, r.n);
    }
  }
}

double sum_of_squares_half(const uint16_t* x, size_t n, Precision p) {
  std::vector<float> tile(std::min(kOptimTile, n));
  double s = 0;
  for (size_t i = 0; i < n; i += kOptimTile) {
    const size_t t = std::min(kOptimTile, n - i);
    from_half(x + i, tile.data(), t, p);
    s += sum_of_squares(tile.data(), t);
  }
  return s;
}

}  // namespace hpct::kernels
