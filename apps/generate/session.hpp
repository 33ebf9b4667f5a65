// generate's model and tokenizer, loaded once, and the text around model::Generator: prompts into
// ids, generated ids into the text a reader sees, stop strings. The command line, the interactive
// mode and the HTTP server (server.hpp) all go through one Session.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hpct/io/tokenizer.hpp"
#include "hpct/model/generation.hpp"

namespace hpct::generate {

// The checkpoint's GPT (dense or MoE): its config (vocabulary padded), real vocabulary, tokenizer
// identity and the run's tokenizer files, and every parameter in layout order.
struct Loaded {
  model::GptConfig cfg;
  int vocab = 0;
  std::string file, tokenizer;
  std::optional<io::TokenizerSpec> spec;  // the run's tokenizer, where known
  std::vector<float> params;
};

/// --load PATH: a checkpoint file or a --save directory.
Loaded load_checkpoint(const std::string& path);
/// --load-hf PATH: GPT-2 or Llama weights in Hugging Face's layout.
Loaded load_hf(const std::string& path);

/// The tokenizer flags given on the command line (each replaces the stored one).
struct TokenizerFlags {
  std::string type, model, vocab, merges;
};

class Session {
 public:
  /// need_text: prompts are text (the tokenizer must be known; throws config_error naming --prompt
  /// otherwise). slots: the most samples decoded together.
  Session(Loaded m, const TokenizerFlags& flags, bool need_text, int slots);

  const Loaded& model() const { return m_; }
  model::Generator& generator() { return gen_; }
  bool has_tokenizer() const { return tok_ != nullptr; }
  int32_t eod() const { return tok_ ? tok_->eod() : -1; }

  /// A text prompt as ids: the tokenizer's document prefix (Llama2Tokenizer's <s>) and the text.
  std::vector<int32_t> encode(const std::string& text) const;
  /// Comma-separated ids (--prompt-ids), each checked against the vocabulary.
  std::vector<int32_t> parse_ids(const std::string& csv, const std::string& flag) const;
  /// Throws config_error naming flag for an empty prompt, one without room to generate, or an id
  /// beyond the vocabulary; index names the prompt.
  void check_prompt(const std::vector<int32_t>& ids, size_t index, const std::string& flag) const;
  /// The prompt's text, and the generated ids as the whole text shows them (an end-of-document id
  /// dropped; SentencePiece drops a leading space from a text's first piece, so the continuation is
  /// decoded after the prompt's ids, not alone). Empty strings without a tokenizer.
  std::string prompt_text(const model::Sample& s) const;
  std::string continuation(const model::Sample& s) const;
  /// A stop check for the generator: true once the continuation contains one of stops (empty: none).
  model::StopCheck stop_check(const std::vector<std::string>& stops) const;

 private:
  Loaded m_;
  std::shared_ptr<const io::Tokenizer> tok_;
  model::Generator gen_;
};

}  // namespace hpct::generate
