// ParamLayout's tensor-parallel partitions: the runs of the full tensor a rank's part covers.
#include <gtest/gtest.h>

#include <numeric>

#include "hpct/core/error.hpp"
#include "hpct/core/param_layout.hpp"

using namespace hpct;

namespace {
// The full-tensor index of every local element, by walking runs over [begin, end).
std::vector<uint64_t> full_index(const TensorSpec& t, uint64_t begin, uint64_t end) {
  std::vector<uint64_t> out;
  t.for_full_runs(begin, end, [&](uint64_t full, uint64_t local, uint64_t n) {
    EXPECT_EQ(local, begin + out.size());
    for (uint64_t k = 0; k < n; ++k) out.push_back(full + k);
  });
  return out;
}

// Reference: slice the full tensor explicitly (indices of a row-major array of `shape`).
std::vector<uint64_t> reference(std::vector<int64_t> shape, const Partition& p) {
  uint64_t outer = 1, inner = 1;
  for (int d = 0; d < p.dim; ++d) outer *= shape[d];
  for (size_t d = p.dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const uint64_t D = shape[p.dim], sec = D / p.stride, piece = sec / p.parts;
  std::vector<uint64_t> out;
  for (uint64_t o = 0; o < outer; ++o)
    for (int s = 0; s < p.stride; ++s)
      for (uint64_t r = 0; r < piece; ++r)
        for (uint64_t i = 0; i < inner; ++i) out.push_back((o * D + s * sec + p.index * piece + r) * inner + i);
  return out;
}
}  // namespace

TEST(ParamLayout, PartitionRunsCoverTheSlice) {
  struct Case {
    std::vector<int64_t> shape;
    int dim, parts, stride;
  };
  // qkv weight (3C, C) stride 3; fc weight (4C, C) rows; proj weight (C, 4C) columns; a 1-D bias;
  // a 3-D tensor split in the middle.
  const Case cases[] = {{{24, 8}, 0, 2, 3}, {{32, 8}, 0, 4, 1}, {{8, 32}, 1, 4, 1}, {{24}, 0, 4, 3}, {{3, 8, 5}, 1, 2, 2}};
  for (const auto& c : cases)
    for (int idx = 0; idx < c.parts; ++idx) {
      ParamLayout l;
      const auto& t = l.add("t", c.shape, true, Partition{c.dim, c.parts, idx, c.stride});
      const auto want = reference(c.shape, t.part);
      ASSERT_EQ(t.numel, want.size());
      EXPECT_EQ(full_index(t, 0, t.numel), want) << shape_string(c.shape) << " part " << idx;
      // Any sub-range (a ZeRO slice) maps to the same indices.
      for (uint64_t b = 0; b < t.numel; b += 5) {
        const uint64_t e = std::min<uint64_t>(t.numel, b + 7);
        auto got = full_index(t, b, e);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + b)) << "range " << b << ".." << e;
      }
    }
}

TEST(ParamLayout, ReplicasAndShapes) {
  ParamLayout l;
  const auto& a = l.add("norm", {8}, false, Partition{-1, 4, 2, 1});
  EXPECT_FALSE(a.partitioned());
  EXPECT_FALSE(a.primary());  // copy 2 of 4: not counted, not written
  EXPECT_EQ(a.numel, 8u);
  const auto& b = l.add("w", {16, 8}, true, Partition{0, 4, 1, 1});
  EXPECT_TRUE(b.primary());
  EXPECT_EQ(b.numel, 32u);
  EXPECT_EQ(b.local_shape(), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(b.shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(l.numel(), 40u);
  // subset() keeps partitions
  ParamLayout s = l.subset({0});
  EXPECT_EQ(s.tensors()[1].part.index, 1);
  EXPECT_THROW(l.add("bad", {10, 8}, true, Partition{0, 4, 0, 1}), Error);  // 10 rows into 4 parts
}
