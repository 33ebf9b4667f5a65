// A linear layer's forward with its bias in the GEMM: cuBLASLt's BIAS epilogue (bias_gemm.hpp).
// Row-major products through column-major cuBLASLt as linear_gemms.cpp's gemm(): out^T (OC x N) =
// W (as the C x OC column-major matrix, transposed) times inp^T (C x N); the bias runs along D's
// rows, OC of them, as the epilogue adds it.
#include "bias_gemm.hpp"

#include <cstdlib>
#include <string>

namespace hpct::kernels::cuda {
namespace {

// The largest of 16, 8, 4, 2, 1 bytes that p's address is a multiple of: what the plan may assume.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int r = 16;
  while (r > 1 && a % r != 0) r /= 2;
  return r;
}

void check_lt(cublasStatus_t st, const char* what) { check(st, std::string("cuBLASLt ") + what); }

constexpr size_t kMaxWorkspace = size_t(32) << 20;  // what the heuristic may ask for

}  // namespace

BiasGemm::BiasGemm(cudaStream_t stream) : stream_(stream) {
  const char* e = std::getenv("HPCT_CUBLASLT");
  enabled_ = !(e && std::string(e) == "0");
  if (enabled_) check_lt(cublasLtCreate(&lt_), "cublasLtCreate");
}

BiasGemm::~BiasGemm() {
  for (auto& [k, p] : plans_) {
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }
  if (lt_) cublasLtDestroy(lt_);
  workspace_.release(stream_);
}

BiasGemm::Plan& BiasGemm::plan(const Key& k, const float* bias) {
  if (auto it = plans_.find(k); it != plans_.end()) return it->second;
  Plan& p = plans_[k];
  const auto [N, C, OC, bf16, al_in, al_w, al_out, al_bias] = k;
  (void)al_bias;  // the heuristic reads it off the bias pointer set below
  const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  check_lt(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  const cudaDataType_t bias_type = CUDA_R_32F;
  check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "TRANSB");
  check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
           "EPILOGUE");
  check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
           "BIAS_DATA_TYPE");
  check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
           "BIAS_POINTER");
  check_lt(cublasLtMatrixLayoutCreate(&p.a, in, C, OC, C), "the weight's layout");
  check_lt(cublasLtMatrixLayoutCreate(&p.b, in, C, N, C), "the input's layout");
  check_lt(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, OC, N, OC), "the output's layout");
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const size_t ws = kMaxWorkspace;
  const uint32_t a_in = static_cast<uint32_t>(al_in), a_w = static_cast<uint32_t>(al_w),
                 a_out = static_cast<uint32_t>(al_out);
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS)  // A is the weight, B the input, C and D the output
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a_w, sizeof(a_w));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a_in, sizeof(a_in));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &a_out, sizeof(a_out));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &a_out, sizeof(a_out));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // No algorithm (or a combination this cuBLASLt refuses): the caller's GEMM and bias pass.
  if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    p.algo = result.algo;
    p.workspace = result.workspaceSize;
    p.ok = true;
  }
  return p;
}

bool BiasGemm::forward(float* out, const uint16_t* inp, const uint16_t* weight, const float* bias, int N, int C,
                       int OC, Precision p) {
  if (!enabled_ || !bias || p == Precision::fp32) return false;
  if (N == 0 || OC == 0) return true;  // nothing to write
  const Key k{N, C, OC, p == Precision::bf16, alignment(inp), alignment(weight), alignment(out), alignment(bias)};
  Plan& pl = plan(k, bias);
  if (!pl.ok) return false;
  check_lt(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
           "BIAS_POINTER");
  void* ws = pl.workspace ? workspace_.grown(pl.workspace, stream_, "cuBLASLt's workspace") : nullptr;
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(lt_, pl.desc, &alpha, weight, pl.a, inp, pl.b, &beta, out, pl.d, out, pl.d, &pl.algo, ws,
                          pl.workspace, stream_),
           ("cublasLtMatmul with a bias (" + std::to_string(N) + "x" + std::to_string(OC) + "x" + std::to_string(C) + ")")
               .c_str());
  return true;
}

}  // namespace hpct::kernels::cuda
