// hpct/kernels/half.hpp — 16-bit storage of fp32 values, for bf16 and fp16 training.
//
// What it is: array conversions between fp32 and the 16-bit formats that bf16/fp16 runs store
// parameters and gradients in (2 bytes per value instead of 4), and the accumulation of fp32 values
// into such storage. bf16 rounds to nearest even and keeps NaN a NaN; fp16 is IEEE half, rounding
// to nearest even, with values beyond 65504 becoming inf (what fp16 loss scaling must detect).
// Widening is exact. Plain SIMD loops (F16C for fp16 where the build has it); no backend needed.
// Arrays of 2^20 elements or more are converted in pieces over the host optimizer's threads
// (optim.hpp optimizer_threads), with the same bits.
#pragma once
#include <cstddef>
#include <cstdint>

#include "hpct/kernels/precision.hpp"

namespace hpct::kernels {

/// The C++ type of an IEEE half value. Clang before 15 has no _Float16 on x86 (the sanitizer and
/// fuzz builds use Debian's Clang 14); its __fp16 converts the same way (round to nearest even).
#if defined(__clang__) && __clang_major__ < 15 && (defined(__x86_64__) || defined(__i386__))
using ieee_half = __fp16;
#else
using ieee_half = _Float16;
#endif

/// y[i] = 16-bit(x[i]). p is bf16 or fp16 (fp32 throws).
void to_half(const float* x /*(n)*/, uint16_t* y /*(n)*/, size_t n, Precision p);
/// y[i] = fp32(x[i]), exact.
void from_half(const uint16_t* x /*(n)*/, float* y /*(n)*/, size_t n, Precision p);
/// y[i] += fp32(x[i]).
void add_from_half(const uint16_t* x /*(n)*/, float* y /*(n)*/, size_t n, Precision p);
/// y[i] = 16-bit(fp32(y[i]) + x[i]): one rounding per accumulation, as a 16-bit gradient buffer
/// accumulates on a GPU.
void accumulate_half(const float* x /*(n)*/, uint16_t* y /*(n)*/, size_t n, Precision p);
/// y[i] = 16-bit(fp32(y[i]) + fp32(x[i])): the sum of two 16-bit arrays, added in fp32 and rounded
/// once (commutative; what a 16-bit all-reduce does at each step of its reduction).
void add_half(const uint16_t* x /*(n)*/, uint16_t* y /*(n)*/, size_t n, Precision p);

}  // namespace hpct::kernels
