// Hugging Face Llama weights -> this project's parameter table (see hf_llama.hpp).
#include "hpct/engine/checkpoint/hf_llama.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"
#include "hpct/core/json_config.hpp"
#include "hpct/core/param_layout.hpp"
#include "hpct/io/safetensors.hpp"

namespace hpct::engine {

namespace {

nlohmann::json read_json(const std::string& file) {
  nlohmann::json j = parse_json(read_regular_file(file, "a Hugging Face JSON file", 64ull << 20), file);
  if (!j.is_object()) throw file_error(file, "is not a JSON object");
  return j;
}

// The tensors of one model, in one file or several shards.
class Tensors {
 public:
  explicit Tensors(const std::string& dir) {
    const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
    if (std::filesystem::is_regular_file(single)) {
      files_.push_back(std::make_unique<io::SafetensorsFile>(io::SafetensorsFile::open(single)));
      for (const auto& t : files_[0]->tensors()) where_[t.name] = 0;
      return;
    }
    if (!std::filesystem::is_regular_file(index))
      throw file_error(dir, "has neither model.safetensors nor model.safetensors.index.json (save_pretrained writes one)",
                       "pytorch_model.bin is not read (loading it could run code): convert it to safetensors");
    const nlohmann::json j = read_json(index);
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw file_error(index, "has no weight_map object");
    std::map<std::string, size_t> shard;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) throw file_error(index, "weight_map." + it.key() + " is not a file name");
      const std::string name = it.value().get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
        throw file_error(index, "weight_map." + it.key() + " names '" + name + "', not a file beside the index");
      if (!shard.count(name)) {
        shard[name] = files_.size();
        files_.push_back(std::make_unique<io::SafetensorsFile>(io::SafetensorsFile::open(dir + "/" + name)));
      }
      const size_t f = shard[name];
      if (!files_[f]->find(it.key())) throw file_error(dir + "/" + name, "has no tensor '" + it.key() + "' (the index names it here)");
      where_[it.key()] = f;
    }
    for (const auto& f : files_)  // nothing in a shard that the index does not name
      for (const auto& t : f->tensors())
        if (!where_.count(t.name) || files_[where_[t.name]].get() != f.get())
          throw file_error(f->path(), "has tensor '" + t.name + "' that the index does not place in it");
  }
  const io::SafetensorsTensor* find(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? nullptr : files_[it->second]->find(name);
  }
  const io::SafetensorsFile& file_of(const std::string& name) const { return *files_[where_.at(name)]; }
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& [k, v] : where_) n.push_back(k);
    return n;
  }
  const std::string& first_path() const { return files_[0]->path(); }

 private:
  std::vector<std::unique_ptr<io::SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;
};

int positive(const nlohmann::json& c, const std::string& file, const char* key, int64_t max) {
  if (!c.contains(key) || !c[key].is_number_integer() || c[key].get<int64_t>() < 1 || c[key].get<int64_t>() > max)
    throw file_error(file, std::string("key ") + key + " is " + (c.contains(key) ? c[key].dump() : "missing") +
                               ": a positive integer up to " + std::to_string(max) + " is needed");
  return static_cast<int>(c[key].get<int64_t>());
}

}  // namespace

bool is_hf_llama(const std::string& path) {
  const std::string cfg = path + "/config.json";
  if (!std::filesystem::is_directory(path) || !std::filesystem::is_regular_file(cfg)) return false;
  try {
    const nlohmann::json j = read_json(cfg);
    return j.contains("model_type") && j["model_type"] == "llama";
  } catch (const Error&) {
    return false;  // the GPT-2 reader reports what is wrong with it
  }
}

HfGpt2 read_hf_llama(const std::string& dir, int vocab_multiple) {
  const std::string cf = dir + "/config.json";
  const nlohmann::json c = read_json(cf);
  model::GptConfig mc;
  mc.num_layers = positive(c, cf, "num_hidden_layers", 1 << 16);
  mc.hidden_size = positive(c, cf, "hidden_size", 1 << 20);
  mc.num_heads = positive(c, cf, "num_attention_heads", 1 << 16);
  mc.num_kv_heads = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                        ? positive(c, cf, "num_key_value_heads", 1 << 16) : mc.num_heads;
  mc.ffn_hidden_size = positive(c, cf, "intermediate_size", 1 << 24);
  mc.max_seq_length = positive(c, cf, "max_position_embeddings", 1 << 24);
  mc.vocab_size = positive(c, cf, "vocab_size", 1 << 30);
  mc.vocab_multiple = vocab_multiple;
  mc.normalization = model::NormKind::rmsnorm;
  mc.mlp = model::MlpKind::swiglu;
  mc.rotary = true;
  mc.linear_bias = false;
  mc.attention_dropout = mc.hidden_dropout = 0;
  if (c.contains("tie_word_embeddings") && !c["tie_word_embeddings"].is_boolean())
    throw file_error(cf, "key tie_word_embeddings is " + c["tie_word_embeddings"].dump() + ": true or false is needed");
  const bool tied = c.contains("tie_word_embeddings") && c["tie_word_embeddings"].get<bool>();
  mc.untie_embeddings = !tied;
  if (c.contains("rope_theta")) {
    if (!c["rope_theta"].is_number() || !(c["rope_theta"].get<double>() > 1))
      throw file_error(cf, "key rope_theta is " + c["rope_theta"].dump() + ": a number above 1 is needed");
    mc.rope_theta = c["rope_theta"].get<double>();
  }
  // What changes the maths and is not implemented, refused by name.
  auto refuse_unless = [&](const char* key, const nlohmann::json& ok, const std::string& why) {
    if (c.contains(key) && !c[key].is_null() && c[key] != ok)
      throw file_error(cf, std::string("key ") + key + " is " + c[key].dump() + "; " + why);
  };
  refuse_unless("hidden_act", "silu", "this model's SwiGLU uses silu");
  refuse_unless("rope_scaling", nullptr, "scaled rotary positions (Llama 3.1's, linear, dynamic, YaRN) are not implemented");
  refuse_unless("attention_bias", false, "biases on the attention's linears are not implemented (--disable-bias-linear "
                                         "applies to all of them)");
  refuse_unless("mlp_bias", false, "biases on the MLP's linears are not implemented");
  refuse_unless("partial_rotary_factor", 1.0, "rotary positions on part of a head are read as --rotary-percent, not from Llama configs yet");
  if (c.contains("rms_norm_eps") && (!c["rms_norm_eps"].is_number() || std::fabs(c["rms_norm_eps"].get<double>() - 1e-5) > 1e-12))
    throw file_error(cf, "key rms_norm_eps is " + c["rms_norm_eps"].dump() + "; this model's RMSNorm epsilon is 1e-05");
  if (c.contains("head_dim") && !c["head_dim"].is_null() &&
      (!c["head_dim"].is_number_integer() || c["head_dim"].get<int64_t>() * mc.num_heads != mc.hidden_size))
    throw file_error(cf, "key head_dim is " + c["head_dim"].dump() + "; heads of hidden_size / num_attention_heads = " +
                             std::to_string(mc.hidden_size / mc.num_heads) + " channels are implemented");
  try {
    mc.validate();
  } catch (const Error& e) {
    throw file_error(cf, "describes a model this version cannot build: " + e.message());
  }

  const Tensors t(dir);
  const ParamLayout layout = model::Gpt::layout_for(mc);
  HfGpt2 out;
  out.cfg = mc;
  out.file = t.first_path();
  out.tokenizer = directory_tokenizer(dir);
  const int64_t C = mc.hidden_size, d = C / mc.num_heads, KVC = (int64_t)mc.kv_heads() * d, F = mc.ffn(),
                V = mc.vocab_size;
  // (theirs, shape) -> (ours, row offset in ours): every tensor of the file is one of these.
  struct Piece {
    std::string theirs;
    std::vector<int64_t> shape;
    std::string ours;
    int64_t row = 0;  // first row of ours it fills
  };
  std::vector<Piece> pieces = {{"model.embed_tokens.weight", {V, C}, "embedding.word_embeddings.weight", 0},
                               {"model.norm.weight", {C}, "final_layernorm.weight", 0}};
  if (!tied) pieces.push_back({"lm_head.weight", {V, C}, "output_layer.weight", 0});
  for (int l = 0; l < mc.num_layers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".", o = "layers." + std::to_string(l) + ".";
    pieces.push_back({h + "input_layernorm.weight", {C}, o + "input_layernorm.weight", 0});
    pieces.push_back({h + "self_attn.q_proj.weight", {C, C}, o + "attention.query_key_value.weight", 0});
    pieces.push_back({h + "self_attn.k_proj.weight", {KVC, C}, o + "attention.query_key_value.weight", C});
    pieces.push_back({h + "self_attn.v_proj.weight", {KVC, C}, o + "attention.query_key_value.weight", C + KVC});
    pieces.push_back({h + "self_attn.o_proj.weight", {C, C}, o + "attention.dense.weight", 0});
    pieces.push_back({h + "post_attention_layernorm.weight", {C}, o + "post_attention_layernorm.weight", 0});
    pieces.push_back({h + "mlp.gate_proj.weight", {F, C}, o + "mlp.dense_h_to_4h.weight", 0});
    pieces.push_back({h + "mlp.up_proj.weight", {F, C}, o + "mlp.dense_h_to_4h.weight", F});
    pieces.push_back({h + "mlp.down_proj.weight", {C, F}, o + "mlp.dense_4h_to_h.weight", 0});
  }
  std::set<std::string> known;
  for (const auto& p : pieces) {  // every shape and dtype before anything is allocated
    known.insert(p.theirs);
    const io::SafetensorsTensor* x = t.find(p.theirs);
    if (!x) throw file_error(dir, "has no tensor '" + p.theirs + "' (a LlamaForCausalLM of config.json's shape holds it)");
    if (x->dtype != "F32" && x->dtype != "F16" && x->dtype != "BF16")
      throw file_error(t.file_of(p.theirs).path(), "tensor " + p.theirs + " is " + x->dtype + ": F32, F16 and BF16 are read");
    if (x->shape != p.shape)
      throw file_error(t.file_of(p.theirs).path(), "tensor " + p.theirs + " has shape " + shape_string(x->shape) +
                                                       ", config.json's model needs " + shape_string(p.shape));
  }
  for (const auto& n : t.names()) {
    const bool rotary_buffer = n.size() > 20 && n.compare(n.size() - 20, 20, ".rotary_emb.inv_freq") == 0;
    if (!known.count(n) && !rotary_buffer && !(tied && n == "lm_head.weight"))
      throw file_error(t.file_of(n).path(), "has tensor '" + n + "', which is not part of a LlamaForCausalLM of this shape");
  }
  out.params.assign(layout.numel(), 0.0f);
  for (const auto& p : pieces) {
    const std::vector<float> x = t.file_of(p.theirs).read_f32(p.theirs, p.shape);
    const TensorSpec& ours = layout.find(p.ours);
    const int64_t cols = ours.shape.size() > 1 ? ours.shape[1] : 1;
    std::copy(x.begin(), x.end(), out.params.begin() + static_cast<std::ptrdiff_t>(ours.offset + p.row * cols));
  }
  if (tied && t.find("lm_head.weight")) {  // a tied head stored anyway must be the embedding
    const std::vector<float> h = t.file_of("lm_head.weight").read_f32("lm_head.weight", {V, C});
    const float* e = out.params.data() + layout.find("embedding.word_embeddings.weight").offset;
    if (!std::equal(h.begin(), h.end(), e))
      throw file_error(t.file_of("lm_head.weight").path(), "tensor lm_head.weight differs from model.embed_tokens.weight, "
                                                           "but config.json's tie_word_embeddings is true");
  }
  return out;
}

}  // namespace hpct::engine

namespace hpct::engine {

std::string hf_llama_unfit(const model::GptConfig& mc) {
  if (mc.normalization != model::NormKind::rmsnorm) return "its norms are LayerNorm, a Llama's are RMSNorm";
  if (mc.mlp != model::MlpKind::swiglu) return "its MLPs are GELU, a Llama's are SwiGLU";
  if (!mc.rotary) return "its positions are a learned table, a Llama's are rotary";
  if (mc.rotary_dims() != mc.hidden_size / mc.num_heads) return "its rotary positions cover part of each head, a Llama's all of it";
  if (mc.linear_bias) return "its linears have biases, a Llama's have none";
  if (mc.moe.enabled(mc.num_layers)) return "it has mixture-of-experts layers, a Llama one MLP per layer";
  if (mc.lora.enabled()) return "it holds LoRA adapters (merge them first: hpct_ckpt merge-lora)";
  return "";
}

std::vector<HfTensor> hf_llama_tensors(const model::GptConfig& mc, int64_t vocab,
                                       const std::function<std::vector<float>(const std::string&)>& ours) {
  const int64_t C = mc.hidden_size, d = C / mc.num_heads, KVC = (int64_t)mc.kv_heads() * d, F = mc.ffn();
  std::vector<HfTensor> out;
  auto rows = [&](const std::vector<float>& x, int64_t first, int64_t n, int64_t cols, const std::string& name) {
    out.push_back({name, {n, cols}, std::vector<float>(x.begin() + first * cols, x.begin() + (first + n) * cols)});
  };
  rows(ours("embedding.word_embeddings.weight"), 0, vocab, C, "model.embed_tokens.weight");  // padding rows dropped
  for (int l = 0; l < mc.num_layers; ++l) {
    const std::string o = "layers." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
    out.push_back({h + "input_layernorm.weight", {C}, ours(o + "input_layernorm.weight")});
    const std::vector<float> qkv = ours(o + "attention.query_key_value.weight");
    rows(qkv, 0, C, C, h + "self_attn.q_proj.weight");
    rows(qkv, C, KVC, C, h + "self_attn.k_proj.weight");
    rows(qkv, C + KVC, KVC, C, h + "self_attn.v_proj.weight");
    out.push_back({h + "self_attn.o_proj.weight", {C, C}, ours(o + "attention.dense.weight")});
    out.push_back({h + "post_attention_layernorm.weight", {C}, ours(o + "post_attention_layernorm.weight")});
    const std::vector<float> fc = ours(o + "mlp.dense_h_to_4h.weight");
    rows(fc, 0, F, C, h + "mlp.gate_proj.weight");
    rows(fc, F, F, C, h + "mlp.up_proj.weight");
    out.push_back({h + "mlp.down_proj.weight", {C, F}, ours(o + "mlp.dense_4h_to_h.weight")});
  }
  out.push_back({"model.norm.weight", {C}, ours("final_layernorm.weight")});
  if (mc.untie_embeddings) rows(ours("output_layer.weight"), 0, vocab, C, "lm_head.weight");
  return out;
}

nlohmann::json hf_llama_config(const model::GptConfig& mc, int64_t vocab) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", mc.hidden_size},
          {"intermediate_size", mc.ffn()},
          {"num_attention_heads", mc.num_heads},
          {"num_key_value_heads", mc.kv_heads()},
          {"num_hidden_layers", mc.num_layers},
          {"max_position_embeddings", mc.positions()},
          {"vocab_size", vocab},
          {"hidden_act", "silu"},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", mc.rope_theta},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"tie_word_embeddings", !mc.untie_embeddings},
          {"torch_dtype", "float32"}};
}

}  // namespace hpct::engine
