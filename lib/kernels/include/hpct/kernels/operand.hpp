// hpct/kernels/operand.hpp — a GEMM input as the caller holds it (fp32 values, 16-bit values, or
// both), and where an op writes one (fp32 or 16-bit).
//
// What it is: the two forms a matrix op's input may come in, so that a weight whose store keeps a
// 16-bit copy (a mixed-precision run's parameters) reaches the GEMM as those 2-byte values and a
// device backend reads half the bytes and runs its tensor cores on native 16-bit inputs. What it
// is not: a tensor. It carries no shape, and which 16-bit format `h` holds is the op's Precision.
// Trade-off: both forms may be given, and the backend picks the one it computes from fastest (the
// CPU: the fp32 values, rounded as precision.hpp says; a device: the 16-bit ones). That is exact
// only because `h`, where both are given, is the rounding of `f` to the op's precision (a
// mixed-precision parameter's fp32 value is its 16-bit copy widened), so either form gives the
// same GEMM inputs.
#pragma once
#include <cstddef>
#include <cstdint>

#include "hpct/kernels/precision.hpp"

namespace hpct::kernels {

struct Operand {
  const float* f = nullptr;     // fp32 values (nullptr: only the 16-bit ones)
  const uint16_t* h = nullptr;  // the same values rounded to the op's 16-bit precision (nullptr: none)

  Operand() = default;
  /// An fp32 input, as every op took before there were two forms (implicit on purpose: a plain
  /// pointer is still an operand).
  Operand(const float* values) : f(values) {}  // NOLINT(google-explicit-constructor)
  Operand(const float* values, const uint16_t* rounded) : f(values), h(rounded) {}
  /// Only 16-bit values.
  static Operand half(const uint16_t* rounded) { return Operand(nullptr, rounded); }
  bool empty() const { return !f && !h; }
  /// The operand `elements` further on (a row block's), in each form it has.
  Operand at(size_t elements) const { return Operand(f ? f + elements : nullptr, h ? h + elements : nullptr); }
};

/// Where an op writes an activation that GEMMs read next: its fp32 values, or only its 16-bit values
/// in format p, which halve what is kept and what every later read costs. A backend writing the
/// 16-bit form computes each value in fp32 as it would for the fp32 form and rounds it once, to
/// nearest even, as it stores it: the 16-bit form is the rounding of the fp32 one, which is all the
/// GEMMs that read it would have used of it.
struct Output {
  float* f = nullptr;
  uint16_t* h = nullptr;
  Precision p = Precision::fp32;  // h's format (bf16 or fp16)

  Output() = default;
  /// fp32 values (implicit on purpose, as Operand's).
  Output(float* values) : f(values) {}  // NOLINT(google-explicit-constructor)
  static Output half(uint16_t* rounded, Precision p) {
    Output o;
    o.h = rounded, o.p = p;
    return o;
  }
  /// What was written, as a later op's input.
  Operand operand() const { return Operand(f, h); }
  Output at(size_t elements) const {
    Output o = *this;
    if (f) o.f += elements;
    if (h) o.h += elements;
    return o;
  }
};

}  // namespace hpct::kernels
