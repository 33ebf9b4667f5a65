// hpct/engine/checkpoint/hf_llama.hpp — Llama weights in Hugging Face's layout (LlamaForCausalLM), read into
// this project's parameter table: the model options (RMSNorm, SwiGLU, rotary positions, grouped
// key/value heads, no biases, an untied head) describe it exactly.
//
// What it reads: a save_pretrained directory, config.json and model.safetensors, or several shards
// named by model.safetensors.index.json's weight_map; F32, F16 and BF16 tensors (widened exactly).
// Names are Hugging Face's (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...,
// lm_head.weight); q_proj, k_proj and v_proj become the rows of query_key_value in that order,
// gate_proj and up_proj those of dense_h_to_4h (SwiGLU's gate, then up). Rotary positions are
// Hugging Face's rotate-half form, which ours is, so no row is permuted. Every config.json key that
// changes the maths and is not implemented (rope_scaling, another activation or norm epsilon,
// biases on some linears only, a partial rotary factor) is refused by name, as is any tensor that
// is not part of the model. The directory's tokenizer (tokenizer.model, else tokenizer.json) is
// named by directory_tokenizer (hf_gpt2.hpp) and read by io::open_tokenizer.
#pragma once
#include <string>

#include "hpct/engine/checkpoint/hf_gpt2.hpp"

namespace hpct::engine {

/// Whether `path` is a directory whose config.json describes a Llama (model_type "llama").
bool is_hf_llama(const std::string& path);

/// Reads the Llama directory `dir`; vocab_multiple pads the vocabulary as
/// --make-vocab-size-divisible-by (the padding rows stay zero). Throws hpct::Error naming the file
/// and the key or tensor. (HfGpt2 carries any Hugging Face model read: its cfg, params and file.)
HfGpt2 read_hf_llama(const std::string& dir, int vocab_multiple = 128);

}  // namespace hpct::engine

#include <cstdint>
#include <functional>
#include <vector>

namespace hpct::engine {

/// Why a model of config mc cannot be written as a LlamaForCausalLM ("" when it can): Llama's norms
/// are RMSNorm, its MLPs SwiGLU, its positions rotary over whole heads, its linears without biases,
/// and it has one MLP per layer.
std::string hf_llama_unfit(const model::GptConfig& mc);

/// One tensor in Hugging Face's names: its shape and values.
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
/// The tensors of the Llama-shaped model mc in Hugging Face's names and layout, from ours: `ours`
/// returns one of our tensors whole by name (Gpt::layout_for's full shape). vocab: the tokenizer's
/// size (the padding rows are dropped). The inverse of read_hf_llama.
std::vector<HfTensor> hf_llama_tensors(const model::GptConfig& mc, int64_t vocab,
                                       const std::function<std::vector<float>(const std::string&)>& ours);
/// config.json for it (LlamaConfig's keys).
nlohmann::json hf_llama_config(const model::GptConfig& mc, int64_t vocab);

}  // namespace hpct::engine
