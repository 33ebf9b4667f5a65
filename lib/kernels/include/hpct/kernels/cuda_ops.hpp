// hpct/kernels/cuda_ops.hpp — CUDA kernels for the element-wise and per-row GPT-2 ops.
//
// What it is: the device twins of ops.hpp's element-wise and per-row ops (gelu, residual, adamw,
// layernorm, embedding, softmax cross-entropy, the vocab-parallel rows, the MoE layer's row moves) and the pieces that cuda_ops() (ops_backend.hpp)
// builds matmul and attention from around cuBLAS: bias broadcast and reduction, the causal
// softmax. Same math and contracts (backward accumulates), on device pointers and an explicit
// stream. Nothing here allocates or copies memory. Trade-off: one thread per element (per row: a
// warp, or a block for the vocabulary-wide cross-entropy) with grid-stride loops: simple and
// bandwidth-bound, which these ops are; not tuned.
// Declared only in CUDA builds (HPCT_HAVE_CUDA, set by lib/kernels when nvcc is found). Launch
// errors throw hpct::Error; kernels run asynchronously on `stream`.
#pragma once
#if defined(HPCT_HAVE_CUDA)
#include <cstddef>
#include <cstdint>
#include <string>

#include "hpct/kernels/dropout.hpp"
#include "hpct/kernels/moe_gate.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime_api.h>
#else
// The same type as the CUDA runtime's typedef, so host code needs no CUDA include directory.
struct CUstream_st;
using cudaStream_t = CUstream_st*;
#endif

namespace hpct::kernels::cuda {

/// GELU, tanh approximation (GPT-2), as hpct::kernels::gelu_forward.
void gelu_forward(float* out /*(n)*/, const float* inp /*(n)*/, size_t n, cudaStream_t stream);
/// dinp += gelu'(inp) * dout (accumulate false: dinp = gelu'(inp) * dout).
void gelu_backward(float* dinp /*(n)*/, const float* inp /*(n)*/, const float* dout /*(n)*/, size_t n,
                   cudaStream_t stream, bool accumulate = true);
/// dinp = gelu'(inp) * dout WRITTEN, inp 16-bit (bf16 when bf16, else IEEE half): into the fp32
/// dinp, or (dinp null) into dinp16 in the same 16-bit format, rounded once.
void gelu_backward_half(float* dinp /*(n)*/, uint16_t* dinp16 /*(n)*/, const uint16_t* inp /*(n)*/, bool bf16,
                        const float* dout /*(n)*/, size_t n, cudaStream_t stream);
/// out = a + b; out may alias a or b.
void residual_forward(float* out /*(n)*/, const float* a /*(n)*/, const float* b /*(n)*/, size_t n, cudaStream_t stream);
/// y += a * x.
void add_scaled(float* y /*(n)*/, const float* x /*(n)*/, float a, size_t n, cudaStream_t stream);
/// AdamW as hpct::kernels::adamw_update (step is 1-based).
void adamw_update(float* param /*(n)*/, const float* grad /*(n)*/, float* m /*(n)*/, float* v /*(n)*/, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale,
                  cudaStream_t stream);
/// LayerNorm, eps 1e-5, saving mean and rstd, as hpct::kernels::layernorm_forward.
void layernorm_forward(float* out /*(N,C)*/, float* mean /*(N)*/, float* rstd /*(N)*/, const float* inp /*(N,C)*/,
                       const float* weight /*(C)*/, const float* bias /*(C)*/, int N, int C, cudaStream_t stream);

/// Rotary position embedding in place, as hpct::kernels::rope (angles from theta^(-2i/rot) in fp32).
void rope(float* qkv /*(B*T, C + 2 KV d)*/, int B, int T, int C, int NH, int KV, int rot, float theta,
          const int32_t* pos /*(B*T)*/, bool inverse, cudaStream_t stream);
/// Grouped-query attention's key/value heads widened and reduced, as hpct::kernels::expand_kv/reduce_kv.
void expand_kv(float* out, const float* inp, size_t rows, int C, int NH, int KV, cudaStream_t stream);
void reduce_kv(float* dinp, const float* dout, size_t rows, int C, int NH, int KV, cudaStream_t stream);
/// SwiGLU on rows of [gate | up], as hpct::kernels::swiglu_forward; backward accumulates.
void swiglu_forward(float* out /*(rows,F)*/, const float* inp /*(rows,2F)*/, size_t rows, int F, cudaStream_t stream);
void swiglu_backward(float* dinp /*(rows,2F)*/, const float* inp /*(rows,2F)*/, const float* dout /*(rows,F)*/,
                     size_t rows, int F, cudaStream_t stream);
/// RMSNorm, eps 1e-5, saving rstd, as hpct::kernels::rmsnorm_forward.
void rmsnorm_forward(float* out /*(N,C)*/, float* rstd /*(N)*/, const float* inp /*(N,C)*/, const float* weight /*(C)*/,
                     int N, int C, cudaStream_t stream);
/// Where a kernel writes an activation a GEMM reads next: fp32 values (h null), or 16-bit ones
/// (bf16 when bf16, else IEEE half), each computed in fp32 and rounded once to nearest even.
struct ActOut {
  float* f = nullptr;
  uint16_t* h = nullptr;
  bool bf16 = true;
};
/// res = a + b (res may alias a or b), then out = layernorm(res) saving mean and rstd: one kernel
/// (fusions.cu), the same as residual_forward then layernorm_forward to rounding.
void residual_layernorm_forward(float* res /*(N,C)*/, ActOut out /*(N,C)*/, float* mean /*(N)*/, float* rstd /*(N)*/,
                                const float* a /*(N,C)*/, const float* b /*(N,C)*/, const float* weight /*(C)*/,
                                const float* bias /*(C)*/, int N, int C, cudaStream_t stream);
/// res = a + b, then out = rmsnorm(res) saving rstd: one kernel.
void residual_rmsnorm_forward(float* res /*(N,C)*/, ActOut out /*(N,C)*/, float* rstd /*(N)*/, const float* a /*(N,C)*/,
                              const float* b /*(N,C)*/, const float* weight /*(C)*/, int N, int C, cudaStream_t stream);
/// The norms without the residual add, into 16-bit (or fp32) outputs: fusions.cu's kernel on inp alone,
/// the same as layernorm_forward / rmsnorm_forward to rounding.
void layernorm_forward(ActOut out /*(N,C)*/, float* mean /*(N)*/, float* rstd /*(N)*/, const float* inp /*(N,C)*/,
                       const float* weight /*(C)*/, const float* bias /*(C)*/, int N, int C, cudaStream_t stream);
void rmsnorm_forward(ActOut out /*(N,C)*/, float* rstd /*(N)*/, const float* inp /*(N,C)*/, const float* weight /*(C)*/,
                     int N, int C, cudaStream_t stream);
/// pre += bias (bias may be null: none), then act = gelu(pre): one kernel after an MLP's fc GEMM.
void bias_gelu_forward(float* pre /*(N,OC)*/, ActOut act /*(N,OC)*/, const float* bias /*(OC)*/, int N, int OC,
                       cudaStream_t stream);
/// pre = 16-bit(wide + bias) (bias may be null; round to nearest even, bf16 when bf16, else IEEE
/// half), then act = gelu(pre as kept): one kernel after a bias-free fc GEMM into the fp32 scratch
/// wide (read only), as autocast's 16-bit linear and GELU give.
void bias_gelu_forward_narrow(const float* wide /*(N,OC)*/, uint16_t* pre /*(N,OC)*/, bool bf16, ActOut act /*(N,OC)*/,
                              const float* bias /*(OC)*/, int N, int OC, cudaStream_t stream);
/// act = gelu(inp) into a 16-bit (or fp32) output; inp unchanged.
void gelu_forward(ActOut out /*(n)*/, const float* inp /*(n)*/, size_t n, cudaStream_t stream);
/// SwiGLU into a 16-bit (or fp32) output.
void swiglu_forward(ActOut out /*(rows,F)*/, const float* inp /*(rows,2F)*/, size_t rows, int F, cudaStream_t stream);

/// dst = fp32 values of 16-bit src: bfloat16 (the top half of an fp32) when bf16, else IEEE half.
void widen_half(float* dst /*(n)*/, const uint16_t* src /*(n)*/, size_t n, bool bf16, cudaStream_t stream);
/// acc += the fp32 values of 16-bit src (a gradient computed in 16 bits, accumulated in fp32).
void add_widened(float* acc /*(n)*/, const uint16_t* src /*(n)*/, size_t n, bool bf16, cudaStream_t stream);
/// acc = 16-bit(acc + src), round to nearest even (bf16: NaN stays a quiet NaN), as
/// hpct::kernels::accumulate_half.
void accumulate_half(uint16_t* acc /*(n)*/, const float* src /*(n)*/, size_t n, bool bf16, cudaStream_t stream);
/// out = wte[tokens] + wpe[pos or t]; tokens in [0, V), positions in the table (checked by the
/// caller on the host); pos nullptr: t.
void encoder_forward(float* out /*(B,T,C)*/, const int32_t* tokens /*(B,T)*/, const float* wte /*(V,C)*/,
                     const float* wpe /*(maxT,C)*/, int B, int T, int C, const int32_t* pos /*(B,T)*/,
                     cudaStream_t stream);
/// dwte[tokens] += dout (atomicAdd: order of the sum varies), dwpe[t] += sum over b of dout (with
/// pos: dwpe[pos] += dout, atomicAdd).
void encoder_backward(float* dwte /*(V,C)*/, float* dwpe /*(maxT,C)*/, const float* dout /*(B,T,C)*/,
                      const int32_t* tokens /*(B,T)*/, int B, int T, int C, const int32_t* pos /*(B,T)*/,
                      cudaStream_t stream);
/// Floats of device workspace that layernorm_backward and bias_backward need for N rows of C columns
/// (their column sums over rows run in two deterministic passes through it).
size_t column_sum_workspace(int N, int C);
/// As hpct::kernels::layernorm_backward (accumulates into all three gradients); workspace: see above.
void layernorm_backward(float* dinp /*(N,C)*/, float* dweight /*(C)*/, float* dbias /*(C)*/, const float* dout /*(N,C)*/,
                        const float* inp /*(N,C)*/, const float* weight /*(C)*/, const float* mean /*(N)*/,
                        const float* rstd /*(N)*/, int N, int C, float* workspace, cudaStream_t stream);
/// As hpct::kernels::rmsnorm_backward (accumulates into dinp and dweight); workspace: column_sum_workspace.
void rmsnorm_backward(float* dinp /*(N,C)*/, float* dweight /*(C)*/, const float* dout /*(N,C)*/, const float* inp /*(N,C)*/,
                      const float* weight /*(C)*/, const float* rstd /*(N)*/, int N, int C, float* workspace,
                      cudaStream_t stream);
/// out[n][o] += bias[o].
void add_bias(float* out /*(N,OC)*/, const float* bias /*(OC)*/, int N, int OC, cudaStream_t stream);
/// dbias[o] += sum over n of dout[n][o]; workspace: column_sum_workspace(N, OC) floats.
/// The same of 16-bit dout (bf16 when bf16, else IEEE half), summed in fp32.
void bias_backward_half(float* dbias /*(OC)*/, const uint16_t* dout /*(N,OC)*/, bool bf16, int N, int OC,
                        float* workspace, cudaStream_t stream);
void bias_backward(float* dbias /*(OC)*/, const float* dout /*(N,OC)*/, int N, int OC, float* workspace,
                   cudaStream_t stream);
/// In place on rows of T scores (row r = ((b * NH + h) * T + t) is query t): softmax over columns
/// key_start[b][t]..t (key_start nullptr: 0..t), 0 elsewhere.
void causal_softmax_forward(float* att /*(rows,T)*/, int T, int NH, size_t rows, const int32_t* key_start /*(B,T)*/,
                            cudaStream_t stream);
/// In place: datt becomes att * (datt - rowsum(att * datt)) below the diagonal, 0 above.
void causal_softmax_backward(float* datt /*(rows,T)*/, const float* att /*(rows,T)*/, int T, size_t rows,
                             cudaStream_t stream);
/// Dropout (dropout.hpp), as hpct::kernels::dropout: in place on (rows, C) token rows.
void dropout(float* x /*(rows,C)*/, size_t rows, int C, const Dropout& d, cudaStream_t stream);
/// dst = att with attention dropout (kept times 1/(1-p), dropped and upper triangle 0); rows of
/// the (B, NH, T, T) stack, row r = ((b * NH + h) * T + i). dst may be att.
void attention_dropout(float* dst /*(rows,T)*/, const float* att /*(rows,T)*/, int T, int NH, size_t rows,
                       const Dropout& d, cudaStream_t stream);
/// The softmax backward when the values saw D = att with attention dropout: datt (d(loss)/dD) becomes
/// D * datt - att * rowsum(D * datt) below the diagonal, 0 above (the mask regenerated from d).
void causal_softmax_backward_dropout(float* datt /*(rows,T)*/, const float* att /*(rows,T)*/, int T, int NH,
                                     size_t rows, const Dropout& d, cudaStream_t stream);
/// As hpct::kernels::softmax_cross_entropy, except that targets >= V are not checked (the caller
/// checks them on the host; a kernel cannot throw).
void softmax_cross_entropy(float* logits_inout /*(N,Vp)*/, float* losses /*(N)*/, const int32_t* targets /*(N)*/,
                           float dloss, int N, int V, int Vp, cudaStream_t stream);
/// The same on 16-bit logits (bf16 or IEEE half), read as their fp32 values; the gradient written
/// back rounded (OpsBackend::softmax_cross_entropy_half).
void softmax_cross_entropy_half(uint16_t* logits_inout, float* losses, const int32_t* targets, float dloss, int N, int V,
                                int Vp, bool bf16, cudaStream_t stream);

// The vocab-parallel embedding's and cross entropy's rows, as in tp_ops.hpp.
void vocab_rows(float* out, const float* part, const int32_t* ids, size_t N, int width, int first, int count,
                cudaStream_t stream);
void vocab_rows_backward(float* dpart, const float* dout, const int32_t* ids, size_t N, int width, int first, int count,
                         cudaStream_t stream);
void add_position_rows(float* out, const float* wpe, const int32_t* pos, size_t first, size_t rows, int T, int C,
                       cudaStream_t stream);
void vocab_ce_max(float* mx, const float* logits, int rows, int vl, int valid, cudaStream_t stream);
void vocab_ce_sums(double* sums, const float* logits, const float* mx, const int32_t* targets, int rows, int vl,
                   int vstart, int valid, cudaStream_t stream);
void vocab_ce_finish(float* logits, float* losses, const float* mx, const double* sums, const int32_t* targets,
                     float dloss, int rows, int vl, int vstart, int valid, bool backward, cudaStream_t stream);

// The MoE layer's row moves and mixes, as in moe_ops.hpp (pos and rows in range: the caller's).
void gather_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C, cudaStream_t stream);
/// dst[rows[i]] = src[i] (the rows distinct), as hpct::kernels::scatter_rows.
void scatter_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C, cudaStream_t stream);
void moe_combine(float* out, const float* y, const int32_t* pos, const float* weight, int N, int K, int C,
                 cudaStream_t stream);
void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y, const int32_t* pos,
                          const float* weight, int N, int K, int C, cudaStream_t stream);
void moe_dispatch_backward(float* dx, const float* drows, const int32_t* pos, int N, int K, int C,
                           cudaStream_t stream);
void multiply(float* out, const float* a, const float* b, size_t n, bool accumulate, cudaStream_t stream);
void residual_mix(float* out, float* coef, const float* moe, const float* dense, int N, int C, cudaStream_t stream);
void residual_mix_backward(float* dmoe, float* ddense, float* dlogits, const float* dout, const float* coef,
                           const float* moe, const float* dense, int N, int C, cudaStream_t stream);

// The MoE gate (moe_gate.hpp) on device memory (moe_gate.cu): the host functions' routes, nothing
// read back (the caller downloads r.summary). assign: with drop_tokens false the caller passes a
// capacity of at least the largest demand (a kernel cannot throw).
void moe_gate_select(const GateRoutes& r, const float* logits, int N, const GateConfig& cfg, uint64_t seed,
                     bool training, cudaStream_t stream);
void moe_gate_assign(const GateRoutes& r, int N, int capacity, const GateConfig& cfg, uint64_t seed,
                     cudaStream_t stream);
void moe_gate_backward(float* dlogits, const GateRoutes& r, const float* logits, const float* dweight, int N,
                       const GateConfig& cfg, float aux_coeff, float z_coeff, cudaStream_t stream);

// The optimizer step (optim.hpp) on device memory (optim.cu).
/// One run of state on the device, as hpct::kernels::AdamwRun (exactly one of grad and grad16).
struct DeviceAdamwRun {
  float* param;
  const float* grad;
  const uint16_t* grad16;
  float* m;
  float* v;
  uint16_t* param16;
  size_t n;
  float weight_decay;
  float unused = 0;  // the tail padding, named so that it has a value: the table is compared bytewise
};
/// Elements one thread block updates in adamw_multi (its tiles: ceil(n / kAdamwTile) per run).
constexpr size_t kAdamwTile = 4096;
/// AdamW over `count` runs in one launch: runs and first_tile (count + 1 entries, the prefix sum
/// of each run's tiles) in device memory; bc1, bc2 the bias corrections as the host computes them.
void adamw_multi(const DeviceAdamwRun* runs, const unsigned* first_tile, int count, unsigned tiles, float lr,
                 float beta1, float beta2, float eps, float bc1, float bc2, float grad_scale, bool bf16,
                 cudaStream_t stream);
/// Blocks of the first pass of sum_squares; `partial` needs that many doubles plus one.
unsigned sum_squares_blocks(size_t n);
/// partial[blocks] = sum(x^2) in double over n fp32 (x) or 16-bit (x16, bf16 or fp16) values, in
/// a fixed order (per-block sums, then one block adds them): deterministic run to run.
void sum_squares(double* partial, const float* x, const uint16_t* x16, size_t n, bool bf16, cudaStream_t stream);
/// partial[blocks] = how many of n fp32 (x) or 16-bit (x16) values are zero (+0 or -0); partial as
/// sum_squares's (sum_squares_blocks(n) + 1 doubles).
void count_zeros(double* partial, const float* x, const uint16_t* x16, size_t n, cudaStream_t stream);
/// dst = src rounded to 16 bits (round to nearest even), as hpct::kernels::to_half.
void narrow_half(uint16_t* dst /*(n)*/, const float* src /*(n)*/, size_t n, bool bf16, cudaStream_t stream);
/// acc = 16-bit(fp32(acc) + fp32(x)), as hpct::kernels::add_half.
void add_half(uint16_t* acc /*(n)*/, const uint16_t* x /*(n)*/, size_t n, bool bf16, cudaStream_t stream);

/// Without a GPU: whether cuDNN's fused attention (the CUDA backend's, cudnn_attention.hpp) builds
/// its forward and backward plans for B samples of T tokens, NH heads of HS channels, bf16 (fp16
/// when `fp16`), attention dropout `dropout` (0: none), per-document masks (`documents`: each
/// query's first key given), on the device `device_json` describes
/// (cuDNN's device-properties JSON): cuDNN compiles for it ahead of time, so its acceptance of the
/// graphs is checked where no GPU is (CI). "" when both build, else cuDNN's reason (or that
/// libcudnn.so.9 cannot be loaded).
std::string fused_attention_offline(int B, int T, int NH, int HS, bool fp16, float dropout, bool documents,
                                    const std::string& device_json);

}  // namespace hpct::kernels::cuda
#endif  // HPCT_HAVE_CUDA
