// What the CUDA backend's op tests share (test_ops_backend_cuda, test_fusions_cuda): the kernels'
// global state for the binary, seeded normal inputs, device copies of host vectors, and the two
// comparisons (element-wise relative + absolute; norm-wise for 16-bit GEMMs, whose element errors
// grow with the number of products summed and are not relative to each, possibly near-zero, output).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/ops_backend.hpp"

namespace hpct::kernels::test {

using Vec = std::vector<float>;

class BackendEnv : public ::testing::Environment {
 public:
  void SetUp() override { scope_ = std::make_unique<BackendScope>(); }
  void TearDown() override { scope_.reset(); }

 private:
  std::unique_ptr<BackendScope> scope_;
};

inline Vec randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Seeded normal host values already rounded to p (so the fp32 and 16-bit forms hold the same
// numbers), and their 16-bit copy.
struct Rounded {
  Vec f;
  std::vector<uint16_t> h;
  Rounded(size_t n, uint64_t seed, float scale, Precision p) : f(randn(n, seed, scale)), h(n) {
    to_half(f.data(), h.data(), n, p);
    from_half(h.data(), f.data(), n, p);
  }
};

// The GPU backend (null where there is no device) and device copies of host vectors, `shift`
// elements into their allocation (1: not 16-byte aligned, for the kernels' narrow-load paths).
struct Gpu {
  std::unique_ptr<OpsBackend> be;
  std::vector<BackendBuffer> keep;
  int shift = 0;
  Gpu() {
    if (cuda_ops_available()) be = cuda_ops(0);
  }
  template <class T>
  T* put(const std::vector<T>& v) {
    keep.emplace_back(*be, (v.size() + 4) * sizeof(T));
    T* d = keep.back().as<T>() + shift;
    be->copy_from_host(d, v.data(), v.size() * sizeof(T));
    return d;
  }
  Vec get(const float* d, size_t n) {
    Vec h(n);
    be->copy_to_host(h.data(), d, n * sizeof(float));
    return h;
  }
};

/// The device's 16-bit values (p's format), widened.
inline Vec widened(Gpu& g, const uint16_t* d, size_t n, Precision p) {
  std::vector<uint16_t> h(n);
  g.be->copy_to_host(h.data(), d, n * sizeof(uint16_t));
  Vec v(n);
  from_half(h.data(), v.data(), n, p);
  return v;
}
/// n 16-bit values of device memory, NaN-filled (bf16's quiet NaN bits), with room for a shift.
inline uint16_t* half_buffer(Gpu& g, size_t n) { return g.put(std::vector<uint16_t>(n + 4, 0x7fc1)); }

/// |gpu - cpu|_2 <= rel |cpu|_2.
inline void expect_close_norm(const std::string& what, const Vec& gpu, const Vec& cpu, double rel) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double d = 0, n = 0;
  for (size_t i = 0; i < cpu.size(); ++i) d += (double(gpu[i]) - cpu[i]) * (double(gpu[i]) - cpu[i]), n += double(cpu[i]) * cpu[i];
  EXPECT_LE(std::sqrt(d), rel * std::sqrt(n)) << what;
}

/// Every element: |gpu - cpu| <= abs + rel |cpu|.
inline void expect_close(const std::string& what, const Vec& gpu, const Vec& cpu, double rel = 1e-4, double abs = 1e-5) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < cpu.size(); ++i)
    if (!(std::fabs(gpu[i] - cpu[i]) <= abs + rel * std::fabs(cpu[i])) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": first at " << first << ": gpu " << gpu[first] << " cpu " << cpu[first];
}

}  // namespace hpct::kernels::test

// Declares `Gpu g` and skips the test, with the backend's reason, where there is no CUDA device.
#define NEED_GPU(g)                        \
  ::hpct::kernels::test::Gpu g;            \
  if (!g.be) {                             \
    std::string why;                       \
    ::hpct::kernels::cuda_ops_available(&why); \
    GTEST_SKIP() << why;                   \
  }
