// hpct/io/tokenizer.hpp — text to token ids and back, as every app needs it, whichever of Megatron's
// --tokenizer-type a run names.
//
// It is: the interface the data readers, preprocess_data, finetune and generate use, the flags that
// choose an implementation (TokenizerSpec: --tokenizer-type, --vocab-file, --merge-file,
// --tokenizer-model) and the one function that opens it. Implementations: GPT-2's byte-level BPE
// from vocab.json + merges.txt or from a Hugging Face tokenizer.json (gpt2_tokenizer.hpp), and
// SentencePiece models through Debian's libsentencepiece (sentencepiece_tokenizer.hpp).
// It is not: a registry of every Megatron tokenizer. BERT's WordPiece, tiktoken and NullTokenizer are
// refused by name.
// Megatron's tokenize() is split in two here: encode() gives the text's own ids, and
// document_prefix() the ids Megatron's tokenizer puts before every text it tokenizes
// (Llama2Tokenizer's <s>, a Hugging Face template's <|begin_of_text|>). A document, a prompt or
// an example's prompt starts with the prefix; a response appended to a prompt does not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hpct::io {

/// Immutable once opened; every const member may be called from many threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// The text's ids, appended to out (no prefix, no end-of-document).
  virtual void encode_append(std::string_view text, std::vector<int32_t>& out) const = 0;
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 4 + 1);
    encode_append(text, out);
    return out;
  }
  /// Text of the ids. Throws hpct::Error naming an id outside the vocabulary.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  /// The end-of-document id Megatron's tokenizer of this type gives (GPT-2: <|endoftext|>;
  /// SentencePiece GPT and Llama-2 types: the model's </s>; SentencePieceTokenizer: <EOD>).
  virtual int32_t eod() const = 0;
  /// Ids before each text (may be empty), as Megatron's tokenize() adds them.
  virtual const std::vector<int32_t>& document_prefix() const = 0;
  /// Megatron's vocab_size: the ids the model needs (before --make-vocab-size-divisible-by).
  virtual size_t vocab_size() const = 0;
  /// The type and file, for start lines ("GPTSentencePieceTokenizer /data/tokenizer.model").
  virtual std::string describe() const = 0;
};

/// Megatron's tokenizer flags.
struct TokenizerSpec {
  std::string type = "GPT2BPETokenizer";  // --tokenizer-type
  std::string vocab_file, merge_file;      // --vocab-file, --merge-file (GPT2BPETokenizer)
  std::string model;                       // --tokenizer-model (SentencePiece file; tokenizer.json or its folder)
};

/// The --tokenizer-type values implemented, in the order --help lists them.
const std::vector<std::string>& tokenizer_types();

/// Throws hpct::ConfigError naming the flag when the type is unknown or not implemented, or a file
/// it needs is not given ("--tokenizer-model"). Reads no file.
void check_tokenizer_spec(const TokenizerSpec& spec);

/// The files the spec reads, as (role, path): ("vocab", ...), ("merges", ...) for GPT2BPETokenizer,
/// ("model", ...) for the SentencePiece types, ("tokenizer", tokenizer.json) for HFTokenizer. The
/// roles are the ones checkpoint identities fingerprint.
std::vector<std::pair<std::string, std::string>> tokenizer_files(const TokenizerSpec& spec);

/// Opens the tokenizer (check_tokenizer_spec first). Throws hpct::Error naming the file for a file
/// that is missing, too large or not what the type reads.
std::shared_ptr<const Tokenizer> open_tokenizer(const TokenizerSpec& spec);

/// The largest tokenizer file read (GPT-2's vocab is 1 MiB, Llama 3's tokenizer.json 9 MiB, a
/// SentencePiece model under 5 MiB): a path that names something larger is refused before reading.
constexpr uint64_t kMaxTokenizerFileBytes = uint64_t(256) << 20;

}  // namespace hpct::io
