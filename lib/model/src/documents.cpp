// Documents packed in a sample (gpt.hpp's reset_attention_mask / reset_position_ids): where each
// token's document starts and its position in it, as Megatron's get_ltor_masks_and_position_ids
// derives them from the end-of-document tokens of the input.
//
// A document ends at (and includes) an eod_token: the token after it starts the next document at
// position 0 and sees no key before it. The attention kernels take each query's first key
// (key_start, ops.hpp); their saved probabilities are zero outside it, so the backward needs no
// mask. Both arrays depend on the sample's tokens only: the same on every rank and layout.
#include <algorithm>

#include "gpt_acts.hpp"

namespace hpct::model {

void Gpt::stage_documents(const int32_t* tokens, int B, int T) {
  key_start_ = positions_ = nullptr;
  if (!cfg_.reset_attention_mask && !cfg_.reset_position_ids) return;
  const size_t N = (size_t)B * T;
  doc_start_.resize(N);
  doc_pos_.resize(N);
  for (int b = 0; b < B; ++b) {
    int start = 0;
    for (int t = 0; t < T; ++t) {
      const size_t i = (size_t)b * T + t;
      doc_start_[i] = start;
      doc_pos_[i] = t - start;
      if (tokens[i] == cfg_.eod_token) start = t + 1;
    }
  }
  Workspace& w = *ws_;
  const bool host = ops_->host_memory();
  if (cfg_.reset_attention_mask) {
    if (!host) ops_->copy_from_host(w.key_start.as<void>(), doc_start_.data(), N * sizeof(int32_t));
    key_start_ = host ? doc_start_.data() : w.key_start.as<int32_t>();
  }
  if (cfg_.reset_position_ids) {
    if (!host) ops_->copy_from_host(w.positions.as<void>(), doc_pos_.data(), N * sizeof(int32_t));
    positions_ = host ? doc_pos_.data() : w.positions.as<int32_t>();
  }
}

const int32_t* Gpt::kept_key_start(int l, int B, int T) {
  if (!key_start_) return nullptr;
  const size_t k = (size_t)ltd_kept_;
  const int32_t* idx = ltd_idx_[l].data();  // (B, k) sorted positions per sample
  ltd_start_.resize((size_t)B * k);
  for (int b = 0; b < B; ++b) {
    const int32_t* row = idx + (size_t)b * k;
    for (size_t j = 0; j < k; ++j) {
      // the first kept position at or after this token's document start (at most j itself)
      const int32_t start = doc_start_[(size_t)b * T + row[j]];
      ltd_start_[(size_t)b * k + j] = (int32_t)(std::lower_bound(row, row + k, start) - row);
    }
  }
  if (ops_->host_memory()) return ltd_start_.data();
  ops_->copy_from_host(ws_->ltd_start.as<void>(), ltd_start_.data(), ltd_start_.size() * sizeof(int32_t));
  return ws_->ltd_start.as<int32_t>();
}

}  // namespace hpct::model
