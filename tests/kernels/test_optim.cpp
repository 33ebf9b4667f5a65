// The host optimizer step (optim.hpp adamw_runs: threaded, one pass over a 16-bit gradient and the
// 16-bit copy) against the serial definition it replaced: per run, the gradient widened
// (from_half), adamw_update, then to_half of the result. Element-wise, so any number of threads
// must give the same bits: compared bitwise (memcmp, NaN payloads included) for 1, 2, 3 and 7
// threads, over runs of odd lengths (empty, 1, 7, a chunk's tail, several chunks), fp32, bf16 and
// fp16 gradients, with and without the 16-bit copy, NaN/inf gradients and values past fp16's range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/ops.hpp"
#include "hpct/kernels/optim.hpp"

using namespace hpct::kernels;

namespace {

struct State {
  std::vector<float> p, g, m, v;
  std::vector<uint16_t> g16, p16;
};

std::vector<State> make(const std::vector<size_t>& sizes, Precision prec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<State> out(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    State& s = out[k];
    const size_t n = sizes[k];
    s.p.resize(n), s.g.resize(n), s.m.resize(n), s.v.resize(n);
    for (size_t i = 0; i < n; ++i) {
      s.p[i] = d(rng) * (i % 97 == 5 ? 1e5f : 0.5f);  // some past fp16's range: inf in the copy
      s.g[i] = d(rng) * 1e-2f;
      s.m[i] = d(rng) * 1e-3f;
      s.v[i] = std::fabs(d(rng)) * 1e-6f;
    }
    if (n > 3) s.g[3] = NAN;
    if (n > 6) s.g[6] = INFINITY;
    if (prec != Precision::fp32) {
      s.g16.resize(n), s.p16.resize(n);
      to_half(s.g.data(), s.g16.data(), n, prec);
    }
  }
  return out;
}

std::vector<AdamwRun> runs_of(std::vector<State>& st, bool with_copy) {
  std::vector<AdamwRun> runs;
  for (size_t k = 0; k < st.size(); ++k) {
    State& s = st[k];
    AdamwRun r;
    r.param = s.p.data(), r.m = s.m.data(), r.v = s.v.data(), r.n = s.p.size();
    if (s.g16.empty()) r.grad = s.g.data();
    else r.grad16 = s.g16.data(), r.param16 = with_copy && k % 3 != 1 ? s.p16.data() : nullptr;
    r.weight_decay = k % 2 ? 0.1f : 0.0f;
    r.norms = k % 4 != 2;
    runs.push_back(r);
  }
  return runs;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// One BackendScope for the whole binary (Kokkos is initialised once; a scope per test would
// finalize and initialise it again, which Kokkos does not support).
class Env : public ::testing::Environment {
 public:
  void SetUp() override { scope_ = std::make_unique<BackendScope>(); }
  void TearDown() override { scope_.reset(); }

 private:
  std::unique_ptr<BackendScope> scope_;
};
[[maybe_unused]] const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Env);

class Optim : public ::testing::Test {
 protected:
  void TearDown() override { set_optimizer_threads(0); }
};

TEST_F(Optim, ThreadedEqualsTheSerialDefinitionBitwise) {
  const std::vector<size_t> sizes = {0, 1, 7, 8191, 8193, 100003, 3 * 8192};
  AdamwArgs a;
  a.lr = 3e-4f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.grad_scale = 0.7f;
  for (Precision prec : {Precision::fp32, Precision::bf16, Precision::fp16})
    for (bool copy : {true, false}) {
      a.precision = prec;
      // The serial definition, two steps.
      std::vector<State> want = make(sizes, prec, 42);
      double want_sums[3] = {0, 0, 0};
      for (int step = 1; step <= 2; ++step) {
        for (size_t k = 0; k < want.size(); ++k) {
          State& s = want[k];
          const size_t n = s.p.size();
          std::vector<float> g = s.g;
          if (prec != Precision::fp32) from_half(s.g16.data(), g.data(), n, prec);
          adamw_update(s.p.data(), g.data(), s.m.data(), s.v.data(), n, a.lr, a.beta1, a.beta2, a.eps,
                       k % 2 ? 0.1f : 0.0f, step, a.grad_scale);
          if (copy && prec != Precision::fp32 && k % 3 != 1) to_half(s.p.data(), s.p16.data(), n, prec);
          if (step == 2 && k % 4 != 2) {
            want_sums[0] += sum_of_squares(s.p.data(), n);
            want_sums[1] += sum_of_squares(s.m.data(), n);
            want_sums[2] += sum_of_squares(s.v.data(), n);
          }
        }
      }
      for (int threads : {1, 2, 3, 7}) {
        set_optimizer_threads(threads);
        ASSERT_EQ(optimizer_threads(), threads);
        std::vector<State> got = make(sizes, prec, 42);
        std::vector<AdamwRun> runs = runs_of(got, copy);
        double sums[3] = {0, 0, 0};
        for (int step = 1; step <= 2; ++step) {
          a.step = step;
          adamw_runs(runs.data(), runs.size(), a, step == 2 ? sums : nullptr);
        }
        const std::string what = std::string(precision_name(prec)) + (copy ? " with" : " without") + " the 16-bit copy, " +
                                 std::to_string(threads) + " threads";
        for (size_t k = 0; k < sizes.size(); ++k) {
          EXPECT_TRUE(same_bits(got[k].p, want[k].p)) << what << ", run " << k << ": masters";
          EXPECT_TRUE(same_bits(got[k].m, want[k].m)) << what << ", run " << k << ": exp_avg";
          EXPECT_TRUE(same_bits(got[k].v, want[k].v)) << what << ", run " << k << ": exp_avg_sq";
          EXPECT_EQ(got[k].p16, want[k].p16) << what << ", run " << k << ": 16-bit copy";
        }
        for (int i = 0; i < 3; ++i) EXPECT_EQ(std::memcmp(&sums[i], &want_sums[i], 8), 0) << what << ": state norm " << i;
      }
    }
}

TEST_F(Optim, ThreadsFromTheEnvironmentOrTheFlag) {
  ::setenv("OMP_NUM_THREADS", "3", 1);
  ::setenv("SLURM_CPUS_PER_TASK", "5", 1);
  EXPECT_EQ(optimizer_threads(), 3) << "OMP_NUM_THREADS first";
  ::unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(optimizer_threads(), 5) << "then Slurm's --cpus-per-task";
  ::setenv("SLURM_CPUS_PER_TASK", "zero", 1);
  EXPECT_GE(optimizer_threads(), 1) << "an unreadable value falls back to the CPUs this process may use";
  ::unsetenv("SLURM_CPUS_PER_TASK");
  set_optimizer_threads(4);
  EXPECT_EQ(optimizer_threads(), 4) << "the flag overrides";
  EXPECT_THROW(set_optimizer_threads(-1), hpct::Error);
  // A cap on one thread (DeviceStore's worker runs one thread short) leaves the others alone.
  int capped = 0, above = 0;
  std::thread([&] {
    set_optimizer_threads_here(3);
    capped = optimizer_threads();
    set_optimizer_threads_here(8);
    above = optimizer_threads();
  }).join();
  EXPECT_EQ(capped, 3);
  EXPECT_EQ(above, 4) << "a cap above the count changes nothing";
  EXPECT_EQ(optimizer_threads(), 4) << "the calling thread has no cap";
  EXPECT_THROW(set_optimizer_threads_here(-1), hpct::Error);
  const std::string isa = optimizer_isa();
  EXPECT_TRUE(isa == "AVX-512" || isa == "AVX2" || isa == "baseline") << isa;
}

// The 16-bit conversions of large arrays run in pieces over the threads: the same bits as one
// thread, for every function and both formats (3M + 5 elements: pieces and a tail).
TEST_F(Optim, LargeConversionsOverThreadsGiveTheSameBits) {
  const size_t n = (size_t(3) << 20) + 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 100.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  x[17] = NAN, x[18] = INFINITY, x[19] = 70000.0f;
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    std::vector<std::vector<uint16_t>> h16(2);
    std::vector<std::vector<float>> f32(2);
    for (int t : {1, 4}) {
      set_optimizer_threads(t);
      std::vector<uint16_t> a(n), b(n);
      std::vector<float> y(n), z = x;
      to_half(x.data(), a.data(), n, p);
      from_half(a.data(), y.data(), n, p);
      add_from_half(a.data(), z.data(), n, p);
      b = a;
      accumulate_half(x.data(), b.data(), n, p);
      add_half(a.data(), b.data(), n, p);
      h16[t == 4] = a;
      h16[t == 4].insert(h16[t == 4].end(), b.begin(), b.end());
      f32[t == 4] = y;
      f32[t == 4].insert(f32[t == 4].end(), z.begin(), z.end());
    }
    EXPECT_EQ(h16[0], h16[1]) << precision_name(p);
    EXPECT_TRUE(same_bits(f32[0], f32[1])) << precision_name(p);
    // The gradient norm's sum of squares of a 16-bit array: its definition (tiles of kOptimTile
    // widened, each summed by sum_of_squares, added in order) bitwise, for 1 and 4 threads.
    const std::vector<uint16_t> g(h16[0].begin(), h16[0].begin() + n);
    std::vector<uint16_t> finite = g;
    for (auto& v : finite) v &= 0x3fff;  // no inf/NaN: a sum to compare
    double want = 0;
    std::vector<float> tile(kOptimTile);
    for (size_t lo = 0; lo < n; lo += kOptimTile) {
      const size_t t = std::min(kOptimTile, n - lo);
      from_half(finite.data() + lo, tile.data(), t, p);
      want += sum_of_squares(tile.data(), t);
    }
    for (int t : {1, 4}) {
      set_optimizer_threads(t);
      const double got = sum_of_squares_half(finite.data(), n, p);
      EXPECT_EQ(std::memcmp(&got, &want, 8), 0) << precision_name(p) << ", " << t << " threads: " << got << " vs " << want;
    }
  }
}

TEST_F(Optim, ARunNeedsExactlyOneGradient) {
  std::vector<float> p(4), m(4), v(4), g(4);
  std::vector<uint16_t> g16(4);
  AdamwRun r;
  r.param = p.data(), r.m = m.data(), r.v = v.data(), r.n = 4;
  AdamwArgs a;
  EXPECT_THROW(adamw_runs(&r, 1, a, nullptr), hpct::Error) << "no gradient";
  r.grad = g.data(), r.grad16 = g16.data();
  EXPECT_THROW(adamw_runs(&r, 1, a, nullptr), hpct::Error) << "two gradients";
  a.step = 0;
  r.grad16 = nullptr;
  EXPECT_THROW(adamw_runs(&r, 1, a, nullptr), hpct::Error) << "step 0";
}

}  // namespace
