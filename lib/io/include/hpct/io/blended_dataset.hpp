// hpct/io/blended_dataset.hpp — Megatron's BlendableDataset: samples drawn from several datasets in
// given proportions (--data-path w1 p1 w2 p2 ...).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "hpct/io/gpt_dataset.hpp"

namespace hpct::io {

/// Sample i of the blend comes from dataset dataset_of(i), as its sample_in_dataset(i)-th, chosen by
/// Megatron's greedy rule (helpers.cpp build_blending_indices): each sample goes to the dataset that
/// is furthest behind its share, weight x max(i, 1) - samples given so far (the first on ties).
/// Over any prefix of n samples each dataset's count stays within a sample or two of weight x n, and
/// every sample is a function of i alone, so a run resumed at any sample reads the same data.
class BlendedDataset : public TokenDataset {
 public:
  /// weights: positive, normalised here. Each part must hold at least samples_needed(weights,
  /// size)[k] samples (Megatron's ceil(w x size x 1.005)); throws hpct::Error otherwise, or for
  /// parts of different sequence lengths, or with more than 65535 parts.
  BlendedDataset(std::vector<std::shared_ptr<const TokenDataset>> parts, std::vector<double> weights, size_t size);

  /// Megatron's per-dataset sample counts for a blend of `size` samples (weights normalised).
  static std::vector<size_t> samples_needed(const std::vector<double>& weights, size_t size);

  size_t size() const override { return dataset_.size(); }
  size_t seq_length() const override { return parts_[0]->seq_length(); }
  void get(size_t i, int32_t* out) const override { parts_[dataset_[i]]->get(sample_[i], out); }

  size_t dataset_of(size_t i) const { return dataset_[i]; }
  size_t sample_in_dataset(size_t i) const { return sample_[i]; }
  /// Samples of the whole blend drawn from each part.
  const std::vector<size_t>& counts() const { return counts_; }
  const std::vector<double>& weights() const { return weights_; }

 private:
  std::vector<std::shared_ptr<const TokenDataset>> parts_;
  std::vector<double> weights_;
  std::vector<uint16_t> dataset_;  // (size) which part
  std::vector<int64_t> sample_;    // (size) which sample of it
  std::vector<size_t> counts_;
};

}  // namespace hpct::io
