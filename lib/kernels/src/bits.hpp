// Private to lib/kernels: bit reinterpretation that GCC 12 vectorizes (it does not vectorize
// loops using std::bit_cast), shared by the GEMM conversions and the element-wise kernels.
#pragma once
#include <cstring>

namespace hpct::kernels::detail {
template <typename To, typename From>
inline To bits_as(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}
}  // namespace hpct::kernels::detail
