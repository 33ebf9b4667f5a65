// Private to lib/kernels: large element-wise host passes (ZeRO-Offload's hand-over of a whole
// model's gradient, the engine's passes over it, copies into page-locked slots) in pieces over the
// host optimizer's threads (optim.hpp optimizer_threads); element-wise, so the bits are those of
// one pass.
#pragma once
#include <algorithm>
#include <cstddef>

#include "hpct/kernels/optim.hpp"

namespace hpct::kernels::detail {

/// Calls span(lo, hi) over [0, n) in pieces on the host optimizer's threads; returns false (the
/// caller runs serially) below 2^20 elements or with one thread.
template <typename Span>
bool split(size_t n, Span span) {
  constexpr size_t kMin = size_t(1) << 20, kPiece = size_t(1) << 16;  // kPiece: a multiple of F16C's 8 lanes
  if (n < kMin) return false;
  const int threads = optimizer_threads();
  if (threads <= 1) return false;
  const size_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t k = 0; k < pieces; ++k) span(k * kPiece, std::min(n, (k + 1) * kPiece));
  return true;
}

}  // namespace hpct::kernels::detail
