// hpct/io/gpt_dataset.hpp — the samples a GPT trainer reads: Megatron's GPTDataset over an indexed
// dataset (documents shuffled per epoch, samples of seq_length+1 tokens that run across document
// boundaries, then a shuffle of the samples), Megatron's --split parsing, and --mock-data.
//
// Not here: blending several datasets, the .npy index caches Megatron writes next to the data,
// and batching (the trainer picks sample indices). The index is rebuilt in memory on every start
// instead of cached: O(samples) work and memory per rank, but no cache files to go stale or race on
// a shared file system. Every shuffle uses std::mt19937_64 and our own Fisher-Yates, so the same
// seed gives the same samples on every platform, in every process, and after a restart.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hpct/io/indexed_dataset.hpp"

namespace hpct::io {

/// What a trainer reads: sample i is seq_length()+1 tokens; tokens are x[:-1], labels x[1:].
class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  virtual size_t size() const = 0;
  virtual size_t seq_length() const = 0;
  /// Writes seq_length()+1 tokens to out. Const and thread-safe; a function of i alone.
  virtual void get(size_t i, int32_t* out) const = 0;
  /// True for datasets whose samples say which targets count in the loss (prompt/response data:
  /// the response's); the rest train on every next token.
  virtual bool has_loss_mask() const { return false; }
  /// Writes seq_length() flags to out: 1 where target t (token t+1 of get()) counts. Called only
  /// where has_loss_mask(); const, thread-safe, a function of i alone.
  virtual void get_loss_mask(size_t i, uint8_t* out) const {
    (void)i;
    (void)out;
  }
};

/// Megatron's --eod-mask-loss over another dataset: the same samples, and a loss mask that also
/// drops every target whose input token is end-of-document (the prediction of the next document's
/// first token), on top of the inner dataset's own mask if it has one.
class EodMaskedDataset : public TokenDataset {
 public:
  EodMaskedDataset(std::shared_ptr<const TokenDataset> inner, int32_t eod) : inner_(std::move(inner)), eod_(eod) {}
  size_t size() const override { return inner_->size(); }
  size_t seq_length() const override { return inner_->seq_length(); }
  void get(size_t i, int32_t* out) const override { inner_->get(i, out); }
  bool has_loss_mask() const override { return true; }
  void get_loss_mask(size_t i, uint8_t* out) const override;

 private:
  std::shared_ptr<const TokenDataset> inner_;
  int32_t eod_;
};

/// Megatron's get_train_valid_test_split_: "949,50,1" or "98/2/0" (one or two weights are padded
/// with zeros) normalised to fractions, each boundary rounded half-to-even as Python's round() does,
/// and the rounding error taken off every boundary so the last one is num_docs. Returns the
/// [begin, end) document ranges of train, valid and test. Bad strings throw config_error("--split").
std::array<std::pair<size_t, size_t>, 3> split_document_ranges(const std::string& split, size_t num_docs);

/// Megatron's GPTDataset over documents [begin, end) of an indexed dataset.
///
/// Documents are repeated for as many epochs as num_samples needs; each epoch is shuffled on its
/// own (Megatron shuffles all but the last epoch together, so a document could come twice before
/// another came once; here each epoch is a permutation, which also makes Megatron's separate last
/// epoch unnecessary). Sample k spans seq_length+1 tokens from the concatenation of that document
/// order, starting where sample k-1 ended, so neighbours share one token, as in Megatron. A final
/// seeded permutation (shuffle_idx) maps i to k.
class GptDataset : public TokenDataset {
 public:
  /// Throws hpct::Error for an empty or out-of-range document range, seq_length 0, or a range with
  /// fewer than seq_length+1 tokens.
  GptDataset(std::shared_ptr<const IndexedDataset> data, std::pair<size_t, size_t> documents, size_t num_samples,
             size_t seq_length, uint64_t seed);

  /// All samples of the epochs built: at least num_samples, as Megatron's len().
  size_t size() const override { return shuffle_idx_.size(); }
  size_t seq_length() const override { return seq_length_; }
  void get(size_t i, int32_t* out) const override;

  /// Sample k in corpus order, before shuffle_idx (for tests and tools).
  void get_ordered(size_t k, int32_t* out) const;
  /// Tokens of sample i's first document piece (its tokens up to where that document ends, at most
  /// seq_length + 1): the data analyzer's seqlen metric.
  size_t first_document_tokens(size_t i) const;
  size_t num_epochs() const { return num_epochs_; }
  uint64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  std::pair<size_t, size_t> documents() const { return documents_; }
  const IndexedDataset& indexed() const { return *data_; }

 private:
  struct SamplePos {
    int64_t doc_pos;  // index into doc_order_
    int64_t offset;   // token offset inside that document
  };
  void read_document(size_t doc, size_t offset, size_t length, int32_t* out) const;

  std::shared_ptr<const IndexedDataset> data_;
  std::pair<size_t, size_t> documents_;
  size_t seq_length_;
  size_t num_epochs_ = 0;
  uint64_t tokens_per_epoch_ = 0;
  std::vector<int64_t> doc_tokens_;     // tokens of each document of the range, indexed doc - begin
  std::vector<int64_t> doc_order_;      // (epochs * docs) document ids, each epoch a permutation
  std::vector<SamplePos> sample_idx_;   // (samples + 1) where each sample starts; the next entry ends it
  std::vector<int64_t> shuffle_idx_;    // (samples) a permutation of sample ids
};

/// Megatron's --mock-data: synthetic samples that are a function of (seed, i) only, with structure a
/// model can learn. Each token follows the one before through a fixed random successor table drawn
/// from the seed, except that with probability 1/8 it is drawn uniformly instead; a model that
/// learns the table reaches a loss near 0.125 * ln(V) + 0.38 nats, far below ln(V).
class MockGptDataset : public TokenDataset {
 public:
  MockGptDataset(size_t vocab_size, size_t seq_length, uint64_t seed);
  size_t size() const override { return SIZE_MAX; }
  size_t seq_length() const override { return seq_length_; }
  void get(size_t i, int32_t* out) const override;
  size_t vocab_size() const { return successor_.size(); }

 private:
  size_t seq_length_;
  uint64_t seed_;
  std::vector<int32_t> successor_;  // (V) the likely next token after each token
};

}  // namespace hpct::io
