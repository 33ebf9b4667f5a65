// The CUDA backend's fused attention as the backend runs it (internal to lib/kernels): which
// models cuDNN's fused kernel (cudnn_attention.hpp) serves, the state it keeps in the op's `att`
// buffer, and the 16-bit staging of its inputs and gradients around cuDNN.
//
// What it is: the OpsBackend attention contract (ops_backend.hpp) for the calls it serves: fp32
// q, k, v rows rounded to 16 bits (kept as the state with the 16-bit output, one fp32 statistic
// per row and, per document, each query's first key), the output widened to fp32, the gradient
// computed in 16 bits and added to dqkv in fp32. The choice is made once per (channels, heads,
// precision, use), at the first shape asked: later shapes keep it (a state sized for it stays
// right), and a shape cuDNN then refuses is an error, not a silent switch of kernel.
// What it is not: the materialised kernel (the backend keeps that for what this refuses).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "cudnn_attention.hpp"
#include "hpct/kernels/ops_backend.hpp"

namespace hpct::kernels::cuda {

class FusedAttention {
 public:
  /// On the backend's stream, for a device of compute capability sm_major.x.
  FusedAttention(cudaStream_t stream, int sm_major) : stream_(stream), sm_major_(sm_major) {}
  ~FusedAttention();
  FusedAttention(const FusedAttention&) = delete;
  FusedAttention& operator=(const FusedAttention&) = delete;

  /// --attention-kernel plain: never serve (forgets every choice made).
  void allow(bool allow);
  /// "" where the fused kernel serves attention of C channels in NH heads at precision p with
  /// `use` (cuDNN opened and the first shape's plans built here), else why.
  std::string refusal(int B, int T, int C, int NH, Precision p, AttentionUse use) const;
  /// The kernel in words, for a served (p, use): cuDNN's version and what its dropout draws.
  std::string describe(Precision p, AttentionUse use) const;
  /// Floats of the state a served call keeps (attention_state_floats).
  static size_t state_floats(int B, int T, int C, int NH, AttentionUse use);
  /// The op's forward and backward for a served call (contracts as in ops_backend.hpp). out16 (p's
  /// format) instead of out: cuDNN's 16-bit output copied as it is, not widened; where
  /// use.output_kept, written there only (the state has no copy) and read back by backward as
  /// kept16 (the caller's out16, unchanged).
  void forward(float* out, uint16_t* out16, float* att, const float* qkv, int B, int T, int C, int NH, Precision p,
               const Dropout* drop, const int32_t* key_start, AttentionUse use);
  /// accumulate false: dqkv written (attention_backward_into). dqkv16 (p's format) instead of
  /// dqkv: cuDNN's 16-bit gradient written there as it is, not widened (accumulate must be false).
  void backward(float* dqkv, uint16_t* dqkv16, const float* dout, const float* att, const uint16_t* kept16, int B,
                int T, int C, int NH, Precision p, const Dropout* drop, AttentionUse use, bool accumulate = true);
  /// Device bytes held for staging and cuDNN's workspaces.
  size_t scratch_bytes() const { return scratch_bytes_; }

 private:
  struct State;
  static State state(float* att, int B, int T, int C, int NH, AttentionUse use);
  FusedShape plan(int B, int T, int C, int NH, Precision p, const Dropout* drop, AttentionUse use) const;
  void* scratch(size_t bytes);

  cudaStream_t stream_;
  int sm_major_;
  bool allow_ = true;
  mutable bool tried_ = false;  // cuDNN opened on first use
  mutable std::string why_;
  mutable std::unique_ptr<CudnnAttention> cudnn_;
  mutable std::map<std::tuple<int, int, int, float, bool>, std::string> choice_;  // (C, NH, p, use): "" or why
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace hpct::kernels::cuda
