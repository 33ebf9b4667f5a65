// The trainer's data side: a micro-batch's tokens and targets from a dataset, the targets a
// step's loss averages over, and the validation loss.
#include <cmath>
#include <cstring>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/engine/loop/trainer.hpp"

namespace hpct::engine {

void Trainer::load_micro_batch(const io::TokenDataset& data, long long first_sample, int T, const int64_t* ids) {
  const int V = cfg_.model.vocab_size;
  for (int j = 0; j < cfg_.micro_batch; ++j) {
    const size_t sample = ids ? (size_t)ids[j] : (size_t)(first_sample + j) % data.size();
    data.get(sample, sample_buf_.data());  // (T+1) tokens
    // The dataset reader bounds structure only: an id from another tokenizer (or a corrupt .bin)
    // would index past the embedding table.
    for (int t = 0; t <= cfg_.model.max_seq_length; ++t)  // the whole sample: its bytes are checked alike at every length
      if (sample_buf_[t] < 0 || sample_buf_[t] >= V) {
        std::string files;
        for (const auto* v : {&cfg_.data_path, &cfg_.train_data_path, &cfg_.valid_data_path})
          for (const auto& p : *v) files += (files.empty() ? "" : ", ") + p + ".bin";
        throw file_error(files.empty() ? "--mock-data" : files,
                         "sample " + std::to_string(sample) + " holds token id " + std::to_string(sample_buf_[t]) +
                             " at position " + std::to_string(t) + ", outside the vocabulary [0, " + std::to_string(V) + ")",
                         "the dataset was written with another tokenizer or is corrupt: run preprocess_data again with "
                         "this run's --vocab-file and --merge-file");
      }
    std::memcpy(&tokens_[(size_t)j * T], sample_buf_.data(), T * sizeof(int32_t));
    std::memcpy(&targets_[(size_t)j * T], sample_buf_.data() + 1, T * sizeof(int32_t));
    if (data.has_loss_mask()) {  // prompt/response data: only the targets it marks count
      data.get_loss_mask(sample, mask_buf_.data());
      for (int t = 0; t < T; ++t)
        if (!mask_buf_[t]) targets_[(size_t)j * T + t] = -1;
    }
  }
}

long long Trainer::counted_targets(const io::TokenDataset& data, long long iteration, int T, const int64_t* batch_ids) {
  const long long GB = batches_.batch_of(iteration), base = first_sample(iteration);
  if (!data.has_loss_mask()) return GB * T;  // every target counts: no pass over the data
  const int mb = cfg_.micro_batch, dp = grid_.dp().size(), r = grid_.dp().rank();
  double n = 0;
  for (int m = 0; m < batches_.micro_steps(iteration); ++m) {  // the samples step() loads, in its order
    const long long first = base + ((long long)m * dp + r) * mb;
    for (int j = 0; j < mb; ++j) {
      const size_t sample = batch_ids ? (size_t)batch_ids[first - base + j]
                                      : (size_t)(first + j) % data.size();
      data.get_loss_mask(sample, mask_buf_.data());
      for (int t = 0; t < T; ++t) n += mask_buf_[t] != 0;
    }
  }
  grid_.dp().allreduce_sum(&n, 1);
  // A batch whose every target is masked has no loss to average: 1 keeps the step finite (zero
  // gradient) instead of dividing by zero.
  return n > 0 ? static_cast<long long>(n) : 1;
}

double Trainer::evaluate(const io::TokenDataset& data) {
  join_update();  // evaluates the weights the last step made
  const int T = cfg_.model.max_seq_length, mb = cfg_.micro_batch, dp = grid_.dp().size(), r = grid_.dp().rank();
  const long long GB = cfg_.global_batch;
  model::ParamStore& store = this->store();  // forward only: parameters gathered as in training
  double sums[2] = {0, 0};  // loss sum, token count
  for (int e = 0; e < cfg_.eval_iters; ++e) {
    for (int m = 0; m < cfg_.grad_accum; ++m) {
      const long long first = e * GB + ((long long)m * dp + r) * mb;
      load_micro_batch(data, first, T);  // evaluation always at the full length
      model_->set_routing_seed(mix_seed(cfg_.seed, static_cast<uint64_t>(first), 0x6576616c));
      sums[0] += model_->forward_loss(store, tokens_.data(), targets_.data(), mb, T);
      for (int i = 0; i < mb * T; ++i) sums[1] += targets_[i] >= 0;
    }
  }
  grid_.dp().allreduce_sum(sums, 2);
  return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

}  // namespace hpct::engine
