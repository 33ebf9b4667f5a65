// Megatron's BlendableDataset index (see blended_dataset.hpp).
#include "hpct/io/blended_dataset.hpp"

#include <cmath>
#include <string>

#include "hpct/core/error.hpp"

namespace hpct::io {

namespace {
std::vector<double> normalised(const std::vector<double>& w) {
  double sum = 0;
  for (double x : w) {
    if (!(x > 0 && std::isfinite(x))) throw Error("blend weights must be positive, got " + std::to_string(x));
    sum += x;
  }
  std::vector<double> out(w);
  for (double& x : out) x /= sum;
  return out;
}
}  // namespace

std::vector<size_t> BlendedDataset::samples_needed(const std::vector<double>& weights, size_t size) {
  std::vector<size_t> out;
  for (double w : normalised(weights)) out.push_back((size_t)std::ceil(w * double(size) * 1.005));
  return out;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const TokenDataset>> parts, std::vector<double> weights, size_t size)
    : parts_(std::move(parts)), weights_(normalised(weights)) {
  if (parts_.empty() || parts_.size() != weights_.size() || parts_.size() > 65535)
    throw Error("a blend needs one weight per dataset (1 to 65535 of them), got " + std::to_string(parts_.size()) +
                " datasets and " + std::to_string(weights_.size()) + " weights");
  const std::vector<size_t> need = samples_needed(weights, size);  // from the weights as given, as callers size the parts
  for (size_t k = 0; k < parts_.size(); ++k) {
    if (parts_[k]->seq_length() != parts_[0]->seq_length()) throw Error("blended datasets differ in sequence length");
    if (parts_[k]->size() < need[k])
      throw Error("blended dataset " + std::to_string(k) + " holds " + std::to_string(parts_[k]->size()) + " samples, the blend needs " +
                  std::to_string(need[k]));
  }
  dataset_.resize(size);
  sample_.resize(size);
  counts_.assign(parts_.size(), 0);
  for (size_t i = 0; i < size; ++i) {
    const double at = std::max<double>(double(i), 1.0);
    size_t best = 0;
    double best_error = weights_[0] * at - double(counts_[0]);
    for (size_t k = 1; k < parts_.size(); ++k) {
      const double e = weights_[k] * at - double(counts_[k]);
      if (e > best_error) {
        best_error = e;
        best = k;
      }
    }
    dataset_[i] = static_cast<uint16_t>(best);
    sample_[i] = static_cast<int64_t>(counts_[best]++);
  }
}

}  // namespace hpct::io
