// hpct/kernels/ops.hpp — forward and backward of every GPT-2 op, CPU backend.
//
// What it is: llm.c's layer of kernels behind one C++ interface: row-major fp32 buffers, raw
// pointers, shapes in comments. Every backward ACCUMULATES (+=) into each gradient it writes, so
// the caller zeroes gradients once per step and shared weights (wte) need no special case.
// What it is not: an autograd or a tensor library; nothing here allocates the caller's buffers.
// Trade-off: GEMMs (OpenBLAS fp32, oneDNN bf16) carry the flops; element-wise and per-row work
// runs as Kokkos patterns on the host execution space (Serial today: one rank per core) so the
// same loops can move to other Kokkos backends; those loops are chunked so each chunk is a plain
// SIMD loop, which matters more for speed on one core than the parallel pattern around it.
//
// Dimension letters: B batch, T sequence, C channels, NH heads, HS = C/NH head size, N rows
// (= B*T), OC output channels, V vocabulary, Vp padded vocabulary (V rounded up for GEMM speed).
// Input-dependent errors (bad sizes, token ids, targets) throw hpct::Error before any output is
// written; an op other than gemm() called with no BackendScope alive throws too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/dropout.hpp"
#include "hpct/kernels/precision.hpp"

namespace hpct::kernels {

/// C = alpha * op(A) * op(B) + beta * C, op(X) = X^T when the flag is set; op(A) is (M, K),
/// op(B) is (K, N), C is (M, N); lda/ldb/ldc are row strides of the stored matrices.
/// fp32: OpenBLAS sgemm. bf16: inputs rounded to bfloat16 (nearest even), fp32 accumulation,
/// by oneDNN's matmul when built with it and the CPU has native bf16 (AVX512-BF16 / AMX),
/// otherwise rounded copies through sgemm. fp16: inputs rounded to IEEE half (|x| > 65504 becomes
/// inf, which fp16 loss scaling must see), then sgemm. beta == 0 ignores C's old contents (NaN too).
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc, Precision p = Precision::fp32);

/// out = wte[tokens] + wpe[position], position = pos[b][t] when given (documents packed in a
/// sample, each counting from 0: Megatron's --reset-position-ids), else t. Tokens and positions
/// must be >= 0 (the caller guarantees < V and < the table's rows).
void encoder_forward(float* out /*(B,T,C)*/, const int32_t* tokens /*(B,T)*/, const float* wte /*(V,C)*/,
                     const float* wpe /*(maxT,C)*/, int B, int T, int C, const int32_t* pos /*(B,T)*/ = nullptr);
/// wpe null: no position table (the word embedding alone; rotary positions act in attention).
/// Accumulates into dwte and dwpe; dwte null: dwpe only (a frozen word embedding, LoRA's
/// --lora-modules-to-save position_embedding); dwpe null: dwte only (no position table).
void encoder_backward(float* dwte /*(V,C)*/, float* dwpe /*(maxT,C)*/, const float* dout /*(B,T,C)*/,
                      const int32_t* tokens /*(B,T)*/, int B, int T, int C, const int32_t* pos /*(B,T)*/ = nullptr);

/// eps = 1e-5 (GPT-2); mean and rstd are saved for backward.
void layernorm_forward(float* out /*(N,C)*/, float* mean /*(N)*/, float* rstd /*(N)*/, const float* inp /*(N,C)*/,
                       const float* weight /*(C)*/, const float* bias /*(C)*/, int N, int C);
void layernorm_backward(float* dinp /*(N,C)*/, float* dweight /*(C)*/, float* dbias /*(C)*/, const float* dout /*(N,C)*/,
                        const float* inp /*(N,C)*/, const float* weight /*(C)*/, const float* mean /*(N)*/,
                        const float* rstd /*(N)*/, int N, int C);

/// RMSNorm (Zhang & Sennrich 2019; Llama's, Megatron's --normalization rmsnorm): out = inp * rstd *
/// weight, rstd = 1/sqrt(mean(inp^2) + 1e-5), saved for backward. No mean is subtracted, no bias.
void rmsnorm_forward(float* out /*(N,C)*/, float* rstd /*(N)*/, const float* inp /*(N,C)*/, const float* weight /*(C)*/,
                     int N, int C);
/// Accumulates into dinp and dweight: dinp += rstd * (dout*weight - xhat * mean(dout*weight*xhat)),
/// xhat = inp * rstd.
void rmsnorm_backward(float* dinp /*(N,C)*/, float* dweight /*(C)*/, const float* dout /*(N,C)*/, const float* inp /*(N,C)*/,
                      const float* weight /*(C)*/, const float* rstd /*(N)*/, int N, int C);

/// Rotary position embedding (RoFormer, Su et al. 2021; GPT-NeoX's and Llama's rotate-half form), in
/// place on the query and key sections of qkv rows (B*T rows of q | k | v: NH query heads of d = C/NH,
/// then KV key heads and KV value heads, C + 2 KV d wide; KV = NH without grouped-query attention):
/// the first `rot` channels of each head, pairs (i, i + rot/2), rotate by angle p * theta^(-2i/rot)
/// with p the row's position (pos[row], or row % T without pos). inverse: by minus that angle, the
/// transpose (backward: d(q, k) before rotation from d(q, k) after).
void rope(float* qkv /*(B*T, C + 2 KV d)*/, int B, int T, int C, int NH, int KV, int rot, float theta,
          const int32_t* pos /*(B*T)*/, bool inverse);

/// Grouped-query attention (Ainslie et al. 2023; Llama's num_key_value_heads): rows of q | k | v with
/// NH query heads and KV key/value heads (C + 2 KV d wide) widened to NH of each (3C wide), query head
/// h using key/value head h / (NH/KV), for the attention op; reduce_kv is its backward: d(q) copied,
/// each key/value head's gradient the sum over its group's query heads (overwrites dinp).
void expand_kv(float* out /*(rows, 3C)*/, const float* inp /*(rows, C + 2 KV d)*/, size_t rows, int C, int NH, int KV);
void reduce_kv(float* dinp /*(rows, C + 2 KV d)*/, const float* dout /*(rows, 3C)*/, size_t rows, int C, int NH, int KV);

/// out = inp @ weight^T + bias, weight (OC, C) as nn.Linear; bias may be nullptr.
void matmul_forward(float* out /*(N,OC)*/, const float* inp /*(N,C)*/, const float* weight /*(OC,C)*/,
                    const float* bias /*(OC)*/, int N, int C, int OC, Precision p = Precision::fp32);
/// dinp, dweight and dbias may be nullptr (skipped: a frozen weight's gradient is not computed).
void matmul_backward(float* dinp /*(N,C)*/, float* dweight /*(OC,C)*/, float* dbias /*(OC)*/, const float* dout /*(N,OC)*/,
                     const float* inp /*(N,C)*/, const float* weight /*(OC,C)*/, int N, int C, int OC,
                     Precision p = Precision::fp32);

/// Causal multi-head attention. qkv holds q, k, v side by side per token; head h uses columns
/// h*HS..(h+1)*HS of each third. att saves the softmax probabilities for backward (upper triangle
/// zero). Scale 1/sqrt(HS). C must be divisible by NH.
/// drop: attention dropout on the probabilities (nullptr or p = 0: none, bitwise the plain op). att
/// still saves the undropped probabilities; the values are mixed with the dropped and rescaled
/// ones, and backward regenerates the same mask from drop (dropout.hpp), so pass it to both.
/// key_start: query t of sample b sees keys key_start[b][t]..t only (its document inside a packed
/// sample: Megatron's --reset-attention-mask), 0 <= key_start[b][t] <= t; nullptr: keys 0..t. att
/// holds zeros outside each row's keys, so backward needs no key_start: it follows from att.
void attention_forward(float* out /*(B,T,C)*/, float* att /*(B,NH,T,T)*/, const float* qkv /*(B,T,3C)*/, int B, int T,
                       int C, int NH, Precision p = Precision::fp32, const Dropout* drop = nullptr,
                       const int32_t* key_start /*(B,T)*/ = nullptr);
void attention_backward(float* dqkv /*(B,T,3C)*/, const float* dout /*(B,T,C)*/, const float* qkv /*(B,T,3C)*/,
                        const float* att /*(B,NH,T,T)*/, int B, int T, int C, int NH, Precision p = Precision::fp32,
                        const Dropout* drop = nullptr);

/// Dropout in place on token rows: x[r][c] = keep ? x[r][c] / (1 - p) : 0 with dropout.hpp's mask
/// (row r is micro-batch row d.first_row + r). Linear, so backward is the same call on the gradient.
void dropout(float* x /*(rows,C)*/, size_t rows, int C, const Dropout& d);

/// GELU, tanh approximation (GPT-2).
void gelu_forward(float* out /*(n)*/, const float* inp /*(n)*/, size_t n);
void gelu_backward(float* dinp /*(n)*/, const float* inp /*(n)*/, const float* dout /*(n)*/, size_t n);
/// SwiGLU (Shazeer 2020; Llama's MLP, Megatron's --swiglu): each row of inp is [gate | up], F wide
/// each; out = silu(gate) * up, silu(x) = x * sigmoid(x).
void swiglu_forward(float* out /*(rows,F)*/, const float* inp /*(rows,2F)*/, size_t rows, int F);
/// Accumulates: d(gate) += dout * up * silu'(gate), d(up) += dout * silu(gate).
void swiglu_backward(float* dinp /*(rows,2F)*/, const float* inp /*(rows,2F)*/, const float* dout /*(rows,F)*/,
                     size_t rows, int F);

/// out = a + b; out may alias a or b.
void residual_forward(float* out /*(n)*/, const float* a /*(n)*/, const float* b /*(n)*/, size_t n);
/// y += a * x (LoRA's scaled update and its gradient); y may not alias x.
void add_scaled(float* y /*(n)*/, const float* x /*(n)*/, float a, size_t n);

/// Fused softmax + cross-entropy, IN PLACE to save an (N, Vp) buffer: on entry logits; columns
/// >= V are padding and ignored. On return losses[i] = -log softmax(logits[i])[targets[i]] and the
/// buffer holds dlogits = (softmax - onehot(target)) * dloss, padding columns 0. targets[i] < 0
/// means "ignore": loss 0, gradient row 0. targets[i] >= V throws. Max-subtracted, with the
/// normaliser summed in double.
void softmax_cross_entropy(float* logits_inout /*(N,Vp)*/, float* losses /*(N)*/, const int32_t* targets /*(N)*/,
                           float dloss, int N, int V, int Vp);

/// Decoupled-weight-decay AdamW: g = grad * grad_scale; m, v updated; bias-corrected with step
/// (1-based); param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param).
void adamw_update(float* param /*(n)*/, const float* grad /*(n)*/, float* m /*(n)*/, float* v /*(n)*/, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale);

/// sum(x^2) accumulated in double, for the global gradient norm.
double sum_of_squares(const float* x /*(n)*/, size_t n);
/// False if any element is inf or NaN (fp16 overflow detection).
bool all_finite(const float* x /*(n)*/, size_t n);
/// x *= s.
void scale(float* x /*(n)*/, float s, size_t n);

}  // namespace hpct::kernels
