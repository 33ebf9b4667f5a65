// A large host copy over the host optimizer's threads (see host_copy.hpp).
#include "hpct/kernels/host_copy.hpp"

#include <cstring>

#include "split.hpp"

namespace hpct::kernels {

void host_copy(void* dst, const void* src, size_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (detail::split(bytes, [&](size_t lo, size_t hi) { std::memcpy(d + lo, s + lo, hi - lo); })) return;
  if (bytes) std::memcpy(d, s, bytes);
}

}  // namespace hpct::kernels
