// hpct/engine/data/data.hpp — builds the train/valid datasets a run asks for (Megatron's
// build_train_valid_test_datasets): mock tokens, or an indexed dataset split by documents.
#pragma once
#include <memory>

#include "hpct/engine/config/train_config.hpp"
#include "hpct/io/gpt_dataset.hpp"

namespace hpct::engine {

struct TrainData {
  std::shared_ptr<io::TokenDataset> train;
  std::shared_ptr<io::TokenDataset> valid;  // null when the split gives no validation documents
  double unigram_ppl = 0;                   // unigram-model perplexity of the validation split (real data)
};

/// Every rank calls it alike. Sets cfg.model.vocab_size from the tokenizer for real data.
/// cfg must have micro/global batch, train_iters and eval settings given (not yet finalized).
TrainData build_train_data(TrainConfig& cfg, int dp, bool verbose);

/// Perplexity of an add-one-smoothed unigram model fitted on train's tokens, measured on valid's.
double unigram_perplexity(const io::IndexedDataset& ds, std::pair<size_t, size_t> train_docs,
                          std::pair<size_t, size_t> valid_docs, size_t vocab_size);

}  // namespace hpct::engine
