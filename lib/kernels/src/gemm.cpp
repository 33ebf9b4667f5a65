// GEMM dispatch by precision: OpenBLAS for fp32 (and fp16-rounded inputs), oneDNN for bf16.
//
// Trade-off: bf16 inputs are converted from the fp32 buffers on every call (one extra pass over
// A and B) so that the model keeps a single fp32 activation format; the AMX/AVX512-BF16 matmul is
// still several times faster than sgemm for the large GEMMs. oneDNN primitives are expensive to
// create, so they are cached per shape.
#include <cblas.h>

#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/ops.hpp"

#if defined(HPCT_HAVE_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace hpct::kernels {
namespace {

// fp32 -> bf16 bits, round to nearest even (NaN kept quiet).
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Copies a (rows, cols) matrix with leading dimension ld into a packed buffer, converted.
template <typename Out, typename Fn>
void pack(const float* src, int rows, int cols, int ld, std::vector<Out>& dst, Fn conv) {
  dst.resize((size_t)rows * cols);
  for (int r = 0; r < rows; ++r) {
    const float* s = src + (size_t)r * ld;
    Out* d = dst.data() + (size_t)r * cols;
    for (int c = 0; c < cols; ++c) d[c] = conv(s[c]);
  }
}

void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

#if defined(HPCT_HAVE_ONEDNN)
struct DnnlState {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  std::map<std::tuple<int, int, int, bool, bool, bool, float>, dnnl::matmul> cache;
  std::vector<uint16_t> a, b;
};

void gemm_bf16_onednn(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                      int ldb, float beta, float* C, int ldc) {
  thread_local DnnlState st;
  using dt = dnnl::memory::data_type;
  using md = dnnl::memory::desc;
  // Pack the stored matrices (transposed or not) into dense bf16 and describe op() by strides.
  int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  pack(A, ar, ac, lda, st.a, to_bf16);
  pack(B, br, bc, ldb, st.b, to_bf16);
  md a_md({M, K}, dt::bf16, ta ? dnnl::memory::dims{1, M} : dnnl::memory::dims{K, 1});
  md b_md({K, N}, dt::bf16, tb ? dnnl::memory::dims{1, K} : dnnl::memory::dims{N, 1});
  md c_md({M, N}, dt::f32, dnnl::memory::dims{ldc, 1});
  bool accumulate = beta != 0.0f;
  auto key = std::make_tuple(M, N, K, ta, tb, accumulate, accumulate ? beta : 0.0f);
  auto it = st.cache.find(key);
  if (it == st.cache.end()) {
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
    auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, st.eng);
    it = st.cache.emplace(key, dnnl::matmul(pd)).first;
  }
  dnnl::memory am(a_md, st.eng, st.a.data()), bm(b_md, st.eng, st.b.data()), cm(c_md, st.eng, C);
  dnnl::memory sm({{1}, dt::f32, {1}}, st.eng, &alpha);
  it->second.execute(st.strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm},
                               {DNNL_ARG_ATTR_OUTPUT_SCALES, sm}});
  st.strm.wait();
}
#endif

}  // namespace

void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc, Precision p) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
    return;
  }
  switch (p) {
    case Precision::fp32:
      sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    case Precision::bf16: {
#if defined(HPCT_HAVE_ONEDNN)
      gemm_bf16_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
      thread_local std::vector<float> a, b;
      auto r = [](float x) { return bf16_to_float(to_bf16(x)); };
      pack(A, ta ? K : M, ta ? M : K, lda, a, r);
      pack(B, tb ? N : K, tb ? K : N, ldb, b, r);
      sgemm(ta, tb, M, N, K, alpha, a.data(), ta ? M : K, b.data(), tb ? K : N, beta, C, ldc);
#endif
      return;
    }
    case Precision::fp16: {
      thread_local std::vector<float> a, b;
      auto r = [](float x) { return static_cast<float>(static_cast<_Float16>(x)); };
      pack(A, ta ? K : M, ta ? M : K, lda, a, r);
      pack(B, tb ? N : K, tb ? K : N, ldb, b, r);
      sgemm(ta, tb, M, N, K, alpha, a.data(), ta ? M : K, b.data(), tb ? K : N, beta, C, ldc);
      return;
    }
  }
}

}  // namespace hpct::kernels
