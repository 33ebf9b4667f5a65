// Megatron's BlendableDataset index: each dataset's share of any run's samples follows its weight
// (within 1% over a run, within two samples at every prefix), samples are a function of i alone
// (so a resumed run reads the same ones), Megatron's per-dataset sample counts.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "hpct/core/error.hpp"
#include "hpct/io/blended_dataset.hpp"

using namespace hpct;

namespace {
// Sample i of dataset d is the tokens d*1e6 + i, ... (so a read says where it came from).
class Numbered : public io::TokenDataset {
 public:
  Numbered(int d, size_t n) : d_(d), n_(n) {}
  size_t size() const override { return n_; }
  size_t seq_length() const override { return 3; }
  void get(size_t i, int32_t* out) const override {
    for (int t = 0; t < 4; ++t) out[t] = d_ * 1000000 + (int32_t)i;
  }

 private:
  int d_;
  size_t n_;
};

std::shared_ptr<io::BlendedDataset> make(const std::vector<double>& w, size_t size) {
  std::vector<std::shared_ptr<const io::TokenDataset>> parts;
  const auto need = io::BlendedDataset::samples_needed(w, size);
  for (size_t k = 0; k < w.size(); ++k) parts.push_back(std::make_shared<Numbered>((int)k, need[k]));
  return std::make_shared<io::BlendedDataset>(parts, w, size);
}
}  // namespace

TEST(BlendedDataset, SharesFollowTheWeights) {
  const std::vector<double> w = {0.7, 0.2, 0.1};  // Megatron's weights need not sum to 1: normalised
  auto b = make({7, 2, 1}, 5000);
  std::vector<double> seen(3, 0);
  for (size_t i = 0; i < b->size(); ++i) {
    seen[b->dataset_of(i)] += 1;
    if (i >= 1)
      for (size_t k = 0; k < 3; ++k)  // the greedy rule keeps every prefix close to its share
        ASSERT_LE(std::fabs(seen[k] - w[k] * double(i + 1)), 2.0) << "dataset " << k << " after " << i + 1 << " samples";
  }
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(seen[k] / 5000.0, w[k], 0.01 * w[k]) << "dataset " << k;  // the 1% of the weight
    EXPECT_EQ(b->counts()[k], (size_t)seen[k]);
  }
}

TEST(BlendedDataset, EachDatasetIsReadInOrderAndSamplesDependOnIAlone) {
  auto a = make({0.5, 0.5}, 1000), b = make({0.5, 0.5}, 1000);
  std::vector<size_t> next(2, 0);
  int32_t x[4], y[4];
  for (size_t i = 0; i < 1000; ++i) {
    a->get(i, x);
    b->get(i, y);
    ASSERT_EQ(x[0], y[0]);
    const size_t d = (size_t)x[0] / 1000000, s = (size_t)x[0] % 1000000;
    EXPECT_EQ(d, a->dataset_of(i));
    EXPECT_EQ(s, next[d]++) << "dataset " << d << " is read sample by sample";
  }
  // Megatron's rule at its start: sample 0 to the first dataset (ties go to the lowest index).
  EXPECT_EQ(a->dataset_of(0), 0u);
  EXPECT_EQ(a->dataset_of(1), 1u);
}

TEST(BlendedDataset, MegatronsSampleCountsAndRefusals) {
  const auto need = io::BlendedDataset::samples_needed({0.3, 0.7}, 1000);
  EXPECT_EQ(need[0], (size_t)std::ceil(0.3 * 1000 * 1.005));  // 302
  EXPECT_EQ(need[1], (size_t)std::ceil(0.7 * 1000 * 1.005));  // 704
  std::vector<std::shared_ptr<const io::TokenDataset>> small = {std::make_shared<Numbered>(0, 10), std::make_shared<Numbered>(1, 704)};
  EXPECT_THROW(io::BlendedDataset(small, {0.3, 0.7}, 1000), Error);
  EXPECT_THROW(make({1.0, -1.0}, 10), Error);
  EXPECT_THROW(make({1.0, 0.0}, 10), Error);
}
