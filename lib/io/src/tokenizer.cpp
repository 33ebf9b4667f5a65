// Megatron's --tokenizer-type to an implementation (tokenizer.hpp).
#include "hpct/io/tokenizer.hpp"

#include <algorithm>
#include <filesystem>

#include "hpct/core/error.hpp"
#include "hpct/io/gpt2_tokenizer.hpp"
#include "hpct/io/sentencepiece_tokenizer.hpp"

namespace hpct::io {
namespace {

bool is_sentencepiece(const std::string& t) {
  return t == "GPTSentencePieceTokenizer" || t == "Llama2Tokenizer" || t == "SentencePieceTokenizer";
}
bool is_hf(const std::string& t) { return t == "HFTokenizer" || t == "HuggingFaceTokenizer"; }

// tokenizer.json itself, or the one in the folder --tokenizer-model names.
std::string hf_json(const std::string& model) {
  std::error_code ec;
  return std::filesystem::is_directory(model, ec) ? (std::filesystem::path(model) / "tokenizer.json").string() : model;
}

}  // namespace

const std::vector<std::string>& tokenizer_types() {
  static const std::vector<std::string> types = {"GPT2BPETokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer",
                                                 "SentencePieceTokenizer", "HFTokenizer", "HuggingFaceTokenizer"};
  return types;
}

void check_tokenizer_spec(const TokenizerSpec& s) {
  const auto& known = tokenizer_types();
  if (std::find(known.begin(), known.end(), s.type) == known.end()) {
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    static const char* megatron[] = {"BertWordPieceLowerCase", "BertWordPieceCase", "NullTokenizer", "TikTokenizer", "MultimodalTokenizer"};
    const bool theirs = std::find(std::begin(megatron), std::end(megatron), s.type) != std::end(megatron);
    throw config_error("--tokenizer-type", "--tokenizer-type '" + s.type + (theirs ? "' is a Megatron tokenizer not implemented here" : "' is unknown"),
                       "use one of " + list);
  }
  if (s.type == "GPT2BPETokenizer") {
    if (s.vocab_file.empty()) throw config_error("--vocab-file", "GPT2BPETokenizer needs --vocab-file (GPT-2's vocab.json)");
    if (s.merge_file.empty()) throw config_error("--merge-file", "GPT2BPETokenizer needs --merge-file (GPT-2's merges.txt)");
    if (!s.model.empty())
      throw config_error("--tokenizer-model", "--tokenizer-model is not read by GPT2BPETokenizer",
                         "give --tokenizer-type GPTSentencePieceTokenizer (or HFTokenizer) with it");
    return;
  }
  if (s.model.empty())
    throw config_error("--tokenizer-model", s.type + " needs --tokenizer-model (" +
                                                (is_hf(s.type) ? "a tokenizer.json or its folder" : "a SentencePiece .model file") + ")");
}

std::vector<std::pair<std::string, std::string>> tokenizer_files(const TokenizerSpec& s) {
  if (s.type == "GPT2BPETokenizer") return {{"vocab", s.vocab_file}, {"merges", s.merge_file}};
  if (is_hf(s.type)) return {{"tokenizer", hf_json(s.model)}};
  return {{"model", s.model}};
}

std::shared_ptr<const Tokenizer> open_tokenizer(const TokenizerSpec& s) {
  check_tokenizer_spec(s);
  if (s.type == "GPT2BPETokenizer") return std::make_shared<Gpt2Tokenizer>(Gpt2Tokenizer::from_files(s.vocab_file, s.merge_file));
  if (is_sentencepiece(s.type)) return open_sentencepiece(s.type, s.model);
  const std::string json = hf_json(s.model);
  const std::string config = (std::filesystem::path(json).parent_path() / "tokenizer_config.json").string();
  return std::make_shared<Gpt2Tokenizer>(Gpt2Tokenizer::from_hf_json(json, config));
}

}  // namespace hpct::io
