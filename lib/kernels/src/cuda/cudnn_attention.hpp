// cuDNN's fused (flash-class) causal attention for the CUDA backend (internal, not installed).
//
// What it is: the forward and backward of softmax(scale q k^T + causal mask) v on 16-bit q, k, v
// read in place from the packed qkv rows (B, T, 3, NH, HS), through cuDNN's graph API alone
// (cudnn_graph.h: tensor and operation descriptors -> operation graph -> heuristics -> execution
// plan), the graph cuDNN's runtime fusion engine compiles into one flash kernel: the T x T scores
// exist only on chip; the forward keeps one fp32 statistic per row (max + log of the sum) for the
// backward. Plans are built once per shape (a runtime compilation: about a second each).
// libcudnn.so.9 is opened at run time (dlopen): a build or node without it runs the materialised
// kernel, and says why.
// Attention dropout: cuDNN's Philox generator (a Bernoulli mask of the probabilities, regenerated
// in the backward from the same seed), not dropout.hpp's hash: its mask differs from the CPU's and
// depends on the micro-batch (the seed is the site key mixed with the micro-batch's first sample and
// the tensor-parallel head offset; the generator's stream is indexed by the sample's row in it).
// Per-document attention (--reset-attention-mask): each query's first key, an int32 per row, masks
// the keys before it (the same mask as the materialised kernel's).
// What it is not: fp32 (the materialised kernel serves it).
// Status: compiled in every CUDA build; never run here (no GPU on the development machine). The
// gpu-labelled tests (test_ops_backend_cuda: FusedAttention*) compare it with the materialised
// kernel; where cuDNN finds no engine for the graph, prepare() says so and the backend keeps the
// materialised kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

namespace hpct::kernels::cuda {
namespace cudnn {
struct Library;  // cudnn_graph.hpp
}

/// One attention call's shape: B samples of T tokens, NH heads of HS channels; fp16 or bf16 inputs;
/// the probability of attention dropout (0: none), which is part of the plan.
struct FusedShape {
  int B = 0, T = 0, NH = 0, HS = 0;
  bool fp16 = false;
  float dropout = 0.0f;
  bool documents = false;  // per-document attention: each query's first key given (key_start)
  bool operator<(const FusedShape& o) const {
    return std::tie(B, T, NH, HS, fp16, dropout, documents) <
           std::tie(o.B, o.T, o.NH, o.HS, o.fp16, o.dropout, o.documents);
  }
};

class CudnnAttention {
 public:
  /// Loads libcudnn.so.9 and makes a handle on `stream`; nullptr with the reason in *why where it
  /// cannot (no library, no device). prepare() refuses shapes an older 9.x mishandles.
  static std::unique_ptr<CudnnAttention> open(cudaStream_t stream, std::string* why);
  /// Without a GPU: builds both plans for s as prepare() does, for the device `device_json`
  /// describes (cuDNN's device-properties JSON, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION), so that
  /// cuDNN's acceptance of the graphs is checked where no GPU is. "" when both build, else why.
  static std::string check_offline(const FusedShape& s, const std::string& device_json);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  /// The library's version, "9.19.0".
  std::string version() const;
  /// Builds the forward and backward plans for s once; false with the reason (cuDNN's message) in
  /// *why where it has no engine for them.
  bool prepare(const FusedShape& s, std::string* why);
  /// Device bytes forward / backward need as `workspace` for s (after prepare): the plans' own and
  /// the backward's fp32 dq accumulator and row sums.
  size_t forward_workspace(const FusedShape& s) const;
  size_t backward_workspace(const FusedShape& s) const;
  /// o (B, T, NH, HS) and stats (B, NH, T) from the packed 16-bit qkv (B, T, 3 x NH x HS); with
  /// s.dropout, the probabilities dropped by the mask of `seed`.
  /// With s.documents, key_start (B, T; device memory) is each query's first key.
  void forward(const FusedShape& s, const void* qkv, void* o, float* stats, void* workspace, int64_t seed = 0,
               const int32_t* key_start = nullptr);
  /// dqkv (16-bit, packed as qkv; overwritten) from dout (as o) and what forward saw and kept (the
  /// same seed).
  void backward(const FusedShape& s, const void* qkv, const void* o, const void* dout, const float* stats, void* dqkv,
                void* workspace, int64_t seed = 0, const int32_t* key_start = nullptr);

 private:
  CudnnAttention() = default;
  struct Plans;
  const Plans& plans(const FusedShape& s) const;

  std::unique_ptr<cudnn::Library> lib_;
  void* handle_ = nullptr;  // cudnnHandle_t
  cudaStream_t stream_ = nullptr;  // the backend's, which the handle runs on
  std::map<FusedShape, std::unique_ptr<Plans>> plans_;
  std::map<FusedShape, std::string> refused_;  // shapes cuDNN has no engine for, and its reason
};

}  // namespace hpct::kernels::cuda
