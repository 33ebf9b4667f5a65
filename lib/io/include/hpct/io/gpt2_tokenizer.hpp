// hpct/io/gpt2_tokenizer.hpp — GPT-2's byte-level BPE tokenizer (Megatron's GPT2BPETokenizer), and
// the same algorithm read from a Hugging Face tokenizer.json (Megatron's HFTokenizer: GPT-2, Llama 3).
//
// It is: OpenAI's gpt-2 encoder.py in C++, reading the two files Megatron takes as --vocab-file
// (vocab.json / encoder.json) and --merge-file (merges.txt / vocab.bpe) and giving the same ids.
// From vocab.json + merges.txt there is no special-token parsing ("<|endoftext|>" inside the text is
// encoded as ordinary characters, as GPT-2 and Megatron do; append eod() yourself).
// From tokenizer.json it follows the Hugging Face `tokenizers` library for what byte-level BPE files
// use: the added tokens are split out of the text first, the pre-tokenizer is ByteLevel's GPT-2
// regex or a Split regex before a regex-less ByteLevel (Llama 3), `ignore_merges` takes a whole
// piece that is in the vocab as one id, and a TemplateProcessing post-processor's tokens before the
// text are the document prefix. Anything else in the file that changes the ids (a normalizer,
// byte_fallback, Metaspace, a suffix template, ...) is refused by name.
// It is not: a general tokenizer library (no normalisation, no WordPiece or Unigram models).
// Trade-off: merges are looked up on token-id pairs in a flat table, not on string pairs as the
// reference does. That is equivalent for any merges file whose symbols are all in the vocab (checked
// when loading), and it means encoding never hashes a string except in the per-call piece cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hpct/io/tokenizer.hpp"

namespace hpct::io {

namespace detail {
struct Gpt2TokenizerTables;
}

/// Immutable after from_files(). Every const member is safe to call concurrently from many threads
/// on one tokenizer (or on copies of it, which share the tables): the BPE cache and the regex match
/// state live inside each call, so nothing is shared that is written.
class Gpt2Tokenizer final : public Tokenizer {
 public:
  /// Loads Megatron's --vocab-file (JSON object {"token": id}) and --merge-file (an optional
  /// "#version" line, then one merge "a b" per line, highest priority first). Throws hpct::Error
  /// naming the file for a missing/unreadable file, invalid JSON, a malformed merges line, or a
  /// merge whose symbols are not in the vocab.
  static Gpt2Tokenizer from_files(const std::string& vocab_path, const std::string& merges_path);
  /// The largest vocab or merges file read (GPT-2's are 1 MiB and 456 KiB): a path that names
  /// something larger is refused before it is read.
  static constexpr uint64_t kMaxFileBytes = kMaxTokenizerFileBytes;
  /// Loads a Hugging Face tokenizer.json whose model is byte-level BPE (see the file comment);
  /// `config_path` (tokenizer_config.json beside it, may be "" or absent) names the eos token, else
  /// "<|endoftext|>", "<|end_of_text|>" or "</s>" among the added tokens is. Throws hpct::Error
  /// naming the file and the key for what it cannot follow.
  static Gpt2Tokenizer from_hf_json(const std::string& tokenizer_json, const std::string& config_path);

  /// UTF-8 in, token ids out. Bytes that are not valid UTF-8 are not an error: each run of them is
  /// encoded as its own piece, byte by byte, so decode(encode(s)) == s for every byte string.
  using Tokenizer::encode;
  /// As encode(), appending to out (lets a caller build one document's ids without a copy).
  void encode_append(std::string_view text, std::vector<int32_t>& out) const override;

  /// The exact bytes the ids stand for; no UTF-8 repair (a cut through a multi-byte character
  /// stays cut). Throws hpct::Error naming the id for one that is not in the vocab.
  std::string decode(const std::vector<int32_t>& ids) const override;

  /// Id of "<|endoftext|>" (50256 for GPT-2), or tokenizer.json's eos; throws hpct::Error if none.
  int32_t eod() const override;
  /// Empty for vocab.json + merges.txt; tokenizer.json's template prefix.
  const std::vector<int32_t>& document_prefix() const override;
  /// Number of entries in the vocab file (50257 for GPT-2); tokenizer.json: its largest id + 1.
  size_t vocab_size() const override;
  std::string describe() const override;

 private:
  static Gpt2Tokenizer from_hf_json_checked(const std::string& tokenizer_json, const std::string& config_path);
  explicit Gpt2Tokenizer(std::shared_ptr<const detail::Gpt2TokenizerTables> tables);
  std::shared_ptr<const detail::Gpt2TokenizerTables> tables_;  // shared read-only by copies
};

}  // namespace hpct::io
