// hpct/engine/checkpoint/hf_gpt2.hpp — GPT-2 weights in Hugging Face's layout, read into (and described from)
// this project's parameter table. One loader for every app: hpct_ckpt import, generate --load-hf.
//
// What it reads: a directory as save_pretrained writes it (model.safetensors and config.json, with
// the tokenizer's files when it was saved too: directory_tokenizer), or a bare .safetensors file (then
// the shapes come from the tensors and the heads from `heads`, or hidden/64). Names are GPT-2's
// (wte.weight, h.0.attn.c_attn.weight, ...), with or without the "transformer." prefix that
// GPT2LMHeadModel's files carry; linear weights in GPT-2's Conv1D layout (in, out), transposed into
// ours; F32, F16 and BF16 (widened exactly). The attention mask buffers of hub files (h.N.attn.bias,
// h.N.attn.masked_bias) are ignored by name; lm_head.weight, where present, must be the tied
// embedding; any other tensor is an error naming it, as is a config.json that disagrees with the
// tensors or describes another architecture (activation, layer-norm epsilon). A directory whose
// config.json says model_type "llama" is read by read_hf_llama instead (hf_llama.hpp), so every
// app's --load-hf takes Llama weights too.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/io/tokenizer.hpp"
#include "hpct/model/gpt.hpp"

namespace hpct::engine {

/// Our tensor name, GPT-2's, and whether GPT-2 stores it transposed (Conv1D: (in, out)).
struct Gpt2Name {
  std::string ours, theirs;
  bool transpose;
};
std::vector<Gpt2Name> gpt2_names(int layers);
/// A (rows, cols) row-major matrix as (cols, rows): between our (out, in) and Conv1D's (in, out).
std::vector<float> transposed(const std::vector<float>& x, int64_t rows, int64_t cols);

struct HfGpt2 {
  model::GptConfig cfg;       // vocab_size: GPT-2's own (the table is padded to vocab_multiple)
  std::vector<float> params;  // Gpt::layout_for(cfg) order; the padding rows zero
  std::string file;           // the safetensors file read
  std::optional<io::TokenizerSpec> tokenizer;  // the directory's own tokenizer, where it holds one
};

/// The tokenizer a Hugging Face directory holds: vocab.json + merges.txt (GPT2BPETokenizer), else
/// tokenizer.model (Llama2Tokenizer: a SentencePiece model, <s> before each text, as Hugging Face's
/// LlamaTokenizer), else tokenizer.json (HFTokenizer); none for a file or a folder without them.
std::optional<io::TokenizerSpec> directory_tokenizer(const std::string& path);

/// Reads `path` (a directory or a .safetensors file, see above). vocab_multiple pads the vocabulary
/// as --make-vocab-size-divisible-by; heads > 0 overrides config.json's n_head. Throws hpct::Error
/// naming the file and the tensor or key.
HfGpt2 read_hf_gpt2(const std::string& path, int vocab_multiple = 128, int heads = 0);

/// config.json for a GPT-2 of this shape with `vocab` tokens: the keys GPT2Config reads.
nlohmann::json hf_gpt2_config(const model::GptConfig& cfg, int vocab);

}  // namespace hpct::engine
