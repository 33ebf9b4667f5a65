// Hugging Face GPT-2 weights <-> this project's parameter table (see hf_gpt2.hpp).
#include "hpct/engine/checkpoint/hf_gpt2.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "hpct/core/error.hpp"
#include "hpct/core/json_config.hpp"
#include "hpct/core/param_layout.hpp"
#include "hpct/engine/checkpoint/hf_llama.hpp"
#include "hpct/io/safetensors.hpp"

namespace hpct::engine {

std::vector<Gpt2Name> gpt2_names(int layers) {
  std::vector<Gpt2Name> m = {{"embedding.word_embeddings.weight", "wte.weight", false},
                             {"embedding.position_embeddings.weight", "wpe.weight", false}};
  for (int l = 0; l < layers; ++l) {
    const std::string o = "layers." + std::to_string(l) + ".", t = "h." + std::to_string(l) + ".";
    m.push_back({o + "input_layernorm.weight", t + "ln_1.weight", false});
    m.push_back({o + "input_layernorm.bias", t + "ln_1.bias", false});
    m.push_back({o + "attention.query_key_value.weight", t + "attn.c_attn.weight", true});
    m.push_back({o + "attention.query_key_value.bias", t + "attn.c_attn.bias", false});
    m.push_back({o + "attention.dense.weight", t + "attn.c_proj.weight", true});
    m.push_back({o + "attention.dense.bias", t + "attn.c_proj.bias", false});
    m.push_back({o + "post_attention_layernorm.weight", t + "ln_2.weight", false});
    m.push_back({o + "post_attention_layernorm.bias", t + "ln_2.bias", false});
    m.push_back({o + "mlp.dense_h_to_4h.weight", t + "mlp.c_fc.weight", true});
    m.push_back({o + "mlp.dense_h_to_4h.bias", t + "mlp.c_fc.bias", false});
    m.push_back({o + "mlp.dense_4h_to_h.weight", t + "mlp.c_proj.weight", true});
    m.push_back({o + "mlp.dense_4h_to_h.bias", t + "mlp.c_proj.bias", false});
  }
  m.push_back({"final_layernorm.weight", "ln_f.weight", false});
  m.push_back({"final_layernorm.bias", "ln_f.bias", false});
  return m;
}

namespace {

// A positive 2-D dimension of a tensor, bounded so the model's int fields hold it.
int dim_of(const io::SafetensorsFile& st, const io::SafetensorsTensor& t, size_t axis, const char* what, int64_t max) {
  if (t.shape.size() != 2)
    throw file_error(st.path(), "tensor " + t.name + " has shape " + shape_string(t.shape) + ", GPT-2's is 2-D");
  const int64_t d = t.shape[axis];
  if (d < 1 || d > max)
    throw file_error(st.path(), "tensor " + t.name + " has shape " + shape_string(t.shape) + ": " + what + " must be 1.." +
                                    std::to_string(max));
  return static_cast<int>(d);
}

// config.json's integer `key` (or its older name), which must equal what the tensors say.
void agree(const nlohmann::json& c, const std::string& file, const std::string& key, const std::string& alt, int tensors,
           const std::string& from) {
  const nlohmann::json* v = c.contains(key) ? &c[key] : (!alt.empty() && c.contains(alt) ? &c[alt] : nullptr);
  if (!v) return;
  if (!v->is_number_integer() || v->get<int64_t>() != tensors)
    throw file_error(file, "key " + (c.contains(key) ? key : alt) + " is " + v->dump() + " but " + from + " says " +
                               std::to_string(tensors));
}

}  // namespace

std::vector<float> transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[c * rows + r] = x[r * cols + c];
  return y;
}

std::optional<io::TokenizerSpec> directory_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return std::nullopt;
  auto has = [&](const char* name) { return fs::is_regular_file(fs::path(path) / name, ec); };
  io::TokenizerSpec s;
  if (has("vocab.json") && has("merges.txt")) {
    s.vocab_file = path + "/vocab.json", s.merge_file = path + "/merges.txt";
  } else if (has("tokenizer.model")) {
    s.type = "Llama2Tokenizer", s.model = path + "/tokenizer.model";
  } else if (has("tokenizer.json")) {
    s.type = "HFTokenizer", s.model = path + "/tokenizer.json";
  } else {
    return std::nullopt;
  }
  return s;
}

HfGpt2 read_hf_gpt2(const std::string& path, int vocab_multiple, int heads) {
  if (is_hf_llama(path)) return read_hf_llama(path, vocab_multiple);  // every app's --load-hf reads Llamas too
  HfGpt2 out;
  nlohmann::json config;
  std::string config_file;
  if (std::filesystem::is_directory(path)) {
    out.file = path + "/model.safetensors";
    config_file = path + "/config.json";
    if (!std::filesystem::is_regular_file(out.file))
      throw file_error(path, "has no model.safetensors (a save_pretrained directory holds one)",
                       std::filesystem::exists(path + "/pytorch_model.bin")
                           ? "its pytorch_model.bin is not read (unpickling it could run code): convert it to safetensors "
                             "(transformers: model.save_pretrained(DIR, safe_serialization=True))"
                           : "");
    if (!std::filesystem::is_regular_file(config_file)) throw file_error(path, "has no config.json (a save_pretrained directory holds one)");
    std::ifstream in(config_file);
    std::stringstream ss;
    ss << in.rdbuf();
    config = parse_json(ss.str(), config_file);
    if (!config.is_object()) throw file_error(config_file, "is not a JSON object");
    out.tokenizer = directory_tokenizer(path);
  } else {
    out.file = path;
  }
  // Architecture keys a GPT-2 of ours cannot follow.
  if (config.contains("activation_function") && config["activation_function"] != "gelu_new")
    throw file_error(config_file, "key activation_function is " + config["activation_function"].dump() +
                                      "; this GPT's MLP uses GPT-2's gelu_new (the tanh approximation)");
  if (config.contains("layer_norm_epsilon") &&
      (!config["layer_norm_epsilon"].is_number() || std::fabs(config["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12))
    throw file_error(config_file, "key layer_norm_epsilon is " + config["layer_norm_epsilon"].dump() + "; this GPT's is 1e-05");
  // Attention scalings this GPT does not apply (it scales the scores by 1/sqrt(head size), always).
  for (const auto& [key, plain] : {std::pair<const char*, bool>{"scale_attn_weights", true},
                                   {"scale_attn_by_inverse_layer_idx", false}})
    if (config.contains(key) && config[key] != plain)
      throw file_error(config_file, std::string("key ") + key + " is " + config[key].dump() + "; this GPT computes " +
                                        (plain ? "true" : "false") + " (softmax(q k^T / sqrt(head size)) in every layer)");

  const io::SafetensorsFile sf = io::SafetensorsFile::open(out.file);
  const std::string prefix = sf.find("transformer.wte.weight") ? "transformer." : "";
  auto need = [&](const std::string& name) -> const io::SafetensorsTensor& {
    const auto* t = sf.find(prefix + name);
    if (!t)
      throw file_error(out.file, "has no tensor '" + prefix + name + "' (GPT-2 names expected: wte.weight, h.0.ln_1.weight, ...)");
    return *t;
  };
  int layers = 0;
  while (sf.find(prefix + "h." + std::to_string(layers) + ".ln_1.weight")) ++layers;
  if (layers == 0) throw file_error(out.file, "has no tensor '" + prefix + "h.0.ln_1.weight': not a GPT-2 model");
  const auto& wte = need("wte.weight");
  const auto& wpe = need("wpe.weight");
  model::GptConfig& mc = out.cfg;
  mc.num_layers = layers;
  mc.hidden_size = dim_of(sf, wte, 1, "the hidden size", 1 << 20);
  mc.vocab_size = dim_of(sf, wte, 0, "the vocabulary", 1 << 30);
  mc.max_seq_length = dim_of(sf, wpe, 0, "the positions", 1 << 24);
  if (wpe.shape[1] != mc.hidden_size)
    throw file_error(out.file, "tensor " + wpe.name + " has shape " + shape_string(wpe.shape) + ", " + wte.name +
                                   "'s hidden size is " + std::to_string(mc.hidden_size));
  agree(config, config_file, "n_layer", "", layers, "the tensors' h.N count");
  agree(config, config_file, "n_embd", "", mc.hidden_size, wte.name);
  agree(config, config_file, "vocab_size", "", mc.vocab_size, wte.name);
  agree(config, config_file, "n_positions", "n_ctx", mc.max_seq_length, wpe.name);
  // The MLP's width: Conv1D c_fc is (n_embd, n_inner); config.json's n_inner null means 4 x n_embd.
  const auto& fc = need("h.0.mlp.c_fc.weight");
  mc.ffn_hidden_size = dim_of(sf, fc, 1, "the MLP width", 1 << 30);
  if (config.contains("n_inner") && !config["n_inner"].is_null())
    agree(config, config_file, "n_inner", "", mc.ffn_hidden_size, fc.name);
  else if (!config_file.empty() && mc.ffn_hidden_size != 4 * mc.hidden_size)
    throw file_error(config_file, "key n_inner is null (4 x n_embd = " + std::to_string(4 * mc.hidden_size) + ") but " +
                                      fc.name + " is " + std::to_string(mc.ffn_hidden_size) + " wide");
  mc.num_heads = std::max(1, mc.hidden_size / 64);
  if (config.contains("n_head")) {
    if (!config["n_head"].is_number_integer() || config["n_head"].get<int64_t>() < 1 ||
        config["n_head"].get<int64_t>() > mc.hidden_size)
      throw file_error(config_file, "key n_head is " + config["n_head"].dump() + ", not a head count for hidden " +
                                        std::to_string(mc.hidden_size));
    mc.num_heads = config["n_head"].get<int>();
  }
  if (heads > 0) mc.num_heads = heads;
  mc.vocab_multiple = vocab_multiple;
  mc.validate();

  // Every tensor of the file is one of ours, a mask buffer, or the tied head.
  const std::vector<Gpt2Name> names = gpt2_names(layers);
  std::set<std::string> known;
  for (const auto& nm : names) known.insert(prefix + nm.theirs);
  for (const auto& t : sf.tensors()) {
    if (known.count(t.name)) continue;
    const std::string n = t.name.substr(t.name.rfind(prefix, 0) == 0 ? prefix.size() : 0);
    auto ends_with = [&](const std::string& tail) {
      return n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool buffer = n.rfind("h.", 0) == 0 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias"));
    if (buffer || t.name == "lm_head.weight") continue;
    throw file_error(out.file, "has tensor '" + t.name + "', which is not part of a GPT-2 (" + prefix +
                                   "wte.weight, " + prefix + "h.N.*, " + prefix + "ln_f.*, lm_head.weight)");
  }
  const ParamLayout layout = model::Gpt::layout_for(mc);
  auto theirs_of = [&](const Gpt2Name& nm) {  // the shape GPT-2 stores the tensor with
    std::vector<int64_t> theirs = layout.find(nm.ours).shape;
    if (nm.transpose) std::swap(theirs[0], theirs[1]);
    if (nm.theirs == "wte.weight") theirs[0] = mc.vocab_size;  // the padding rows stay zero
    return theirs;
  };
  // Every tensor's dtype and shape before anything is allocated: the model's size is then bounded
  // by the data the file really holds, whatever its header claims.
  for (const auto& nm : names) {
    const auto& t = need(nm.theirs);
    if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16")
      throw file_error(out.file, "tensor " + t.name + " is " + t.dtype + ": F32, F16 and BF16 are read");
    if (t.shape != theirs_of(nm))
      throw file_error(out.file, "tensor " + t.name + " has shape " + shape_string(t.shape) + ", this model needs " +
                                     shape_string(theirs_of(nm)));
  }
  out.params.assign(layout.numel(), 0.0f);
  for (const auto& nm : names) {
    const std::vector<int64_t> theirs = theirs_of(nm);
    std::vector<float> x = sf.read_f32(prefix + nm.theirs, theirs);
    if (nm.transpose) x = transposed(x, theirs[0], theirs[1]);
    std::copy(x.begin(), x.end(), out.params.begin() + static_cast<std::ptrdiff_t>(layout.find(nm.ours).offset));
  }
  if (const auto* head = sf.find("lm_head.weight")) {  // must be the tied embedding, value for value
    const std::vector<int64_t> shape = {mc.vocab_size, mc.hidden_size};
    const std::vector<float> h = sf.read_f32("lm_head.weight", shape);
    const float* e = out.params.data() + layout.find("embedding.word_embeddings.weight").offset;
    if (!std::equal(h.begin(), h.end(), e))
      throw file_error(out.file, "tensor " + head->name + " differs from " + wte.name +
                                     ": an untied output head, which this GPT (tied, as GPT-2) cannot hold");
  }
  return out;
}

nlohmann::json hf_gpt2_config(const model::GptConfig& cfg, int vocab) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"n_layer", cfg.num_layers},
          {"n_embd", cfg.hidden_size},
          {"n_head", cfg.num_heads},
          {"n_positions", cfg.positions()},
          {"n_ctx", cfg.positions()},
          {"n_inner", cfg.ffn() == 4 * cfg.hidden_size ? nlohmann::json(nullptr) : nlohmann::json(cfg.ffn())},
          {"vocab_size", vocab},
          {"bos_token_id", vocab - 1},
          {"eos_token_id", vocab - 1},
          {"tie_word_embeddings", true},
          {"torch_dtype", "float32"}};
}

}  // namespace hpct::engine
