// hpct/kernels/host_copy.hpp — a large copy between host buffers over the host optimizer's threads.
//
// What it is: memcpy for the hand-over's whole-block copies (ZeRO-Offload's page-locked slots, the
// engine's gradient buffers): one core moves about 10 GB/s, a node's cores several times that, and
// at GPT-2 1.3B each step copies 2.6 GB each way. Below 1 MiB, or with one thread, memcpy itself.
#pragma once
#include <cstddef>

namespace hpct::kernels {

/// dst <- src, `bytes` bytes of host memory (not overlapping), in pieces over optimizer_threads().
void host_copy(void* dst, const void* src, size_t bytes);

}  // namespace hpct::kernels
