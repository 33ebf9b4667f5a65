// 16-bit storage conversions (hpct/kernels/half.hpp) against scalar references: bf16 by bit
// arithmetic (round to nearest even on the upper 16 bits), fp16 by the compiler's _Float16. Lengths
// not a multiple of the 8-lane F16C loop, so the vector body and the scalar tail both run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/kernels/host_copy.hpp"
#include "hpct/kernels/optim.hpp"

using namespace hpct;
using kernels::Precision;

namespace {
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Reference bf16: the two neighbours on the bf16 grid, the nearer one, ties to the even one.
float bf16_ref(float x) {
  if (std::isnan(x)) return x;
  const uint32_t u = bits(x), lo = u & 0xffff0000u, hi = lo + 0x10000u;
  const double dlo = std::fabs(double(x) - from_bits(lo)), dhi = std::fabs(double(from_bits(hi)) - x);
  if (dlo < dhi) return from_bits(lo);
  if (dhi < dlo) return from_bits(hi);
  return ((lo >> 16) & 1) ? from_bits(hi) : from_bits(lo);
}
float fp16_ref(float x) { return static_cast<float>(static_cast<kernels::ieee_half>(x)); }

std::vector<float> samples(size_t n, unsigned seed = 42) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = d(g) * std::pow(10.0f, std::uniform_int_distribution<int>(-6, 4)(g));
  // edges: zeros, ties, the fp16 limit and beyond, inf, NaN, subnormals
  const float edges[] = {0.0f, -0.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 65504.0f, 65520.0f, 1e6f, -1e6f,
                         std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 1e-40f, 3e-8f};
  for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); ++i) x[i * 7 % n] = edges[i];
  return x;
}

bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }
}  // namespace

TEST(Half, RoundTripMatchesReference) {
  for (auto p : {Precision::bf16, Precision::fp16}) {
    auto x = samples(1003);
    std::vector<uint16_t> h(x.size());
    std::vector<float> y(x.size());
    kernels::to_half(x.data(), h.data(), x.size(), p);
    kernels::from_half(h.data(), y.data(), x.size(), p);
    size_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = p == Precision::bf16 ? bf16_ref(x[i]) : fp16_ref(x[i]);
      if (!same(y[i], want) && ++bad < 5) ADD_FAILURE() << precision_name(p) << " x=" << x[i] << " got " << y[i] << " want " << want;
    }
    EXPECT_EQ(bad, 0u) << precision_name(p);
  }
  // fp16 overflows to inf (what loss scaling must see); bf16 keeps the value's magnitude
  uint16_t h;
  const float big = 1e6f;
  float back;
  kernels::to_half(&big, &h, 1, Precision::fp16);
  kernels::from_half(&h, &back, 1, Precision::fp16);
  EXPECT_TRUE(std::isinf(back));
  kernels::to_half(&big, &h, 1, Precision::bf16);
  kernels::from_half(&h, &back, 1, Precision::bf16);
  EXPECT_NEAR(back, 1e6f, 1e6f / 256);
}

TEST(Half, AccumulateRoundsOncePerAdd) {
  for (auto p : {Precision::bf16, Precision::fp16}) {
    const auto x = samples(517), a = samples(517, 7);  // different values: cancellation, mixed signs and sizes
    std::vector<uint16_t> acc(x.size());
    kernels::to_half(a.data(), acc.data(), a.size(), p);
    std::vector<float> widened(x.size()), sum(x.size());
    kernels::from_half(acc.data(), widened.data(), x.size(), p);
    kernels::accumulate_half(x.data(), acc.data(), x.size(), p);
    kernels::from_half(acc.data(), sum.data(), x.size(), p);
    std::vector<float> added(x.begin(), x.end());
    kernels::add_from_half(std::vector<uint16_t>(acc).data(), added.data(), x.size(), p);
    std::vector<uint16_t> hx(x.size()), pair(acc);
    kernels::to_half(x.data(), hx.data(), x.size(), p);
    kernels::add_half(hx.data(), pair.data(), x.size(), p);  // pair = acc + x, both 16-bit
    std::vector<float> wx(x.size()), wpair(x.size());
    kernels::from_half(hx.data(), wx.data(), x.size(), p);
    kernels::from_half(pair.data(), wpair.data(), x.size(), p);
    for (size_t i = 0; i < x.size(); ++i) {
      const float exact = widened[i] + x[(i)];
      const float want = p == Precision::bf16 ? bf16_ref(exact) : fp16_ref(exact);
      ASSERT_TRUE(same(sum[i], want)) << precision_name(p) << " i=" << i << " got " << sum[i] << " want " << want;
      ASSERT_TRUE(same(added[i], x[i] + sum[i])) << precision_name(p) << " add_from_half, i=" << i;
      const float pair_exact = sum[i] + wx[i];
      ASSERT_TRUE(same(wpair[i], p == Precision::bf16 ? bf16_ref(pair_exact) : fp16_ref(pair_exact)))
          << precision_name(p) << " add_half, i=" << i;
    }
  }
}

TEST(Half, Fp32HasNoHalfStorage) {
  float x = 1;
  uint16_t h;
  EXPECT_THROW(kernels::to_half(&x, &h, 1, Precision::fp32), Error);
}

// host_copy (the hand-over's block copies) in pieces over the threads is memcpy: every byte, at
// sizes below, at and above the threaded threshold (1 MiB), with tails that are no multiple of a
// piece and unaligned ends, and nothing written past the end.
TEST(HostCopy, ThreadedIsMemcpy) {
  std::mt19937 g(7);
  for (int threads : {1, 3}) {
    kernels::set_optimizer_threads(threads);
    for (size_t bytes : {size_t(0), size_t(5), size_t(1) << 20, (size_t(1) << 20) + 12345, (size_t(3) << 20) + 7}) {
      std::vector<unsigned char> src(bytes + 3), dst(bytes + 3, 0xAB);
      for (auto& c : src) c = static_cast<unsigned char>(g());
      kernels::host_copy(dst.data() + 1, src.data() + 1, bytes);
      EXPECT_EQ(std::memcmp(dst.data() + 1, src.data() + 1, bytes), 0) << bytes << " bytes, " << threads << " threads";
      EXPECT_EQ(dst[0], 0xAB);
      EXPECT_EQ(dst[bytes + 1], 0xAB) << "written past the end";
    }
  }
  kernels::set_optimizer_threads(0);
}
