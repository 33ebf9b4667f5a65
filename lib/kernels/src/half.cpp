// 16-bit storage conversions (see half.hpp).
#include "hpct/kernels/half.hpp"

#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>

#include "bits.hpp"
#include "split.hpp"
#include "hpct/core/error.hpp"
#include "hpct/kernels/optim.hpp"

namespace hpct::kernels {
namespace {

using detail::bf16_bits;
using detail::bf16_value;
using detail::split;

void require_half(Precision p, const char* op) {
  if (p == Precision::fp32) throw Error(std::string(op) + ": fp32 has no 16-bit storage (use bf16 or fp16)");
}

// Through memory, not by value: Clang's __fp16 (ieee_half there) cannot be a parameter or result.
inline uint16_t fp16_bits(float f) {
  const ieee_half h = static_cast<ieee_half>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
inline float fp16_value(uint16_t u) {
  ieee_half h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

// fp16 through F16C's 8-lane conversions where the build has them (GCC 12 does not vectorize
// _Float16 conversions without AVX512-FP16); the scalar tail and other builds convert one by one.
template <typename Op8, typename Op1>
void fp16_loop(size_t n, Op8 op8, Op1 op1) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) op8(i);
#else
  (void)op8;
#endif
  for (; i < n; ++i) op1(i);
}

}  // namespace

void to_half(const float* x, uint16_t* y, size_t n, Precision p) {
  require_half(p, "to_half");
  if (split(n, [&](size_t lo, size_t hi) { to_half(x + lo, y + lo, hi - lo, p); })) return;
  if (p == Precision::bf16) {
#pragma omp simd
    for (size_t i = 0; i < n; ++i) y[i] = bf16_bits(x[i]);
    return;
  }
  fp16_loop(
      n,
      [&](size_t i) {
#if defined(__F16C__)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
      },
      [&](size_t i) { y[i] = fp16_bits(x[i]); });
}

void from_half(const uint16_t* x, float* y, size_t n, Precision p) {
  require_half(p, "from_half");
  if (split(n, [&](size_t lo, size_t hi) { from_half(x + lo, y + lo, hi - lo, p); })) return;
  if (p == Precision::bf16) {
#pragma omp simd
    for (size_t i = 0; i < n; ++i) y[i] = bf16_value(x[i]);
    return;
  }
  fp16_loop(
      n,
      [&](size_t i) {
#if defined(__F16C__)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
#endif
      },
      [&](size_t i) { y[i] = fp16_value(x[i]); });
}

void add_from_half(const uint16_t* x, float* y, size_t n, Precision p) {
  require_half(p, "add_from_half");
  if (split(n, [&](size_t lo, size_t hi) { add_from_half(x + lo, y + lo, hi - lo, p); })) return;
  if (p == Precision::bf16) {
#pragma omp simd
    for (size_t i = 0; i < n; ++i) y[i] += bf16_value(x[i]);
    return;
  }
  fp16_loop(
      n,
      [&](size_t i) {
#if defined(__F16C__)
        const __m256 h = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), h));
#endif
      },
      [&](size_t i) { y[i] += fp16_value(x[i]); });
}

void accumulate_half(const float* x, uint16_t* y, size_t n, Precision p) {
  require_half(p, "accumulate_half");
  if (split(n, [&](size_t lo, size_t hi) { accumulate_half(x + lo, y + lo, hi - lo, p); })) return;
  if (p == Precision::bf16) {
#pragma omp simd
    for (size_t i = 0; i < n; ++i) y[i] = bf16_bits(bf16_value(y[i]) + x[i]);
    return;
  }
  fp16_loop(
      n,
      [&](size_t i) {
#if defined(__F16C__)
        const __m256 s = _mm256_add_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i))),
                                       _mm256_loadu_ps(x + i));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
      },
      [&](size_t i) { y[i] = fp16_bits(fp16_value(y[i]) + x[i]); });
}

void add_half(const uint16_t* x, uint16_t* y, size_t n, Precision p) {
  require_half(p, "add_half");
  if (split(n, [&](size_t lo, size_t hi) { add_half(x + lo, y + lo, hi - lo, p); })) return;
  if (p == Precision::bf16) {
#pragma omp simd
    for (size_t i = 0; i < n; ++i) y[i] = bf16_bits(bf16_value(y[i]) + bf16_value(x[i]));
    return;
  }
  fp16_loop(
      n,
      [&](size_t i) {
#if defined(__F16C__)
        const __m256 s = _mm256_add_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i))),
                                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
      },
      [&](size_t i) { y[i] = fp16_bits(fp16_value(y[i]) + fp16_value(x[i])); });
}

}  // namespace hpct::kernels
