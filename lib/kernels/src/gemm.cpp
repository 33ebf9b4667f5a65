// gemm(): the one matrix multiply of hpctrain, dispatched by compute precision.
//
// What it is: fp32 -> OpenBLAS sgemm; bf16 -> inputs rounded to bfloat16 and multiplied by oneDNN's
// matmul (AVX512-BF16 or AMX, fp32 accumulation) when the CPU has native bf16, else rounded fp32
// copies through sgemm; fp16 -> inputs rounded to IEEE half, then sgemm (an emulation: no CPU
// here multiplies fp16 faster, but training sees exactly fp16's range and rounding).
// What it is not: a tensor library; no batching, no fused epilogues beyond alpha/beta.
// Trade-off: inputs are converted on every call (one extra pass over A and B into thread_local
// scratch) so the model keeps one fp32 activation format; for GPT-2 shapes the conversion is a few
// percent of the bf16 matmul, which itself runs 3-5x faster than sgemm on one AVX512-BF16 core.
// oneDNN primitives cost milliseconds to create, so they are cached per shape.
#include <cblas.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/ops.hpp"
#include "bits.hpp"

#if defined(HPCT_HAVE_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "hpct/kernels/half.hpp"

namespace hpct::kernels {
namespace {

using detail::bits_as;

using detail::bf16_bits;
using detail::bf16_round;
// IEEE half, round to nearest even; beyond 65504 (+ half an ulp) becomes inf, as on a GPU.
inline float fp16_round(float f) { return static_cast<float>(static_cast<ieee_half>(f)); }

// Copies the stored (rows, cols) matrix with row stride ld into dense dst, converting each value.
// The inner loop is a plain SIMD loop (the bf16 conversion is integer ops and selects).
template <typename Out, typename Convert>
void pack(const float* src, int rows, int cols, int ld, std::vector<Out>& dst, Convert convert) {
  const size_t need = (size_t)rows * cols;
  if (dst.size() < need) dst.resize(need);
  for (int r = 0; r < rows; ++r) {
    const float* s = src + (size_t)r * ld;
    Out* d = dst.data() + (size_t)r * cols;
#pragma omp simd
    for (int c = 0; c < cols; ++c) d[c] = convert(s[c]);
  }
}

// pack() rounding through IEEE half: GCC 12 does not vectorize _Float16 conversions on CPUs
// without AVX512-FP16, so use F16C's vcvtps2ph/vcvtph2ps (8 lanes) where the build has them.
void pack_fp16_rounded(const float* src, int rows, int cols, int ld, std::vector<float>& dst) {
  const size_t need = (size_t)rows * cols;
  if (dst.size() < need) dst.resize(need);
  for (int r = 0; r < rows; ++r) {
    const float* s = src + (size_t)r * ld;
    float* d = dst.data() + (size_t)r * cols;
    int c = 0;
#if defined(__F16C__)
    for (; c + 8 <= cols; c += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + c), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_storeu_ps(d + c, _mm256_cvtph_ps(h));
    }
#endif
    for (; c < cols; ++c) d[c] = fp16_round(s[c]);
  }
}

void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

// Rounds both inputs into dense fp32 scratch, then sgemm: the portable emulation of a
// low-precision GEMM (products of rounded values, fp32 accumulation).
void rounded_sgemm(Precision p, bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                   const float* B, int ldb, float beta, float* C, int ldc) {
  thread_local std::vector<float> a, b;  // A and B in their stored layouts, densely packed
  const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  if (p == Precision::fp16) {
    pack_fp16_rounded(A, ar, ac, lda, a);
    pack_fp16_rounded(B, br, bc, ldb, b);
  } else {
    pack(A, ar, ac, lda, a, bf16_round);
    pack(B, br, bc, ldb, b, bf16_round);
  }
  sgemm(ta, tb, M, N, K, alpha, a.data(), ac, b.data(), bc, beta, C, ldc);
}

#if defined(HPCT_HAVE_ONEDNN)
// oneDNN bf16 matmul. Only used when the CPU multiplies bf16 natively: oneDNN's emulation on
// plain AVX-512 is no faster than sgemm, and AVX2-only CPUs have no bf16 matmul at all.
bool onednn_bf16_native() {
  static const bool native = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);  // a bit mask: AMX includes it
    return (isa & bf16) == bf16;
  }();
  return native;
}

struct DnnlGemm {
  using Key = std::tuple<int, int, int, bool, bool, int, uint32_t, uint32_t>;  // M N K ta tb ldc alpha beta
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, dnnl::matmul> cache;
  std::vector<uint16_t> a, b;  // bf16 copies of A and B in their stored layouts
};

// Returns false if oneDNN has no bf16 matmul for this case (then the caller emulates it).
bool gemm_bf16_onednn(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                      int ldb, float beta, float* C, int ldc) {
  thread_local DnnlGemm st;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  // Dense bf16 copies; op() is then described by strides, so no transposition pass is needed.
  const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  pack(A, ar, ac, lda, st.a, bf16_bits);
  pack(B, br, bc, ldb, st.b, bf16_bits);
  const dnnl::memory::desc a_md({M, K}, dt::bf16, ta ? dims{1, M} : dims{K, 1});
  const dnnl::memory::desc b_md({K, N}, dt::bf16, tb ? dims{1, K} : dims{N, 1});
  const dnnl::memory::desc c_md({M, N}, dt::f32, dims{ldc, 1});
  const DnnlGemm::Key key{M, N, K, ta, tb, ldc, bits_as<uint32_t>(alpha), bits_as<uint32_t>(beta)};
  auto it = st.cache.find(key);
  if (it == st.cache.end()) {
    if (st.cache.size() >= 512) st.cache.clear();  // shapes are few in training; bound it anyway
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {  // dst = alpha * A B + beta * dst
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    dnnl::matmul mm;  // stays empty (false) if oneDNN has no implementation: remembered, not retried
    try {
      mm = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, st.engine));
    } catch (const dnnl::error&) {
    }
    it = st.cache.emplace(key, mm).first;
  }
  if (!it->second) return false;
  dnnl::memory am(a_md, st.engine, st.a.data()), bm(b_md, st.engine, st.b.data()), cm(c_md, st.engine, C);
  it->second.execute(st.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  st.stream.wait();
  return true;
}
#endif

void check_args(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, const float* C,
                int ldc) {
  auto fail = [&](const std::string& what) {
    throw Error("gemm(" + std::string(ta ? "T" : "N") + std::string(tb ? "T" : "N") + ", M=" + std::to_string(M) +
                ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + "): " + what);
  };
  if (M < 0 || N < 0 || K < 0) fail("negative size");
  if (lda < std::max(1, ta ? M : K)) fail("lda=" + std::to_string(lda) + " is smaller than a stored row of A");
  if (ldb < std::max(1, tb ? K : N)) fail("ldb=" + std::to_string(ldb) + " is smaller than a stored row of B");
  if (ldc < std::max(1, N)) fail("ldc=" + std::to_string(ldc) + " is smaller than N");
  if (M > 0 && N > 0 && (!C || (K > 0 && (!A || !B)))) fail("null matrix pointer");
}

}  // namespace

namespace detail {
std::string bf16_gemm_description() {
#if defined(HPCT_HAVE_ONEDNN)
  const dnnl_version_t* v = dnnl::version();
  std::string s = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  if (!onednn_bf16_native()) return s + " found, but no native bf16 on this CPU: rounded inputs through sgemm";
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
  return s + ((isa & amx) == amx ? " (AMX)" : " (AVX512-BF16)");
#else
  return "rounded inputs through sgemm (built without oneDNN)";
#endif
}
}  // namespace detail

void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc, Precision p) {
  check_args(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: C = beta * C, where beta == 0 clears (even NaN), as BLAS does
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float& c = C[(size_t)i * ldc + j];
        c = beta == 0.0f ? 0.0f : beta * c;
      }
    return;
  }
  switch (p) {
    case Precision::fp32:
      sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    case Precision::bf16:
#if defined(HPCT_HAVE_ONEDNN)
      if (onednn_bf16_native() && gemm_bf16_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
#endif
      rounded_sgemm(p, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    case Precision::fp16:
      rounded_sgemm(p, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
  }
  throw Error("gemm: unknown Precision value " + std::to_string(static_cast<int>(p)));
}

}  // namespace hpct::kernels
