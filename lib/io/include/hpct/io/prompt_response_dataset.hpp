// hpct/io/prompt_response_dataset.hpp — supervised finetuning data: JSON lines with a prompt and a
// response, one example per sample, the loss on the response only.
//
// Each line is an object with string fields `prompt_key` and `response_key` (other fields are
// ignored). An example is tokenized as the tokenizer's document prefix (Llama2Tokenizer's <s>),
// prompt ids, response ids, end-of-document; a sample is its
// first seq_length+1 tokens, padded with end-of-document. Its loss mask counts the targets that
// are response tokens or the closing end-of-document (so the model learns to stop), never the
// prompt's or the padding's. Examples longer than a sample are cut at its end (counted in
// truncated()). The examples [begin, end) of the file (a split) are served in one seeded shuffled
// order, repeated for further epochs (sample i is example order[i % size()]).
// Packing (pack = true): the shuffled examples fill samples greedily in that order, each sample
// taking the next examples while they fit whole in seq_length+1 tokens (a longer one alone, cut),
// padded with end-of-document; each example's mask as above. Every example ends with the
// end-of-document token, so a model with per-document attention and positions
// (GptConfig::reset_attention_mask / reset_position_ids) sees each example as if alone. (A prompt
// or response whose text the tokenizer encodes to the end-of-document id would split there.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hpct/io/tokenizer.hpp"
#include "hpct/io/gpt_dataset.hpp"

namespace hpct::io {

struct PromptResponseExample {
  std::vector<int32_t> ids;  // prompt, response, end-of-document
  int prompt = 0;            // tokens of the prompt
};

/// Every example of a JSON-lines file; throws hpct::Error naming the file, the line and the key for
/// a line that is not an object with both string fields.
std::vector<PromptResponseExample> read_prompt_response(const std::string& path, const Tokenizer& tok,
                                                        const std::string& prompt_key, const std::string& response_key);

class PromptResponseDataset : public TokenDataset {
 public:
  /// Examples [begin, end) of `all` (must be non-empty), shuffled by `seed`; packed when pack.
  PromptResponseDataset(std::vector<PromptResponseExample> all, size_t begin, size_t end, size_t seq_length,
                        int32_t eod, uint64_t seed, bool pack = false);
  size_t size() const override { return first_.size() - 1; }
  size_t seq_length() const override { return T_; }
  void get(size_t i, int32_t* out) const override;
  bool has_loss_mask() const override { return true; }
  void get_loss_mask(size_t i, uint8_t* out) const override;
  /// Examples longer than seq_length+1 tokens (their end is cut).
  size_t truncated() const { return truncated_; }
  /// Examples served (each once per epoch of size() samples).
  size_t examples() const { return ex_.size(); }
  /// Loss-counted targets in one epoch of samples (the response tokens and end-of-document that
  /// fit), and the examples that keep none (a prompt that fills the sample, an empty prompt and
  /// response): they train nothing.
  size_t target_tokens() const { return targets_; }
  size_t examples_without_targets() const { return empty_; }
  /// The fraction of the samples' seq_length+1 tokens that hold example tokens (not padding).
  double fill() const;

 private:
  std::vector<PromptResponseExample> ex_;
  std::vector<size_t> order_;   // the shuffled examples
  std::vector<size_t> first_;   // sample s holds order_[first_[s] .. first_[s+1])
  size_t T_;
  int32_t eod_;
  size_t truncated_ = 0;
  size_t targets_ = 0, empty_ = 0;
};

}  // namespace hpct::io
