// The CUDA backend's linear-layer GEMMs on their operand forms (linear_gemms.hpp): every form of
// the input and the weight (fp32 only, 16-bit only, both) in matmul_forward, matmul_backward,
// matmul_backward_into and matmul_gelu_forward, against the CPU backend on the fp32 values of the
// rounded inputs (which is what every form means: operand.hpp). Without a CUDA device every test is
// SKIPPED.
//
// Tolerances: against the CPU, 1e-2 of the norm, as test_ops_backend_cuda's bf16 matmul (sums of
// 48-300 products of O(1) values; the CPU sums the same rounded inputs in another order, and the
// fp32-only forms let cuBLAS keep fp32 where it likes: more precise, not less). Between the forms
// that give the GPU the same 16-bit inputs (both forms, or 16 bits only) the same kernel runs on
// the same bits: equal, bitwise.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "cuda_test_util.hpp"

using namespace hpct::kernels;
using namespace hpct::kernels::test;  // cuda_test_util.hpp

namespace {

[[maybe_unused]] const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new BackendEnv);

enum class Form { fp32, half, both };
const char* form_name(Form f) { return f == Form::fp32 ? "fp32" : f == Form::half ? "16-bit" : "both"; }

// Host values already rounded to p (so every form holds the same numbers), their 16-bit copy, and
// the device operand of the asked form.
struct Input {
  Vec f;
  std::vector<uint16_t> h;
  Input(size_t n, uint64_t seed, float scale, Precision p) : f(randn(n, seed, scale)), h(n) {
    to_half(f.data(), h.data(), n, p);
    from_half(h.data(), f.data(), n, p);
  }
  Operand on(Gpu& g, Form form) {
    const float* df = form == Form::half ? nullptr : g.put(f);
    const uint16_t* dh = form == Form::fp32 ? nullptr : g.put(h);
    return Operand(df, dh);
  }
};

struct Result {
  Vec out, act, dinp, dw, db;
};

Result run(OpsBackend& be, Gpu* g, Input& x, Form fx, Input& w, Form fw, const Vec& b, const Vec& dout, int N, int C,
           int OC, Precision p) {
  Result r{Vec((size_t)N * OC), Vec((size_t)N * OC), Vec((size_t)N * C), randn((size_t)OC * C, 6), randn(OC, 7)};
  const Vec start_dinp = randn((size_t)N * C, 5);
  if (!g) {  // the CPU on the fp32 values
    be.matmul_gelu_forward(r.out.data(), r.act.data(), x.f.data(), w.f.data(), b.data(), N, C, OC, p);
    Vec dinp = start_dinp;
    be.matmul_backward(dinp.data(), r.dw.data(), r.db.data(), dout.data(), x.f.data(), w.f.data(), N, C, OC, p);
    be.matmul_backward_into(r.dinp.data(), r.dw.data(), r.db.data(), dout.data(), x.f.data(), w.f.data(), N, C, OC, p);
    for (size_t i = 0; i < dinp.size(); ++i) r.dinp[i] += dinp[i];  // accumulated + written
    return r;
  }
  const Operand dx = x.on(*g, fx), dwt = w.on(*g, fw);
  float *out = g->put(r.out), *act = g->put(r.act), *dinp = g->put(start_dinp), *dinp2 = g->put(r.dinp);
  float *dw = g->put(r.dw), *db = g->put(r.db);
  const float* ddout = g->put(dout);
  be.matmul_gelu_forward(out, act, dx, dwt, g->put(b), N, C, OC, p);
  be.matmul_backward(dinp, dw, db, ddout, dx, dwt, N, C, OC, p);
  be.matmul_backward_into(dinp2, dw, db, ddout, dx, dwt, N, C, OC, p);
  r.out = g->get(out, r.out.size()), r.act = g->get(act, r.act.size()), r.dw = g->get(dw, r.dw.size());
  r.db = g->get(db, OC);
  const Vec a = g->get(dinp, r.dinp.size()), c = g->get(dinp2, r.dinp.size());
  for (size_t i = 0; i < a.size(); ++i) r.dinp[i] = a[i] + c[i];
  return r;
}

void forms_case(Precision p) {
  NEED_GPU(g);
  auto cpu = cpu_ops();
  const int N = 300, C = 48, OC = 80;
  Input x((size_t)N * C, 1, 1.0f, p), w((size_t)OC * C, 2, 0.2f, p);
  const Vec b = randn(OC, 3), dout = randn((size_t)N * OC, 4);
  const Result want = run(*cpu, nullptr, x, Form::fp32, w, Form::fp32, b, dout, N, C, OC, p);
  Result half_half;
  for (Form fx : {Form::fp32, Form::half, Form::both})
    for (Form fw : {Form::fp32, Form::half, Form::both}) {
      const std::string what = std::string(precision_name(p)) + " input " + form_name(fx) + ", weight " + form_name(fw);
      const Result got = run(*g.be, &g, x, fx, w, fw, b, dout, N, C, OC, p);
      expect_close_norm(what + ": out", got.out, want.out, 1e-2);
      expect_close_norm(what + ": gelu", got.act, want.act, 1e-2);
      expect_close_norm(what + ": dinp", got.dinp, want.dinp, 1e-2);
      expect_close_norm(what + ": dweight", got.dw, want.dw, 1e-2);
      expect_close(what + ": dbias", got.db, want.db);  // column sums in fp32 on both sides
      if (fx == Form::half && fw == Form::half) half_half = got;
      if (fx == Form::both && fw == Form::both) {  // the same 16-bit inputs as 16-bit only: the same bits
        EXPECT_EQ(got.out, half_half.out) << what;
        EXPECT_EQ(got.dinp, half_half.dinp) << what;
        EXPECT_EQ(got.dw, half_half.dw) << what;
      }
    }
}

TEST(CudaLinear, EveryOperandFormBf16) { forms_case(Precision::bf16); }
TEST(CudaLinear, EveryOperandFormFp16) { forms_case(Precision::fp16); }

// An fp32 op refuses an input that comes only in 16 bits (it has no precision to read it in).
TEST(CudaLinear, Fp32OpRefusesHalfOnlyInput) {
  NEED_GPU(g);
  const int N = 4, C = 8, OC = 8;
  Input x((size_t)N * C, 1, 1.0f, Precision::bf16), w((size_t)OC * C, 2, 0.2f, Precision::bf16);
  Vec out((size_t)N * OC);
  EXPECT_THROW(g.be->matmul_forward(g.put(out), x.on(g, Form::half), w.on(g, Form::fp32), nullptr, N, C, OC,
                                    Precision::fp32),
               hpct::Error);
}

}  // namespace
