// hpct/io/sentencepiece_tokenizer.hpp — SentencePiece models (Llama 1/2, Mistral, T5 ...) through
// Debian's libsentencepiece, as Megatron's three SentencePiece tokenizer types use them.
//
// It is: the model file's own ids (the library's Encode, as `spm_encode --output_format=id`), with
// Megatron's conventions per type:
//   GPTSentencePieceTokenizer  eod = the model's eos (</s>); nothing before a text;
//   Llama2Tokenizer            as above, and the model's bos (<s>) before every text;
//   SentencePieceTokenizer     <CLS> <SEP> <EOD> <MASK> and the pad/bos/eos pieces (<PAD> <BOS> <EOS>
//                              where the model has none) are special tokens, added after the model's
//                              pieces where it lacks them and split out of the text; eod = <EOD>.
// It is not: a trainer (spm_train is), nor sampling/n-best encoding.
#pragma once

#include <memory>
#include <string>

#include "hpct/io/tokenizer.hpp"

namespace hpct::io {

/// Opens `model_path` for the Megatron --tokenizer-type `type` (one of the three above). Throws
/// hpct::Error naming the file for one that is missing, too large or not a SentencePiece model.
std::shared_ptr<const Tokenizer> open_sentencepiece(const std::string& type, const std::string& model_path);

}  // namespace hpct::io
