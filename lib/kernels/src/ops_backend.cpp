// The CPU OpsBackend: ops.hpp on host memory (see ops_backend.hpp). The CUDA one is in
// cuda/ops_backend.cu; without CUDA, cuda_ops() says so.
#include "hpct/kernels/ops_backend.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/moe_ops.hpp"
#include "hpct/kernels/ops.hpp"
#include "hpct/kernels/optim.hpp"
#include "hpct/kernels/tp_ops.hpp"

namespace hpct::kernels {

void OpsBackend::adamw(const AdamwRun* runs, size_t count, const AdamwArgs& a, double* sums) {
  adamw_runs(runs, count, a, sums);
}
double OpsBackend::sum_squares(const float* x, size_t n) { return sum_of_squares(x, n); }
double OpsBackend::sum_squares_half(const uint16_t* x, size_t n, Precision p) { return sum_of_squares_half(x, n, p); }
double OpsBackend::count_zeros(const float* x, size_t n) { return kernels::count_zeros(x, n); }
double OpsBackend::count_zeros_half(const uint16_t* x, size_t n) { return kernels::count_zeros_half(x, n); }
void OpsBackend::narrow_half(uint16_t* dst, const float* src, size_t n, Precision p) { to_half(src, dst, n, p); }
void OpsBackend::add_half(uint16_t* acc, const uint16_t* x, size_t n, Precision p) { kernels::add_half(x, acc, n, p); }
void OpsBackend::matmul_forward_half(uint16_t* out, Operand inp, Operand weight, int N, int C, int OC, Precision p) {
  std::vector<float> f((size_t)N * OC);
  matmul_forward(f.data(), inp, weight, nullptr, N, C, OC, p);
  to_half(f.data(), out, f.size(), p);
}
void OpsBackend::softmax_cross_entropy_half(uint16_t* logits_inout, float* losses, const int32_t* targets, float dloss,
                                            int N, int V, int Vp, Precision p) {
  std::vector<float> f((size_t)N * Vp);
  from_half(logits_inout, f.data(), f.size(), p);
  softmax_cross_entropy(f.data(), losses, targets, dloss, N, V, Vp);
  to_half(f.data(), logits_inout, f.size(), p);
}
void OpsBackend::matmul_backward_half(float* dinp, float* dweight, const uint16_t* dout, Operand inp, Operand weight,
                                      int N, int C, int OC, Precision p) {
  std::vector<float> f((size_t)N * OC);
  from_half(dout, f.data(), f.size(), p);
  matmul_backward(dinp, dweight, nullptr, f.data(), inp, weight, N, C, OC, p);
}
void OpsBackend::moe_gate_select(const GateRoutes& r, const float* logits, int N, const GateConfig& cfg, uint64_t seed,
                                 bool training) {
  gate_select(r, logits, N, cfg, seed, training);
}
void OpsBackend::moe_gate_assign(const GateRoutes& r, int N, int capacity, const GateConfig& cfg, uint64_t seed) {
  gate_assign(r, N, capacity, cfg, seed);
}
void OpsBackend::moe_gate_backward(float* dlogits, const GateRoutes& r, const float* logits, const float* dweight, int N,
                                   const GateConfig& cfg, float aux_coeff, float z_coeff) {
  gate_backward(dlogits, r, logits, dweight, N, cfg, aux_coeff, z_coeff);
}
void* OpsBackend::allocate_host(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64 * (bytes == 0));
  if (!p) throw std::bad_alloc();
  return p;
}
void OpsBackend::release_host(void* p) noexcept { std::free(p); }
OpsBackend::Transfer OpsBackend::download_async(void* dst, const void* src, size_t bytes) {
  copy_to_host(dst, src, bytes);
  return 0;
}
OpsBackend::Transfer OpsBackend::upload_async(void* dst, const void* src, size_t bytes) {
  copy_from_host(dst, src, bytes);
  return 0;
}
AttentionKernel OpsBackend::attention_kernel(int, int, int, int, Precision, AttentionUse) const {
  return {false, "materialised softmax (B x NH x T x T probabilities kept per layer)"};
}

void OpsBackend::residual_layernorm_forward(float* res, Output out, float* mean, float* rstd, const float* a,
                                            const float* b, const float* weight, const float* bias, int N, int C) {
  residual_forward(res, a, b, (size_t)N * C);
  layernorm_forward(out, mean, rstd, res, weight, bias, N, C);
}
void OpsBackend::residual_rmsnorm_forward(float* res, Output out, float* rstd, const float* a, const float* b,
                                          const float* weight, int N, int C) {
  residual_forward(res, a, b, (size_t)N * C);
  rmsnorm_forward(out, rstd, res, weight, N, C);
}
void OpsBackend::matmul_gelu_forward(Output pre, Output act, Operand inp, Operand weight, const float* bias,
                                     float* wide, int N, int C, int OC, Precision p) {
  const size_t n = (size_t)N * OC;
  if (!pre.h) {
    matmul_forward(pre.f, inp, weight, bias, N, C, OC, p);
    gelu_forward(act, pre.f, n);
    return;
  }
  if (!wide) throw Error("OpsBackend::matmul_gelu_forward: a 16-bit pre-activation needs the fp32 scratch `wide`");
  matmul_forward(wide, inp, weight, bias, N, C, OC, pre.p);
  narrow_half(pre.h, wide, n, pre.p);
  widen_half(wide, pre.h, n, pre.p);  // GELU reads the value kept (exact)
  gelu_forward(act, wide, n);
}
void OpsBackend::matmul_backward_into(float* dinp, float* dweight, float* dbias, Operand dout, Operand inp,
                                      Operand weight, int N, int C, int OC, Precision p) {
  zero(dinp, (size_t)N * C * sizeof(float));
  if (dout.f || !dout.h) {
    matmul_backward(dinp, dweight, dbias, dout.f, inp, weight, N, C, OC, p);
    return;
  }
  BackendBuffer wide(*this, (size_t)N * OC * sizeof(float));  // the 16-bit gradient widened (exact)
  widen_half(wide.as<float>(), dout.h, (size_t)N * OC, p);
  matmul_backward(dinp, dweight, dbias, wide.as<float>(), inp, weight, N, C, OC, p);
}
void OpsBackend::attention_backward_into(Output dqkv, const float* dout, const float* qkv, const float* att,
                                         Operand out, int B, int T, int C, int NH, Precision p, const Dropout* drop,
                                         AttentionUse use) {
  const size_t n = (size_t)B * T * 3 * C;
  BackendBuffer scratch(*this, (dqkv.h ? n : 0) * sizeof(float));  // a 16-bit dqkv: the fp32 one, rounded after
  float* d = dqkv.h ? scratch.as<float>() : dqkv.f;
  zero(d, n * sizeof(float));
  attention_backward(d, dout, qkv, att, out, B, T, C, NH, p, drop, use);
  if (dqkv.h) narrow_half(dqkv.h, d, n, dqkv.p);
}
void OpsBackend::gelu_backward_into(Output dinp, Operand inp, const float* dout, size_t n, Precision p) {
  // The fp32 gradient, into dinp itself or (a 16-bit dinp) into scratch rounded after.
  BackendBuffer scratch(*this, (dinp.h ? n : 0) * sizeof(float) + (inp.f || !inp.h ? 0 : n * sizeof(float)));
  float* d = dinp.h ? scratch.as<float>() : dinp.f;
  const float* x = inp.f;
  if (!x && inp.h) {  // the 16-bit values widened (exact)
    float* w = scratch.as<float>() + (dinp.h ? n : 0);
    widen_half(w, inp.h, n, p);
    x = w;
  }
  zero(d, n * sizeof(float));
  gelu_backward(d, x, dout, n);
  if (dinp.h) narrow_half(dinp.h, d, n, dinp.p);
}

namespace {

// An operand's fp32 values: its own, or its 16-bit ones widened into `tmp` (exact; the GEMM rounds
// them again to p, which gives them back unchanged).
const float* fp32(Operand x, size_t n, Precision p, std::vector<float>& tmp) {
  if (x.f || !x.h) return x.f;
  if (p == Precision::fp32) throw Error("CPU backend: a GEMM input given only in 16 bits in an fp32 op");
  tmp.resize(n);
  from_half(x.h, tmp.data(), n, p);
  return tmp.data();
}

// Runs f on fp32 output memory: out's own, or a temporary rounded into out's 16-bit form after
// (each value rounded once, as operand.hpp's Output says).
template <class F>
void into(Output out, size_t n, F&& f) {
  if (!out.h) return f(out.f);
  std::vector<float> tmp(n);
  f(tmp.data());
  to_half(tmp.data(), out.h, n, out.p);
}

class CpuOps final : public OpsBackend {
 public:
  std::string name() const override { return "cpu"; }
  bool host_memory() const override { return true; }

  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void release(void* p) noexcept override { std::free(p); }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (dst != src) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (dst != src) std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst != src && bytes) std::memcpy(dst, src, bytes);
  }

  void widen_half(float* dst, const uint16_t* src, size_t n, Precision p) override { kernels::from_half(src, dst, n, p); }
  void accumulate_half(uint16_t* acc, const float* src, size_t n, Precision p) override {
    kernels::accumulate_half(src, acc, n, p);
  }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       const int32_t* pos) override {
    kernels::encoder_forward(out, tokens, wte, wpe, B, T, C, pos);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        const int32_t* pos) override {
    kernels::encoder_backward(dwte, dwpe, dout, tokens, B, T, C, pos);
  }
  void layernorm_forward(Output out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                         int N, int C) override {
    into(out, (size_t)N * C, [&](float* o) { kernels::layernorm_forward(o, mean, rstd, inp, weight, bias, N, C); });
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C) override {
    kernels::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void rmsnorm_forward(Output out, float* rstd, const float* inp, const float* weight, int N, int C) override {
    into(out, (size_t)N * C, [&](float* o) { kernels::rmsnorm_forward(o, rstd, inp, weight, N, C); });
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int N, int C) override {
    kernels::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void matmul_forward(float* out, Operand inp, Operand weight, const float* bias, int N, int C, int OC,
                      Precision p) override {
    std::vector<float> wi, ww;
    kernels::matmul_forward(out, fp32(inp, (size_t)N * C, p, wi), fp32(weight, (size_t)OC * C, p, ww), bias, N, C, OC,
                            p);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, Operand inp, Operand weight,
                       int N, int C, int OC, Precision p) override {
    std::vector<float> wi, ww;
    kernels::matmul_backward(dinp, dweight, dbias, dout, fp32(inp, (size_t)N * C, p, wi),
                             fp32(weight, (size_t)OC * C, p, ww), N, C, OC, p);
  }
  void attention_forward(Output out, float* att, const float* qkv, int B, int T, int C, int NH, Precision p,
                         const Dropout* drop, const int32_t* key_start, AttentionUse) override {
    into(out, (size_t)B * T * C,
         [&](float* o) { kernels::attention_forward(o, att, qkv, B, T, C, NH, p, drop, key_start); });
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, Operand, int B, int T,
                          int C, int NH, Precision p, const Dropout* drop, AttentionUse) override {
    kernels::attention_backward(dqkv, dout, qkv, att, B, T, C, NH, p, drop);
  }
  void dropout(float* x, size_t rows, int C, const Dropout& d) override { kernels::dropout(x, rows, C, d); }
  void gelu_forward(Output out, const float* inp, size_t n) override {
    into(out, n, [&](float* o) { kernels::gelu_forward(o, inp, n); });
  }
  void swiglu_forward(Output out, const float* inp, size_t rows, int F) override {
    into(out, rows * F, [&](float* o) { kernels::swiglu_forward(o, inp, rows, F); });
  }
  void expand_kv(float* out, const float* inp, size_t rows, int C, int NH, int KV) override {
    kernels::expand_kv(out, inp, rows, C, NH, KV);
  }
  void reduce_kv(float* dinp, const float* dout, size_t rows, int C, int NH, int KV) override {
    kernels::reduce_kv(dinp, dout, rows, C, NH, KV);
  }
  void rope(float* qkv, int B, int T, int C, int NH, int KV, int rot, float theta, const int32_t* pos,
            bool inverse) override {
    kernels::rope(qkv, B, T, C, NH, KV, rot, theta, pos, inverse);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, size_t rows, int F) override {
    kernels::swiglu_backward(dinp, inp, dout, rows, F);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    kernels::gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) override {
    kernels::residual_forward(out, a, b, n);
  }
  void add_scaled(float* y, const float* x, float a, size_t n) override { kernels::add_scaled(y, x, a, n); }
  void softmax_cross_entropy(float* logits_inout, float* losses, const int32_t* targets, float dloss, int N, int V,
                             int Vp) override {
    kernels::softmax_cross_entropy(logits_inout, losses, targets, dloss, N, V, Vp);
  }

  void vocab_rows(float* out, const float* part, const int32_t* ids, size_t N, int width, int first,
                  int count) override {
    kernels::vocab_rows(out, part, ids, N, width, first, count);
  }
  void vocab_rows_backward(float* dpart, const float* dout, const int32_t* ids, size_t N, int width, int first,
                           int count) override {
    kernels::vocab_rows_backward(dpart, dout, ids, N, width, first, count);
  }
  void add_position_rows(float* out, const float* wpe, const int32_t* pos, size_t first, size_t rows, int T,
                         int C) override {
    kernels::add_position_rows(out, wpe, pos, first, rows, T, C);
  }
  void vocab_ce_max(float* mx, const float* logits, int rows, int vl, int valid) override {
    kernels::vocab_ce_max(mx, logits, rows, vl, valid);
  }
  void vocab_ce_sums(double* sums, const float* logits, const float* mx, const int32_t* targets, int rows, int vl,
                     int vstart, int valid) override {
    kernels::vocab_ce_sums(sums, logits, mx, targets, rows, vl, vstart, valid);
  }
  void vocab_ce_finish(float* logits, float* losses, const float* mx, const double* sums, const int32_t* targets,
                       float dloss, int rows, int vl, int vstart, int valid, bool backward) override {
    kernels::vocab_ce_finish(logits, losses, mx, sums, targets, dloss, rows, vl, vstart, valid, backward);
  }

  void gather_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C) override {
    kernels::gather_rows(dst, src, rows, n, C);
  }
  void scatter_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C) override {
    kernels::scatter_rows(dst, src, rows, n, C);
  }
  void moe_combine(float* out, const float* y, const int32_t* pos, const float* weight, int N, int K, int C) override {
    kernels::moe_combine(out, y, pos, weight, N, K, C);
  }
  void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y, const int32_t* pos,
                            const float* weight, int N, int K, int C) override {
    kernels::moe_combine_backward(dy, dweight, dout, y, pos, weight, N, K, C);
  }
  void moe_dispatch_backward(float* dx, const float* drows, const int32_t* pos, int N, int K, int C) override {
    kernels::moe_dispatch_backward(dx, drows, pos, N, K, C);
  }
  void multiply(float* out, const float* a, const float* b, size_t n, bool accumulate) override {
    kernels::multiply(out, a, b, n, accumulate);
  }
  void residual_mix(float* out, float* coef, const float* moe, const float* dense, int N, int C) override {
    kernels::residual_mix(out, coef, moe, dense, N, C);
  }
  void residual_mix_backward(float* dmoe, float* ddense, float* dlogits, const float* dout, const float* coef,
                             const float* moe, const float* dense, int N, int C) override {
    kernels::residual_mix_backward(dmoe, ddense, dlogits, dout, coef, moe, dense, N, C);
  }
};

}  // namespace

std::unique_ptr<OpsBackend> cpu_ops() { return std::make_unique<CpuOps>(); }

#if !defined(HPCT_HAVE_CUDA)
bool cuda_ops_available(std::string* why) {
  if (why) *why = "this build has no CUDA backend (configure with -DHPCT_ENABLE_CUDA=ON and the CUDA toolkit)";
  return false;
}
std::unique_ptr<OpsBackend> cuda_ops(int) {
  std::string why;
  cuda_ops_available(&why);
  throw Error("CUDA backend: " + why);
}
#endif

}  // namespace hpct::kernels
