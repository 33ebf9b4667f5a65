// The CUDA OpsBackend (ops_backend.hpp): the kernels of cuda_ops.hpp and cuBLAS on one stream.
//
// GEMMs: the linear layers' products are linear_gemms.hpp's (on 16-bit inputs where the operands
// come in 16 bits); fp32 computes in fp32 (no TF32); bf16 and fp16 allow cuBLAS to round fp32 inputs
// to 16 bits and accumulate in fp32: the CPU's contract. fp16 overflow is still seen: the ZeRO engine
// rounds gradients to fp16 on the host. Attention, two kernels (attention_kernel() says which serves
// a model): cuDNN's fused flash-class kernel (fused_attention.hpp) for bf16/fp16 (its dropout mask is
// cuDNN's Philox stream, not dropout.hpp's), on q, k, v rounded to 16 bits (kept as its state with
// its output and row statistics); otherwise the materialised one (materialised_attention.hpp: the
// full T x T probabilities kept per layer).
// Status: compiled in every CUDA build; runs only where a GPU is (tests/model/test_gpt_cuda.cpp
// compares a whole GPT on it with the CPU backend; tests/kernels/test_kernels_cuda.cpp covers the
// element-wise kernels).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "checks.hpp"
#include "fused_attention.hpp"
#include "linear_gemms.hpp"
#include "materialised_attention.hpp"
#include "pinned_uploads.hpp"
#include "transfer_queues.hpp"
#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"
#include "hpct/kernels/ops_backend.hpp"

namespace hpct::kernels {
namespace {

using cuda::check;

class CudaOps final : public OpsBackend {
 public:
  explicit CudaOps(int device) {
    check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    name_ = "cuda:" + std::to_string(device) + " (" + prop.name + ")";
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    fused_ = std::make_unique<cuda::FusedAttention>(stream_, prop.major);
    transfers_ = std::make_unique<cuda::TransferQueues>(stream_);
    cudaMemPool_t pool = nullptr;
    uint64_t keep = UINT64_MAX;
    check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS) {
      cudaStreamDestroy(stream_);
      throw Error("CUDA backend: cublasCreate failed on " + name_);
    }
    if (cublasSetStream(blas_, stream_) != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(blas_);
      cudaStreamDestroy(stream_);
      throw Error("CUDA backend: cublasSetStream failed on " + name_);
    }
    linear_ = std::make_unique<cuda::LinearGemms>(blas_, stream_);
    plain_ = std::make_unique<cuda::MaterialisedAttention>(blas_, stream_);
  }
  ~CudaOps() override {
    cudaStreamSynchronize(stream_);  // every upload out of the pinned slots has finished
    fused_.reset();
    transfers_.reset();  // waits for its copy streams
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    uploads_.reset();
    linear_.reset();
    plain_.reset();
    if (work_) cudaFreeAsync(work_, stream_);
    if (sums_) cudaFreeAsync(sums_, stream_);
    if (runs_dev_) cudaFreeAsync(runs_dev_, stream_);
    cudaStreamSynchronize(stream_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  std::string name() const override { return name_; }
  bool host_memory() const override { return false; }
  // Its linears run on native 16-bit inputs (linear_gemms.hpp) where the activations come in 16 bits.
  bool half_activations(Precision p) const override { return p != Precision::fp32; }
  bool half_pre_activations(Precision p) const override { return p != Precision::fp32; }
  bool device_memory(size_t* free_bytes, size_t* total_bytes) const override {
    check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo on " + name_);
    return true;
  }
  size_t scratch_bytes() const override {
    return work_bytes_ + plain_->scratch_bytes() + fused_->scratch_bytes() + linear_->scratch_bytes();
  }

  // Stream-ordered: a buffer freed here is reused by a later allocation on the same stream without
  // a device synchronization (cudaFree waits for the whole device), and the pool keeps what it
  // reserved (the release threshold is raised in the constructor), so ZeRO-Offload's per-block
  // working buffers cost no cudaMalloc after the first step.
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    check(cudaMallocAsync(&p, bytes ? bytes : 1, stream_), "cudaMallocAsync of " + std::to_string(bytes) + " bytes on " + name_);
    return p;
  }
  void release(void* p) noexcept override { cudaFreeAsync(p, stream_); }
  void zero(void* p, size_t bytes) override { check(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemsetAsync"); }
  // The caller may reuse src as soon as this returns. A small copy (tokens, targets, a routing
  // table) goes through a pinned slot (pinned_uploads.hpp), so the device is not drained once per
  // micro-step; a large one (or where pinned memory cannot be had) is copied from src and waited for.
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    if (uploads_->upload(dst, src, bytes, stream_)) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copy to the device");
    check(cudaStreamSynchronize(stream_), "copy to the device");
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to the host");
    check(cudaStreamSynchronize(stream_), "copy to the host (or an earlier kernel)");
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "synchronize (an earlier kernel)"); }
  void* queue_handle() override { return stream_; }
  // Transfers on copy streams of their own (transfer_queues.hpp), page-locked host memory.
  void* allocate_host(size_t bytes) override { return transfers_->allocate_host(bytes); }
  void release_host(void* p) noexcept override { transfers_->release_host(p); }
  bool pin_host(void* p, size_t bytes) override {
    if (!p || !bytes) return false;
    if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) return true;
    cudaGetLastError();  // clear the failed call's error: the caller copies through its own slots
    return false;
  }
  void unpin_host(void* p) noexcept override {
    if (p && cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
  }
  Transfer download_async(void* dst, const void* src, size_t bytes) override {
    return bytes ? transfers_->download(dst, src, bytes) : 0;
  }
  Transfer upload_async(void* dst, const void* src, size_t bytes) override {
    return bytes ? transfers_->upload(dst, src, bytes) : 0;
  }
  bool transfer_done(Transfer t) override { return transfers_->done(t); }
  void wait_transfer(Transfer t) override { transfers_->wait(t); }
  void await_transfer(Transfer t) override { transfers_->order_compute_after(t); }
  // Up to 256 MiB of logits per block, in multiples of 256 rows (fp32: 1280 at GPT-2's 50304
  // columns, 7 blocks of a 8192-row micro-batch instead of 32, each re-reading the embedding's
  // gradient; 16-bit: 2560, 4 blocks), never fewer rows than the CPU's 256 nor more than 8192.
  int head_rows(int columns, int logit_bytes) const override {
    const size_t fit = (size_t(256) << 20) / (size_t(logit_bytes > 0 ? logit_bytes : 4) * size_t(columns > 0 ? columns : 1));
    return static_cast<int>(std::clamp<size_t>(fit / 256 * 256, 256, 8192));
  }
  // CUDA events on the stream: what the GPU spent between two points of the step, not the time the
  // host took to queue it.
  int mark() override {
    if (used_marks_ == marks_.size()) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreate(&e), "cudaEventCreate (a timer)");
      marks_.push_back(e);
    }
    check(cudaEventRecord(marks_[used_marks_], stream_), "cudaEventRecord (a timer)");
    return static_cast<int>(used_marks_++);
  }
  double marked_seconds(int from, int to) override {
    if (from < 0 || to < 0 || size_t(from) >= used_marks_ || size_t(to) >= used_marks_) return 0;
    check(cudaEventSynchronize(marks_[to]), "cudaEventSynchronize (a timer, or an earlier kernel)");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, marks_[from], marks_[to]), "cudaEventElapsedTime");
    return ms * 1e-3;
  }
  void clear_marks() override { used_marks_ = 0; }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst == src || bytes == 0) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy on the device");
  }

  void widen_half(float* dst, const uint16_t* src, size_t n, Precision p) override {
    if (p == Precision::fp32) throw Error("CUDA backend: widen_half needs bf16 or fp16");
    cuda::widen_half(dst, src, n, p == Precision::bf16, stream_);
  }
  void accumulate_half(uint16_t* acc, const float* src, size_t n, Precision p) override {
    if (p == Precision::fp32) throw Error("CUDA backend: accumulate_half needs bf16 or fp16");
    cuda::accumulate_half(acc, src, n, p == Precision::bf16, stream_);
  }

  // The optimizer step: one multi-tensor launch. The runs' table goes to the device only when it
  // changed (an engine passes the same runs every step), so a steady step copies nothing in.
  void adamw(const AdamwRun* runs, size_t count, const AdamwArgs& a, double* sums) override {
    if (a.step < 1) throw Error("CUDA backend: adamw: step is 1-based, got " + std::to_string(a.step));
    std::vector<cuda::DeviceAdamwRun> table;
    std::vector<unsigned> first{0};
    for (size_t k = 0; k < count; ++k) {
      const AdamwRun& r = runs[k];
      if (r.n == 0) continue;  // an empty run may carry no pointers
      if ((r.grad != nullptr) == (r.grad16 != nullptr)) throw Error("CUDA backend: adamw: a run needs exactly one of grad and grad16");
      table.push_back({r.param, r.grad, r.grad16, r.m, r.v, r.param16, r.n, r.weight_decay});
      const size_t tiles = first.back() + (r.n + cuda::kAdamwTile - 1) / cuda::kAdamwTile;
      if (tiles > 0x7fffffffu) throw Error("CUDA backend: adamw: more than 2^31 tiles of state in one step");
      first.push_back(static_cast<unsigned>(tiles));
    }
    if (table.empty()) return;
    const size_t tb = table.size() * sizeof(cuda::DeviceAdamwRun), fb = first.size() * sizeof(unsigned);
    if (tb != runs_table_.size() - runs_first_bytes_ || fb != runs_first_bytes_ ||
        std::memcmp(runs_table_.data(), table.data(), tb) != 0 ||
        std::memcmp(runs_table_.data() + tb, first.data(), fb) != 0) {
      runs_table_.assign(reinterpret_cast<const char*>(table.data()), reinterpret_cast<const char*>(table.data()) + tb);
      runs_table_.insert(runs_table_.end(), reinterpret_cast<const char*>(first.data()),
                         reinterpret_cast<const char*>(first.data()) + fb);
      runs_first_bytes_ = fb;
      char* dev = reinterpret_cast<char*>(grown(runs_dev_, runs_dev_bytes_, (runs_table_.size() + 3) / 4));
      copy_from_host(dev, runs_table_.data(), runs_table_.size());
    }
    const char* dev = static_cast<const char*>(runs_dev_);
    const float bc1 = (float)(1.0 - std::pow((double)a.beta1, a.step));
    const float bc2 = (float)(1.0 - std::pow((double)a.beta2, a.step));
    cuda::adamw_multi(reinterpret_cast<const cuda::DeviceAdamwRun*>(dev), reinterpret_cast<const unsigned*>(dev + tb),
                      (int)table.size(), first.back(), a.lr, a.beta1, a.beta2, a.eps, bc1, bc2, a.grad_scale,
                      a.precision == Precision::bf16, stream_);
    if (!sums) return;
    for (size_t k = 0; k < count; ++k) {  // the state norms (a logging option): a reduction per array
      if (!runs[k].norms || runs[k].n == 0) continue;
      sums[0] += sum_squares(runs[k].param, runs[k].n);
      sums[1] += sum_squares(runs[k].m, runs[k].n);
      sums[2] += sum_squares(runs[k].v, runs[k].n);
    }
  }
  double sum_squares(const float* x, size_t n) override { return reduce_squares(x, nullptr, n, Precision::fp32); }
  double sum_squares_half(const uint16_t* x, size_t n, Precision p) override {
    if (p == Precision::fp32) throw Error("CUDA backend: sum_squares_half needs bf16 or fp16");
    return reduce_squares(nullptr, x, n, p);
  }
  double count_zeros(const float* x, size_t n) override { return reduce_zeros(x, nullptr, n); }
  double count_zeros_half(const uint16_t* x, size_t n) override { return reduce_zeros(nullptr, x, n); }
  void narrow_half(uint16_t* dst, const float* src, size_t n, Precision p) override {
    if (p == Precision::fp32) throw Error("CUDA backend: narrow_half needs bf16 or fp16");
    cuda::narrow_half(dst, src, n, p == Precision::bf16, stream_);
  }
  void add_half(uint16_t* acc, const uint16_t* x, size_t n, Precision p) override {
    if (p == Precision::fp32) throw Error("CUDA backend: add_half needs bf16 or fp16");
    cuda::add_half(acc, x, n, p == Precision::bf16, stream_);
  }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       const int32_t* pos) override {
    cuda::encoder_forward(out, tokens, wte, wpe, B, T, C, pos, stream_);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        const int32_t* pos) override {
    cuda::encoder_backward(dwte, dwpe, dout, tokens, B, T, C, pos, stream_);
  }
  void layernorm_forward(Output out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                         int N, int C) override {
    if (out.h) cuda::layernorm_forward(act(out), mean, rstd, inp, weight, bias, N, C, stream_);  // fusions.cu's
    else cuda::layernorm_forward(out.f, mean, rstd, inp, weight, bias, N, C, stream_);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C) override {
    cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                             workspace(cuda::column_sum_workspace(N, C)), stream_);
  }

  void rmsnorm_forward(Output out, float* rstd, const float* inp, const float* weight, int N, int C) override {
    if (out.h) cuda::rmsnorm_forward(act(out), rstd, inp, weight, N, C, stream_);
    else cuda::rmsnorm_forward(out.f, rstd, inp, weight, N, C, stream_);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int N, int C) override {
    cuda::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C, workspace(cuda::column_sum_workspace(N, C)),
                           stream_);
  }
  void matmul_forward(float* out, Operand inp, Operand weight, const float* bias, int N, int C, int OC,
                      Precision p) override {
    require_sizes("matmul_forward", N, C, OC);
    linear_->forward(out, inp, weight, N, C, OC, p, bias);  // the bias in the GEMM where cuBLASLt serves
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, Operand inp, Operand weight,
                       int N, int C, int OC, Precision p) override {
    require_sizes("matmul_backward", N, C, OC);
    linear_->backward(dinp, 1.0f, dweight, dout, inp, weight, N, C, OC, p);
    if (dbias) cuda::bias_backward(dbias, dout, N, OC, workspace(cuda::column_sum_workspace(N, OC)), stream_);
  }

  AttentionKernel attention_kernel(int B, int T, int C, int NH, Precision p, AttentionUse use) const override {
    const std::string why = fused_->refusal(B, T, C, NH, p, use);
    if (why.empty()) return {true, fused_->describe(p, use), true, true};  // its state: 16-bit q, k, v; its dqkv 16-bit
    return {false, "materialised softmax (B x NH x T x T probabilities kept per layer; not the fused kernel: " + why + ")"};
  }
  void allow_fused_attention(bool allow) override { fused_->allow(allow); }
  size_t attention_state_floats(int B, int T, int C, int NH, Precision p, AttentionUse use) const override {
    if (!fused_->refusal(B, T, C, NH, p, use).empty()) return (size_t)B * NH * T * T;
    return cuda::FusedAttention::state_floats(B, T, C, NH, use);
  }
  void attention_forward(Output y, float* att, const float* qkv, int B, int T, int C, int NH, Precision p,
                         const Dropout* drop, const int32_t* key_start, AttentionUse use) override {
    require_heads("attention_forward", B, T, C, NH);
    if (fused_->refusal(B, T, C, NH, p, use).empty()) {
      fused_->forward(y.f, y.h, att, qkv, B, T, C, NH, p, drop, key_start, use);
      return;
    }
    plain_->forward(y, att, qkv, B, T, C, NH, p, drop, key_start);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, Operand out, int B, int T,
                          int C, int NH, Precision p, const Dropout* drop, AttentionUse use) override {
    attention_gradient(dqkv, nullptr, dout, qkv, att, out, B, T, C, NH, p, drop, use, true);
  }
  // Written: the fused kernel widens instead of adding (a 16-bit dqkv: cuDNN writes it there), the
  // GEMMs run with beta 0 (each of dq, dk and dv is one GEMM's output): no memset first. A 16-bit
  // dqkv from the materialised kernel: its fp32 gradient rounded after (the default).
  void attention_backward_into(Output dqkv, const float* dout, const float* qkv, const float* att, Operand out, int B,
                               int T, int C, int NH, Precision p, const Dropout* drop, AttentionUse use) override {
    require_heads("attention_backward_into", B, T, C, NH);
    if (dqkv.h && dqkv.p != p) throw Error("CudaOps::attention_backward_into: a 16-bit dqkv must be in the op's format");
    if (dqkv.h && !fused_->refusal(B, T, C, NH, p, use).empty()) {
      OpsBackend::attention_backward_into(dqkv, dout, qkv, att, out, B, T, C, NH, p, drop, use);
      return;
    }
    attention_gradient(dqkv.f, dqkv.h, dout, qkv, att, out, B, T, C, NH, p, drop, use, false);
  }
  void attention_gradient(float* dqkv, uint16_t* dqkv16, const float* dout, const float* qkv, const float* att,
                          Operand out, int B, int T, int C, int NH, Precision p, const Dropout* drop, AttentionUse use,
                          bool accumulate) {
    require_heads("attention_backward", B, T, C, NH);
    if (fused_->refusal(B, T, C, NH, p, use).empty()) {
      fused_->backward(dqkv, dqkv16, dout, att, out.h, B, T, C, NH, p, drop, use, accumulate);
      return;
    }
    plain_->backward(dqkv, dout, qkv, att, B, T, C, NH, p, drop, accumulate);
  }

  void dropout(float* x, size_t rows, int C, const Dropout& d) override { cuda::dropout(x, rows, C, d, stream_); }
  void gelu_forward(Output out, const float* inp, size_t n) override {
    if (out.h) cuda::gelu_forward(act(out), inp, n, stream_);  // fusions.cu's
    else cuda::gelu_forward(out.f, inp, n, stream_);
  }
  void swiglu_forward(Output out, const float* inp, size_t rows, int F) override {
    if (out.h) cuda::swiglu_forward(act(out), inp, rows, F, stream_);
    else cuda::swiglu_forward(out.f, inp, rows, F, stream_);
  }
  void expand_kv(float* out, const float* inp, size_t rows, int C, int NH, int KV) override {
    cuda::expand_kv(out, inp, rows, C, NH, KV, stream_);
  }
  void reduce_kv(float* dinp, const float* dout, size_t rows, int C, int NH, int KV) override {
    cuda::reduce_kv(dinp, dout, rows, C, NH, KV, stream_);
  }
  void rope(float* qkv, int B, int T, int C, int NH, int KV, int rot, float theta, const int32_t* pos,
            bool inverse) override {
    cuda::rope(qkv, B, T, C, NH, KV, rot, theta, pos, inverse, stream_);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, size_t rows, int F) override {
    cuda::swiglu_backward(dinp, inp, dout, rows, F, stream_);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    cuda::gelu_backward(dinp, inp, dout, n, stream_);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) override {
    cuda::residual_forward(out, a, b, n, stream_);
  }
  void add_scaled(float* y, const float* x, float a, size_t n) override { cuda::add_scaled(y, x, a, n, stream_); }
  void residual_layernorm_forward(float* res, Output out, float* mean, float* rstd, const float* a, const float* b,
                                  const float* weight, const float* bias, int N, int C) override {
    cuda::residual_layernorm_forward(res, act(out), mean, rstd, a, b, weight, bias, N, C, stream_);
  }
  void residual_rmsnorm_forward(float* res, Output out, float* rstd, const float* a, const float* b,
                                const float* weight, int N, int C) override {
    cuda::residual_rmsnorm_forward(res, act(out), rstd, a, b, weight, N, C, stream_);
  }
  // The GEMM writes pre (or, for a 16-bit pre, the scratch `wide`) without its bias; the bias is
  // added in the GELU's pass, which rounds a 16-bit pre there (fusions.cu).
  void matmul_gelu_forward(Output pre, Output a, Operand inp, Operand weight, const float* bias, float* wide, int N,
                           int C, int OC, Precision p) override {
    require_sizes("matmul_gelu_forward", N, C, OC);
    if (!pre.h) {
      linear_->forward(pre.f, inp, weight, N, C, OC, p);
      cuda::bias_gelu_forward(pre.f, act(a), bias, N, OC, stream_);
      return;
    }
    require_half("matmul_gelu_forward", pre.p);
    if (!wide) throw Error("CudaOps::matmul_gelu_forward: a 16-bit pre-activation needs the fp32 scratch `wide`");
    linear_->forward(wide, inp, weight, N, C, OC, p);
    cuda::bias_gelu_forward_narrow(wide, pre.h, pre.p == Precision::bf16, act(a), bias, N, OC, stream_);
  }
  // dinp's GEMM with beta 0: no memset first.
  // A 16-bit dout goes to the GEMMs as it is (no narrowing pass) and its bias sum widens it.
  void matmul_backward_into(float* dinp, float* dweight, float* dbias, Operand dout, Operand inp,
                            Operand weight, int N, int C, int OC, Precision p) override {
    require_sizes("matmul_backward_into", N, C, OC);
    if (!dout.f && dout.h) require_half("matmul_backward_into", p);
    linear_->backward(dinp, 0.0f, dweight, dout, inp, weight, N, C, OC, p);
    if (!dbias) return;
    float* ws = workspace(cuda::column_sum_workspace(N, OC));
    if (dout.f) cuda::bias_backward(dbias, dout.f, N, OC, ws, stream_);
    else cuda::bias_backward_half(dbias, dout.h, p == Precision::bf16, N, OC, ws, stream_);
  }
  void gelu_backward_into(Output dinp, Operand inp, const float* dout, size_t n, Precision p) override {
    if (inp.f || !inp.h) {
      if (dinp.h) throw Error("CudaOps::gelu_backward_into: a 16-bit gradient is written from a 16-bit input only");
      cuda::gelu_backward(dinp.f, inp.f, dout, n, stream_, /*accumulate=*/false);
      return;
    }
    require_half("gelu_backward_into", p);
    if (dinp.h && dinp.p != p) throw Error("CudaOps::gelu_backward_into: the gradient's 16 bits must be the input's");
    cuda::gelu_backward_half(dinp.h ? nullptr : dinp.f, dinp.h, inp.h, p == Precision::bf16, dout, n, stream_);
  }
  bool half_logits(Precision p) const override { return p != Precision::fp32; }
  void matmul_forward_half(uint16_t* out, Operand inp, Operand weight, int N, int C, int OC, Precision p) override {
    require_sizes("matmul_forward_half", N, C, OC);
    require_half("matmul_forward_half", p);
    linear_->forward_half(out, inp, weight, N, C, OC, p);
  }
  void softmax_cross_entropy_half(uint16_t* logits_inout, float* losses, const int32_t* targets, float dloss, int N,
                                  int V, int Vp, Precision p) override {
    require_half("softmax_cross_entropy_half", p);
    cuda::softmax_cross_entropy_half(logits_inout, losses, targets, dloss, N, V, Vp, p == Precision::bf16, stream_);
  }
  void matmul_backward_half(float* dinp, float* dweight, const uint16_t* dout, Operand inp, Operand weight, int N, int C,
                            int OC, Precision p) override {
    require_sizes("matmul_backward_half", N, C, OC);
    require_half("matmul_backward_half", p);
    linear_->backward(dinp, 1.0f, dweight, Operand(nullptr, dout), inp, weight, N, C, OC, p);
  }
  void softmax_cross_entropy(float* logits_inout, float* losses, const int32_t* targets, float dloss, int N, int V,
                             int Vp) override {
    cuda::softmax_cross_entropy(logits_inout, losses, targets, dloss, N, V, Vp, stream_);
  }

  void vocab_rows(float* out, const float* part, const int32_t* ids, size_t N, int width, int first,
                  int count) override {
    cuda::vocab_rows(out, part, ids, N, width, first, count, stream_);
  }
  void vocab_rows_backward(float* dpart, const float* dout, const int32_t* ids, size_t N, int width, int first,
                           int count) override {
    cuda::vocab_rows_backward(dpart, dout, ids, N, width, first, count, stream_);
  }
  void add_position_rows(float* out, const float* wpe, const int32_t* pos, size_t first, size_t rows, int T,
                         int C) override {
    cuda::add_position_rows(out, wpe, pos, first, rows, T, C, stream_);
  }
  void vocab_ce_max(float* mx, const float* logits, int rows, int vl, int valid) override {
    cuda::vocab_ce_max(mx, logits, rows, vl, valid, stream_);
  }
  void vocab_ce_sums(double* sums, const float* logits, const float* mx, const int32_t* targets, int rows, int vl,
                     int vstart, int valid) override {
    cuda::vocab_ce_sums(sums, logits, mx, targets, rows, vl, vstart, valid, stream_);
  }
  void vocab_ce_finish(float* logits, float* losses, const float* mx, const double* sums, const int32_t* targets,
                       float dloss, int rows, int vl, int vstart, int valid, bool backward) override {
    cuda::vocab_ce_finish(logits, losses, mx, sums, targets, dloss, rows, vl, vstart, valid, backward, stream_);
  }

  void gather_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C) override {
    cuda::gather_rows(dst, src, rows, n, C, stream_);
  }
  void scatter_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C) override {
    cuda::scatter_rows(dst, src, rows, n, C, stream_);
  }
  void moe_combine(float* out, const float* y, const int32_t* pos, const float* weight, int N, int K, int C) override {
    cuda::moe_combine(out, y, pos, weight, N, K, C, stream_);
  }
  void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y, const int32_t* pos,
                            const float* weight, int N, int K, int C) override {
    cuda::moe_combine_backward(dy, dweight, dout, y, pos, weight, N, K, C, stream_);
  }
  void moe_dispatch_backward(float* dx, const float* drows, const int32_t* pos, int N, int K, int C) override {
    cuda::moe_dispatch_backward(dx, drows, pos, N, K, C, stream_);
  }
  void multiply(float* out, const float* a, const float* b, size_t n, bool accumulate) override {
    cuda::multiply(out, a, b, n, accumulate, stream_);
  }
  void residual_mix(float* out, float* coef, const float* moe, const float* dense, int N, int C) override {
    cuda::residual_mix(out, coef, moe, dense, N, C, stream_);
  }
  void residual_mix_backward(float* dmoe, float* ddense, float* dlogits, const float* dout, const float* coef,
                             const float* moe, const float* dense, int N, int C) override {
    cuda::residual_mix_backward(dmoe, ddense, dlogits, dout, coef, moe, dense, N, C, stream_);
  }
  void moe_gate_select(const GateRoutes& r, const float* logits, int N, const GateConfig& cfg, uint64_t seed,
                       bool training) override {
    cuda::moe_gate_select(r, logits, N, cfg, seed, training, stream_);
  }
  void moe_gate_assign(const GateRoutes& r, int N, int capacity, const GateConfig& cfg, uint64_t seed) override {
    cuda::moe_gate_assign(r, N, capacity, cfg, seed, stream_);
  }
  void moe_gate_backward(float* dlogits, const GateRoutes& r, const float* logits, const float* dweight, int N,
                         const GateConfig& cfg, float aux_coeff, float z_coeff) override {
    cuda::moe_gate_backward(dlogits, r, logits, dweight, N, cfg, aux_coeff, z_coeff, stream_);
  }

 private:
  static void require_sizes(const char* op, int N, int C, int OC) {
    if (N < 0 || C <= 0 || OC <= 0)
      throw Error(std::string("CUDA backend: ") + op + ": need N >= 0, C > 0, OC > 0 (N=" + std::to_string(N) +
                  ", C=" + std::to_string(C) + ", OC=" + std::to_string(OC) + ")");
  }
  static void require_half(const char* op, Precision p) {
    if (p == Precision::fp32) throw Error(std::string("CUDA backend: ") + op + ": needs bf16 or fp16, not fp32");
  }
  static void require_heads(const char* op, int B, int T, int C, int NH) {
    if (B < 0 || T < 0 || NH <= 0 || C <= 0 || C % NH != 0)
      throw Error(std::string("CUDA backend: ") + op + ": need B, T >= 0 and C > 0 divisible by NH > 0 (C=" +
                  std::to_string(C) + ", NH=" + std::to_string(NH) + ")");
  }

  double reduce_squares(const float* x, const uint16_t* x16, size_t n, Precision p) {
    if (n == 0) return 0.0;
    const unsigned blocks = cuda::sum_squares_blocks(n);
    double* partial = reinterpret_cast<double*>(grown(sums_, sums_bytes_, 2 * (blocks + 1)));
    cuda::sum_squares(partial, x, x16, n, p == Precision::bf16, stream_);
    double s = 0;
    copy_to_host(&s, partial + blocks, sizeof(double));
    return s;
  }
  double reduce_zeros(const float* x, const uint16_t* x16, size_t n) {
    if (n == 0) return 0.0;
    const unsigned blocks = cuda::sum_squares_blocks(n);
    double* partial = reinterpret_cast<double*>(grown(sums_, sums_bytes_, 2 * (blocks + 1)));
    cuda::count_zeros(partial, x, x16, n, stream_);
    double s = 0;
    copy_to_host(&s, partial + blocks, sizeof(double));
    return s;
  }

  // A buffer kept between calls, grown (never shrunk) to `floats`.
  float* grown(void*& p, size_t& bytes, size_t floats) {
    if (floats * sizeof(float) > bytes) {
      if (p) release(p);
      p = nullptr;
      bytes = 0;
      p = allocate(floats * sizeof(float));
      bytes = floats * sizeof(float);
    }
    return static_cast<float*>(p);
  }
  float* workspace(size_t floats) { return grown(work_, work_bytes_, floats); }      // the column sums'
  static cuda::ActOut act(const Output& o) { return {o.f, o.h, o.p == Precision::bf16}; }

  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::TransferQueues> transfers_;  // copy streams beside stream_ (made after it)
  std::unique_ptr<cuda::FusedAttention> fused_;  // cuDNN's attention, on stream_ (made after it)
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<cuda::LinearGemms> linear_;  // the linear layers' GEMMs, on blas_ and stream_
  std::unique_ptr<cuda::MaterialisedAttention> plain_;  // attention where the fused kernel does not serve
  void* work_ = nullptr;
  size_t work_bytes_ = 0;
  void* sums_ = nullptr;  // sum_squares' partial sums
  size_t sums_bytes_ = 0;
  void* runs_dev_ = nullptr;  // adamw's table of runs and their first tiles, on the device
  size_t runs_dev_bytes_ = 0;
  std::vector<char> runs_table_;  // what runs_dev_ holds
  size_t runs_first_bytes_ = 0;
  std::vector<cudaEvent_t> marks_;  // the phase timers' events, reused every step
  size_t used_marks_ = 0;
  std::unique_ptr<cuda::PinnedUploads> uploads_ = std::make_unique<cuda::PinnedUploads>();  // small uploads' slots
};

}  // namespace

bool cuda_ops_available(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = std::string("no usable CUDA device: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  return true;
}

std::unique_ptr<OpsBackend> cuda_ops(int device) {
  std::string why;
  if (!cuda_ops_available(&why)) throw Error("CUDA backend: " + why);
  int n = 0;
  check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  return std::make_unique<CudaOps>(((device % n) + n) % n);
}

}  // namespace hpct::kernels
