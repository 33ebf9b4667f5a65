// CPU forward/backward of the GPT ops. Element-wise and per-row loops run as Kokkos parallel
// patterns on the host execution space (Serial in Debian's build: one rank per core); matrix work
// goes through gemm(). See ops.hpp for the contract (backward accumulates).
#include <Kokkos_Core.hpp>
#include <cblas.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/ops.hpp"

#if defined(HPCT_HAVE_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_config(void);

namespace hpct::kernels {

using Policy = Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>;

namespace {
std::mutex g_mu;
int g_refs = 0;
bool g_we_initialized = false;
}  // namespace

BackendScope::BackendScope() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_refs++ == 0) {
    // One rank per core: BLAS and oneDNN's OpenMP must not spawn threads of their own unless the
    // user asked for them explicitly.
    if (!std::getenv("OMP_NUM_THREADS")) setenv("OMP_NUM_THREADS", "1", 0);
    const char* bt = std::getenv("OPENBLAS_NUM_THREADS");
    openblas_set_num_threads(bt ? std::atoi(bt) : 1);
    if (!Kokkos::is_initialized()) {
      Kokkos::InitArguments args;
      args.num_threads = 1;
      args.disable_warnings = true;
      Kokkos::initialize(args);
      g_we_initialized = true;
    }
  }
}

BackendScope::~BackendScope() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (--g_refs == 0 && g_we_initialized && Kokkos::is_initialized()) {
    Kokkos::finalize();
    g_we_initialized = false;
  }
}

std::string backend_description() {
  std::string s = "cpu: Kokkos ";
  s += Kokkos::DefaultHostExecutionSpace::name();
  s += ", OpenBLAS (";
  s += openblas_get_config();
  s += ")";
#if defined(HPCT_HAVE_ONEDNN)
  auto v = dnnl::version();
  s += ", oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + " for bf16";
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: s += " (AMX)"; break;
    case dnnl::cpu_isa::avx512_core_bf16: s += " (AVX512-BF16)"; break;
    default: s += " (no native bf16 on this CPU)"; break;
  }
#else
  s += ", bf16 emulated by rounding";
#endif
  return s;
}

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C) {
  Kokkos::parallel_for("encoder_forward", Policy(0, (size_t)B * T), KOKKOS_LAMBDA(size_t bt) {
    const size_t t = bt % T;
    const float* e = wte + (size_t)tokens[bt] * C;
    const float* p = wpe + t * C;
    float* o = out + bt * C;
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  });
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  // Scatter-add into rows chosen by the tokens: rows repeat, so this stays a serial loop.
  for (size_t bt = 0; bt < (size_t)B * T; ++bt) {
    const float* d = dout + bt * C;
    float* e = dwte + (size_t)tokens[bt] * C;
    float* p = dwpe + (bt % T) * C;
    for (int c = 0; c < C; ++c) {
      e[c] += d[c];
      p[c] += d[c];
    }
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C) {
  Kokkos::parallel_for("layernorm_forward", Policy(0, N), KOKKOS_LAMBDA(size_t i) {
    const float* x = inp + i * C;
    float m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    float v = 0;
    for (int c = 0; c < C; ++c) {
      float d = x[c] - m;
      v += d * d;
    }
    v /= C;
    float s = 1.0f / std::sqrt(v + 1e-5f);
    float* o = out + i * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  // Rows are independent for dinp; dweight/dbias sum over rows (kept serial over rows for a fixed
  // summation order, so results are bitwise reproducible).
  for (int i = 0; i < N; ++i) {
    const float* d = dout + (size_t)i * C;
    const float* x = inp + (size_t)i * C;
    float* dx = dinp + (size_t)i * C;
    const float m = mean[i], s = rstd[i];
    float dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = 0; c < C; ++c) {
      float n = (x[c] - m) * s;
      float dn = weight[c] * d[c];
      dnorm_mean += dn;
      dnorm_norm_mean += dn * n;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      float n = (x[c] - m) * s;
      float dn = weight[c] * d[c];
      dbias[c] += d[c];
      dweight[c] += n * d[c];
      dx[c] += (dn - dnorm_mean - n * dnorm_norm_mean) * s;
    }
  }
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    Precision p) {
  gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, p);
  if (bias) {
    Kokkos::parallel_for("bias_add", Policy(0, N), KOKKOS_LAMBDA(size_t i) {
      float* o = out + i * OC;
      for (int j = 0; j < OC; ++j) o[j] += bias[j];
    });
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, Precision p) {
  if (dinp) gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C, p);
  gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, p);
  if (dbias) {
    for (int i = 0; i < N; ++i) {
      const float* d = dout + (size_t)i * OC;
      for (int j = 0; j < OC; ++j) dbias[j] += d[j];
    }
  }
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, Precision p) {
  const int HS = C / NH;
  const float sc = 1.0f / std::sqrt((float)HS);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + (size_t)b * T * 3 * C + h * HS;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* P = att + ((size_t)b * NH + h) * T * T;  // (T, T)
      gemm(false, true, T, T, HS, sc, q, 3 * C, k, 3 * C, 0.0f, P, T, p);
      Kokkos::parallel_for("causal_softmax", Policy(0, T), KOKKOS_LAMBDA(size_t t) {
        float* row = P + t * T;
        float mx = -INFINITY;
        for (size_t j = 0; j <= t; ++j) mx = row[j] > mx ? row[j] : mx;
        float sum = 0;
        for (size_t j = 0; j <= t; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        float inv = 1.0f / sum;
        for (size_t j = 0; j <= t; ++j) row[j] *= inv;
        for (size_t j = t + 1; j < (size_t)T; ++j) row[j] = 0.0f;
      });
      gemm(false, false, T, HS, T, 1.0f, P, T, v, 3 * C, 0.0f, out + (size_t)b * T * C + h * HS, C, p);
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH,
                        Precision p) {
  const int HS = C / NH;
  const float sc = 1.0f / std::sqrt((float)HS);
  thread_local std::vector<float> dP;
  dP.resize((size_t)T * T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const size_t base = (size_t)b * T * 3 * C + h * HS;
      const float* q = qkv + base;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + base;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* P = att + ((size_t)b * NH + h) * T * T;
      const float* dO = dout + (size_t)b * T * C + h * HS;
      float* dS = dP.data();
      gemm(false, true, T, T, HS, 1.0f, dO, C, v, 3 * C, 0.0f, dS, T, p);   // dP = dO V^T
      gemm(true, false, T, HS, T, 1.0f, P, T, dO, C, 1.0f, dv, 3 * C, p);   // dV += P^T dO
      Kokkos::parallel_for("softmax_backward", Policy(0, T), KOKKOS_LAMBDA(size_t t) {
        const float* pr = P + t * T;
        float* d = dS + t * T;
        float dot = 0;
        for (size_t j = 0; j <= t; ++j) dot += pr[j] * d[j];
        for (size_t j = 0; j <= t; ++j) d[j] = pr[j] * (d[j] - dot);
        for (size_t j = t + 1; j < (size_t)T; ++j) d[j] = 0.0f;
      });
      gemm(false, false, T, HS, T, sc, dS, T, k, 3 * C, 1.0f, dq, 3 * C, p);  // dQ += s dS K
      gemm(true, false, T, HS, T, sc, dS, T, q, 3 * C, 1.0f, dk, 3 * C, p);   // dK += s dS^T Q
    }
  }
}

static constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)

void gelu_forward(float* out, const float* inp, size_t n) {
  Kokkos::parallel_for("gelu_forward", Policy(0, n), KOKKOS_LAMBDA(size_t i) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluS * (x + 0.044715f * x * x * x)));
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  Kokkos::parallel_for("gelu_backward", Policy(0, n), KOKKOS_LAMBDA(size_t i) {
    float x = inp[i];
    float u = kGeluS * (x + 0.044715f * x * x * x);
    float th = std::tanh(u);
    float sech2 = 1.0f - th * th;
    float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluS * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += g * dout[i];
  });
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  Kokkos::parallel_for("residual_forward", Policy(0, n), KOKKOS_LAMBDA(size_t i) { out[i] = a[i] + b[i]; });
}

void softmax_cross_entropy(float* logits, float* losses, const int32_t* targets, float dloss, int N, int V, int Vp) {
  Kokkos::parallel_for("softmax_cross_entropy", Policy(0, N), KOKKOS_LAMBDA(size_t i) {
    float* row = logits + i * Vp;
    const int32_t tgt = targets[i];
    if (tgt < 0) {
      losses[i] = 0.0f;
      for (int j = 0; j < Vp; ++j) row[j] = 0.0f;
      return;
    }
    float mx = -INFINITY;
    for (int j = 0; j < V; ++j) mx = row[j] > mx ? row[j] : mx;
    double sum = 0;
    for (int j = 0; j < V; ++j) {
      float e = std::exp(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    const float inv = (float)(1.0 / sum);
    losses[i] = (float)(std::log(sum) - std::log((double)row[tgt]));
    for (int j = 0; j < V; ++j) row[j] = row[j] * inv * dloss;
    row[tgt] -= dloss;
    for (int j = V; j < Vp; ++j) row[j] = 0.0f;
  });
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int step, float grad_scale) {
  const float bc1 = 1.0f - std::pow(beta1, (float)step);
  const float bc2 = 1.0f - std::pow(beta2, (float)step);
  Kokkos::parallel_for("adamw", Policy(0, n), KOKKOS_LAMBDA(size_t i) {
    float g = grad[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1;
    float vhat = vi / bc2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
  });
}

double sum_of_squares(const float* x, size_t n) {
  double s = 0;
  Kokkos::parallel_reduce("sum_of_squares", Policy(0, n), KOKKOS_LAMBDA(size_t i, double& acc) {
    acc += (double)x[i] * x[i];
  }, s);
  return s;
}

bool all_finite(const float* x, size_t n) { return std::isfinite(sum_of_squares(x, n)); }

void scale(float* x, float s, size_t n) {
  Kokkos::parallel_for("scale", Policy(0, n), KOKKOS_LAMBDA(size_t i) { x[i] *= s; });
}

}  // namespace hpct::kernels
