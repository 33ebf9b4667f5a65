// Private to lib/kernels: bit reinterpretation that GCC 12 vectorizes (it does not vectorize
// loops using std::bit_cast), shared by the GEMM conversions and the element-wise kernels.
#pragma once
#include <cstdint>
#include <cstring>

namespace hpct::kernels::detail {
template <typename To, typename From>
inline To bits_as(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

// fp32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN instead of carrying into inf.
inline uint16_t bf16_bits(float f) {
  const uint32_t u = bits_as<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
}
inline float bf16_value(uint16_t h) { return bits_as<float>(static_cast<uint32_t>(h) << 16); }
inline float bf16_round(float f) { return bf16_value(bf16_bits(f)); }
}  // namespace hpct::kernels::detail
