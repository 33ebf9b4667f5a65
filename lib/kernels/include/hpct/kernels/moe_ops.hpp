// hpct/kernels/moe_ops.hpp — the row moves and mixes of a mixture-of-experts layer, CPU backend.
//
// What it is: the few ops an MoE layer needs besides the GPT ops (ops.hpp): gather token rows into
// the experts' order, combine the experts' rows back with the gate weights, their backwards, an
// element-wise product (router jitter) and Residual-MoE's two-way softmax mix. Row-major fp32, raw
// pointers; cuda_ops.hpp has the device twins and ops_backend.hpp puts both behind one interface.
// What it is not: the gate (which experts, which slots: model/moe_gate.hpp, on the host) or the
// all-to-all. Routes are indexed i = n*K + k (token n, its k-th choice); pos[i] is the route's row
// in the expert-ordered buffer, or < 0 when the route was dropped.
// Trade-off: every output element is written by one loop iteration in a fixed order (a token's
// routes in k order), so results do not depend on threading; the combine weights' gradient sums
// in double as the other per-row reductions do.
#pragma once
#include <cstddef>
#include <cstdint>

namespace hpct::kernels {

/// dst[i] = src[rows[i]] for i < n (rows of C floats).
void gather_rows(float* dst /*(n,C)*/, const float* src /*(?,C)*/, const int32_t* rows /*(n)*/, size_t n, int C);
/// dst[rows[i]] = src[i] for i < n (rows of C floats; the rows distinct): gather_rows' inverse.
void scatter_rows(float* dst /*(?,C)*/, const float* src /*(n,C)*/, const int32_t* rows /*(n)*/, size_t n, int C);

/// out[t] = sum over k of weight[t*K+k] * y[pos[t*K+k]] (routes with pos < 0 add nothing;
/// a token with none gets 0). Overwrites out.
void moe_combine(float* out /*(N,C)*/, const float* y /*(S,C)*/, const int32_t* pos /*(N,K)*/,
                 const float* weight /*(N,K)*/, int N, int K, int C);
/// The combine's backward: dy[pos[i]] = weight[i] * dout[t] and dweight[i] = dot(dout[t], y[pos[i]])
/// for every kept route i of token t; a dropped route's dweight is 0. Overwrites both (dy rows that
/// no route names are left as they are).
void moe_combine_backward(float* dy /*(S,C)*/, float* dweight /*(N,K)*/, const float* dout /*(N,C)*/,
                          const float* y /*(S,C)*/, const int32_t* pos /*(N,K)*/, const float* weight /*(N,K)*/, int N,
                          int K, int C);
/// The dispatch's backward: dx[t] += sum over kept routes i of token t (in k order) of drows[pos[i]].
void moe_dispatch_backward(float* dx /*(N,C)*/, const float* drows /*(S,C)*/, const int32_t* pos /*(N,K)*/, int N,
                           int K, int C);

/// out = a * b element by element (accumulate: out += a * b).
void multiply(float* out /*(n)*/, const float* a /*(n)*/, const float* b /*(n)*/, size_t n, bool accumulate);

/// Residual-MoE: coef (N, 2) holds logits on entry and their softmax on return;
/// out[t] = coef[t,0] * moe[t] + coef[t,1] * dense[t].
void residual_mix(float* out /*(N,C)*/, float* coef /*(N,2)*/, const float* moe /*(N,C)*/, const float* dense /*(N,C)*/,
                  int N, int C);
/// Its backward from the softmaxed coef: dmoe = c0 dout, ddense = c1 dout (overwritten), and
/// dlogits[t,j] = c_j (g_j - c0 g0 - c1 g1), g0 = dot(dout, moe), g1 = dot(dout, dense) (double).
void residual_mix_backward(float* dmoe /*(N,C)*/, float* ddense /*(N,C)*/, float* dlogits /*(N,2)*/,
                           const float* dout /*(N,C)*/, const float* coef /*(N,2)*/, const float* moe /*(N,C)*/,
                           const float* dense /*(N,C)*/, int N, int C);

}  // namespace hpct::kernels
