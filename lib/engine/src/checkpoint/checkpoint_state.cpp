// Reading and checking a checkpoint's run state (see checkpoint_state.hpp).
#include "hpct/engine/checkpoint/checkpoint_state.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "hpct/core/error.hpp"
#include "hpct/core/json_config.hpp"
#include "hpct/core/report.hpp"
#include "hpct/engine/loop/schedules.hpp"

namespace hpct::engine {

namespace {

const char* kGroupNames[3] = {"model", "optimizer/exp_avg", "optimizer/exp_avg_sq"};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The attributes' stored text, in one fixed order.
// consumed_tokens (< 0: absent, as before sequence-length warmup) and consumed_layer_tokens (< 0:
// absent, a run without random-LTD) join the text only when stored.
uint64_t checksum_of(long long it, long long consumed, long long step, long long skipped, long long nan, uint64_t seed,
                     const std::string& scaler, const std::string& config, const std::string& arch,
                     const std::string& tokenizer, const std::string& layout, long long tokens, long long layer_tokens,
                     long long step_base, bool optimizer_saved) {
  std::string t = std::string(kCheckpointFormat) + "\niteration=" + std::to_string(it) + "\nconsumed_samples=" +
                  std::to_string(consumed) + "\noptimizer_step=" + std::to_string(step) + "\nskipped_iterations=" +
                  std::to_string(skipped) + "\nnan_iterations=" + std::to_string(nan) + "\nseed=" + std::to_string(seed) +
                  "\nloss_scaler=" + scaler + "\nconfig=" + config + "\narchitecture=" + arch + "\ntokenizer=" + tokenizer +
                  "\nparallel_layout=" + layout;
  if (tokens >= 0) t += "\nconsumed_tokens=" + std::to_string(tokens);
  if (layer_tokens >= 0) t += "\nconsumed_layer_tokens=" + std::to_string(layer_tokens);
  if (step_base != 0) t += "\noptimizer_step_base=" + std::to_string(step_base);
  if (!optimizer_saved) t += "\noptimizer_states=none";
  return fnv1a(t);
}

}  // namespace

uint64_t run_state_checksum(const TrainingState& s, const CheckpointMeta& m) {
  return checksum_of(s.iteration, s.consumed_samples, s.adam_step, s.skipped_iterations, s.nan_iterations, m.seed,
                     json_text(s.loss_scaler), json_text(m.config), json_text(m.architecture), m.tokenizer, json_text(m.layout),
                     s.consumed_tokens, s.consumed_layer_tokens, s.adam_step_base, s.optimizer_saved);
}

StoredRun read_stored_run(const io::H5File& f, const std::string& file) {
  RunStateAttrs a;
  a.str = [&](const char* k) { return f.attr_string("/", k); };
  a.i64 = [&](const char* k) { return f.attr_int("/", k); };
  a.u64 = [&](const char* k) { return f.attr_uint("/", k); };
  return parse_stored_run(a, file);
}

StoredRun parse_stored_run(const RunStateAttrs& f, const std::string& file) {
  auto fmt = f.str("format");
  if (!fmt) throw file_error(file, "is not an hpctrain checkpoint (no 'format' attribute)");
  if (*fmt != kCheckpointFormat)
    throw file_error(file, "has format '" + fmt->substr(0, 80) + "', this version reads '" + kCheckpointFormat + "'");
  auto geti = [&](const char* k) {
    auto v = f.i64(k);
    if (!v) throw file_error(file, std::string("lacks the integer attribute '") + k + "': the checkpoint is damaged");
    if (*v < 0) throw file_error(file, std::string("has attribute '") + k + "' = " + std::to_string(*v) + ", which must be >= 0: the checkpoint is damaged");
    return static_cast<long long>(*v);
  };
  auto gets = [&](const char* k) {
    auto v = f.str(k);
    if (!v) throw file_error(file, std::string("lacks the attribute '") + k + "': the checkpoint is damaged");
    return *v;
  };
  auto getj = [&](const char* k, const std::string& text) {
    nlohmann::json j = parse_json(text, file + ": attribute '" + k + "'");
    if (!j.is_object() && !(j.is_null() && std::string(k) == "loss_scaler"))
      throw file_error(file, std::string("has attribute '") + k + "' that is not a JSON object: the checkpoint is damaged");
    return j;
  };
  StoredRun r;
  TrainingState& s = r.state;
  s.iteration = geti("iteration");
  s.consumed_samples = geti("consumed_samples");
  if (f.i64("consumed_tokens")) s.consumed_tokens = geti("consumed_tokens");
  if (f.i64("consumed_layer_tokens")) s.consumed_layer_tokens = geti("consumed_layer_tokens");
  s.adam_step = geti("optimizer_step");
  if (auto b = f.i64("optimizer_step_base")) s.adam_step_base = static_cast<long long>(*b);  // may be negative (checked below)
  s.skipped_iterations = geti("skipped_iterations");
  s.nan_iterations = geti("nan_iterations");
  if (auto o = f.str("optimizer_states")) {  // absent: saved (every checkpoint before --no-save-optim)
    if (*o != "none")
      throw file_error(file, "has attribute 'optimizer_states' = '" + o->substr(0, 40) + "' (only \"none\" is written): the checkpoint is damaged");
    s.optimizer_saved = false;
  }
  const std::string scaler = gets("loss_scaler"), config = gets("config"), arch = gets("architecture"),
                    layout = gets("parallel_layout");
  r.meta.tokenizer = gets("tokenizer");
  auto seed = f.u64("seed");
  if (!seed) throw file_error(file, "lacks the attribute 'seed': the checkpoint is damaged");
  r.meta.seed = *seed;
  s.loss_scaler = getj("loss_scaler", scaler);
  r.meta.config = getj("config", config);
  r.meta.architecture = getj("architecture", arch);
  r.meta.layout = getj("parallel_layout", layout);
  // Required: without it an edited run state (an architecture of 4 heads read as 8) would load.
  const auto sum = f.u64("run_state_checksum");
  if (!sum)
    throw file_error(file, "lacks the attribute 'run_state_checksum': the checkpoint is damaged or was edited",
                     "load an earlier checkpoint (pass its file to --load)");
  if (*sum != checksum_of(s.iteration, s.consumed_samples, s.adam_step, s.skipped_iterations, s.nan_iterations, *seed,
                          scaler, config, arch, r.meta.tokenizer, layout, s.consumed_tokens, s.consumed_layer_tokens,
                          s.adam_step_base, s.optimizer_saved))
    throw file_error(file, "fails its run-state checksum (iteration, samples, optimizer step, config or architecture "
                           "attributes were altered or are corrupt)",
                     "load an earlier checkpoint (pass its file to --load)");
  auto rel = [&](bool ok, const std::string& what) {
    if (!ok) throw file_error(file, "has an impossible run state: " + what + ": the checkpoint is damaged");
  };
  rel(s.iteration <= INT32_MAX, "iteration " + std::to_string(s.iteration) + " beyond 2^31-1");
  rel(s.consumed_samples <= (1ll << 53), "consumed_samples " + std::to_string(s.consumed_samples) + " beyond 2^53");
  rel(s.adam_step <= s.iteration, "optimizer_step " + std::to_string(s.adam_step) + " > iteration " + std::to_string(s.iteration));
  rel(s.adam_step_base <= INT32_MAX, "optimizer_step_base " + std::to_string(s.adam_step_base) + " beyond 2^31-1");
  rel(s.adam_step_base >= INT32_MIN, "optimizer_step_base " + std::to_string(s.adam_step_base) + " below -2^31");
  // negative after --no-load-optim: the moments restarted that many optimizer steps into the run
  rel(s.adam_step_base >= -s.adam_step, "optimizer_step_base " + std::to_string(s.adam_step_base) + " < -optimizer_step " +
                                            std::to_string(s.adam_step));
  rel(s.skipped_iterations <= s.iteration, "skipped_iterations " + std::to_string(s.skipped_iterations) + " > iteration " + std::to_string(s.iteration));
  rel(s.nan_iterations <= s.iteration, "nan_iterations " + std::to_string(s.nan_iterations) + " > iteration " + std::to_string(s.iteration));
  rel(s.consumed_samples >= s.iteration, "consumed_samples " + std::to_string(s.consumed_samples) + " < iteration " + std::to_string(s.iteration));
  rel(s.consumed_tokens < 0 || s.consumed_tokens >= s.consumed_samples,
      "consumed_tokens " + std::to_string(s.consumed_tokens) + " < consumed_samples " + std::to_string(s.consumed_samples));
  if (auto e = LossScaler::state_error(s.loss_scaler); !e.empty())
    throw file_error(file, "has attribute 'loss_scaler' that " + e + ": the checkpoint is damaged");
  gpt_config_of(r.meta.architecture, file);  // a describable model
  return r;
}

namespace {
// A stored architecture with the keys added since written out as they were then: checkpoints
// written before the position table was sized apart from --seq-length recorded its rows as
// seq_length (the two were equal); before --ffn-hidden-size every MLP was 4 x hidden_size wide;
// before --normalization every norm was a LayerNorm, before --swiglu every MLP a GELU one, before
// --disable-bias-linear every linear had a bias, before --untie-embeddings-and-output-weights the
// head was the word embedding, before rotary positions every model had a learned table.
nlohmann::json with_current_keys(nlohmann::json a) {
  if (a.is_object() && !a.contains("max_position_embeddings") && a.contains("seq_length"))
    a["max_position_embeddings"] = a["seq_length"];
  if (a.is_object()) a.erase("seq_length");
  if (a.is_object() && !a.contains("ffn_hidden_size") && a.contains("hidden_size") && a["hidden_size"].is_number_integer() &&
      a["hidden_size"].get<long long>() > 0 && a["hidden_size"].get<long long>() < (1LL << 28))
    a["ffn_hidden_size"] = 4 * a["hidden_size"].get<long long>();
  if (a.is_object() && !a.contains("normalization")) a["normalization"] = "layernorm";
  if (a.is_object() && !a.contains("num_key_value_heads") && a.contains("num_attention_heads"))
    a["num_key_value_heads"] = a["num_attention_heads"];  // before grouped-query attention: one per head
  if (a.is_object() && !a.contains("swiglu")) a["swiglu"] = false;
  if (a.is_object() && !a.contains("add_bias_linear")) a["add_bias_linear"] = true;
  if (a.is_object() && !a.contains("untie_embeddings_and_output_weights")) a["untie_embeddings_and_output_weights"] = false;
  if (a.is_object() && !a.contains("position_embedding_type")) a["position_embedding_type"] = "learned_absolute";
  return a;
}
}  // namespace

void check_compatible(const StoredRun& r, const CheckpointMeta& here, const std::string& file) {
  const nlohmann::json a = with_current_keys(r.meta.architecture);
  for (auto it = here.architecture.begin(); it != here.architecture.end(); ++it) {
    if (!a.contains(it.key()))
      throw file_error(file, "architecture lacks '" + it.key() + "' (this run: " + it.value().dump() + "): the checkpoint is damaged");
    if (a[it.key()] != it.value())
      throw file_error(file, "architecture differs: " + it.key() + " is " + json_excerpt(a[it.key()]) + " in the checkpoint, " +
                                 it.value().dump() + " here");
  }
  // An imported checkpoint does not know its tokenizer ("unknown: ..."); at iteration 0 no sample
  // has been drawn, so the seed has not fixed any data order yet.
  if (r.meta.tokenizer.rfind("unknown", 0) != 0 && r.meta.tokenizer != here.tokenizer)
    throw file_error(file, "was trained with tokenizer '" + r.meta.tokenizer.substr(0, 120) + "', this run has '" + here.tokenizer + "'",
                     "give the --vocab-file/--merge-file (or --mock-data --vocab-size) the checkpoint was trained with");
  // Megatron's OptimizerParamScheduler rule: a resumed run keeps the checkpoint's learning-rate
  // schedule unless --override-opt_param-scheduler takes this run's (imports, at iteration 0,
  // and checkpoints that predate a key have nothing to keep); a run that trains nothing
  // (--skip-train) steps no schedule.
  const nlohmann::json& was = r.meta.config;
  // A sample-based run schedules by samples: its iteration lengths (derived from --train-samples and
  // the batch ramp) are not part of the schedule.
  const bool by_samples = here.config.is_object() && was.is_object() && here.config.value("train_samples", 0LL) > 0 &&
                          was.value("train_samples", 0LL) > 0;
  // --finetune-resume-optimizer starts a new schedule and data order from the checkpoint's optimizer states.
  const bool finetune = here.config.is_object() && here.config.value("finetune_resume_optimizer", false);
  if (r.state.iteration > 0 && was.is_object() && !here.config.value("override_opt_param_scheduler", false) &&
      !here.config.value("skip_train", false) && !finetune)
    for (const auto& [key, flag] : {std::pair<const char*, const char*>{"lr", "--lr"}, {"min_lr", "--min-lr"},
                                    {"lr_style", "--lr-decay-style"}, {"lr_warmup_iters", "--lr-warmup-iters"},
                                    {"lr_decay_iters", "--lr-decay-iters"}, {"lr_warmup_tokens", "--lr-warmup-tokens"},
                                    {"lr_decay_tokens", "--lr-decay-tokens"}, {"lr_warmup_samples", "--lr-warmup-samples"},
                                    {"lr_decay_samples", "--lr-decay-samples"}})
      if (was.contains(key) && here.config.contains(key) && was[key] != here.config[key] &&
          !(by_samples && std::string(key).find("_iters") != std::string::npos))
        throw config_error(flag, std::string(flag) + " " + json_excerpt(here.config[key]) + " differs from the checkpoint's " +
                                     json_excerpt(was[key]) + " (" + file + "): the learning-rate schedule would change mid-run",
                           "resume with the checkpoint's schedule flags (--lr-decay-iters defaults to --train-iters), or give "
                           "--override-opt_param-scheduler to take this run's (Megatron's rule)");
  // LoRA: a checkpoint holds adapters, which mean something only on the base they were trained on.
  if (was.is_object() && here.config.is_object() && was.contains("lora_base") && here.config.contains("lora_base") &&
      was["lora_base"] != here.config["lora_base"])
    throw file_error(file, "holds LoRA adapters trained on other base weights (" + json_excerpt(was["lora_base"]) +
                               ") than this run's (" + json_excerpt(here.config["lora_base"]) + ")",
                     "give the --load or --load-hf the LoRA run started from");
  if (r.state.iteration > 0 && r.meta.seed != here.seed && !finetune)
    throw config_error("--seed", "--seed " + std::to_string(here.seed) + " differs from the checkpoint's seed " +
                                     std::to_string(r.meta.seed) + " (" + file + "): the data order would change mid-run",
                       "resume with --seed " + std::to_string(r.meta.seed));
}

void check_tensor_set(const io::H5File& f, const ParamLayout& layout, const std::string& file, int groups) {
  const auto& tensors = layout.tensors();
  for (int g = 0; g < groups; ++g)
    for (const auto& ts : tensors) {
      std::string name = Checkpointer::dataset_name(kGroupNames[g], ts.name);
      // Links and layouts first, on every rank in this order: a virtual dataset's open is collective
      // and an external link or storage would read another file.
      if (const std::string why = f.plain_dataset_problem(name); !why.empty())
        throw file_error(file, "tensor " + why + "; the checkpoint is refused");
      if (!f.has_dataset(name))
        throw file_error(file, "has no tensor " + name + " that this model needs (shape " + shape_string(ts.shape) +
                                   "): it was written for another architecture or is damaged");
      auto shp = f.dataset_shape(name);
      if (shp != ts.shape)
        throw file_error(file, "tensor " + name + " has shape " + shape_string(shp) + " in the checkpoint, this model needs " +
                                   shape_string(ts.shape) + ": it was written for another architecture or is damaged");
    }
  auto all = f.list_datasets();
  if (all.size() != groups * tensors.size()) {
    for (const auto& n : all) {
      bool known = false;
      for (int g = 0; g < groups && !known; ++g)
        for (const auto& ts : tensors)
          if (Checkpointer::dataset_name(kGroupNames[g], ts.name) == n) known = true;
      if (!known) throw file_error(file, "has tensor " + n + ", which this model does not: it was written for another architecture");
    }
  }
  std::vector<TensorChecksum> sums;
  for (int g = 0; g < groups; ++g)
    for (const auto& ts : tensors) {
      const std::string name = Checkpointer::dataset_name(kGroupNames[g], ts.name);
      const auto sum = f.attr_uint(name, "checksum");
      if (!sum) throw file_error(file, "tensor " + name + " has no checksum attribute");
      sums.push_back({name, ts.shape, *sum});
    }
  const auto want = f.attr_uint("/", "tensor_checksums");
  if (!want)
    throw file_error(file, "lacks the attribute 'tensor_checksums': the checkpoint is damaged or was edited",
                     "load an earlier checkpoint (pass its file to --load)");
  if (*want != tensor_set_digest(std::move(sums)))
    throw file_error(file, "fails its tensor_checksums: a tensor's stored checksum is not the one saved under its name "
                           "(tensors swapped or aliased, or their checksums edited)",
                     "load an earlier checkpoint (pass its file to --load)");
}

uint64_t tensor_set_digest(std::vector<TensorChecksum> tensors) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorChecksum& a, const TensorChecksum& b) { return a.dataset < b.dataset; });
  std::string text;
  for (const auto& t : tensors) text += t.dataset + " " + shape_string(t.shape) + " " + std::to_string(t.checksum) + "\n";
  return fnv1a(text);  // the run-state checksum's FNV-1a (standard offset basis)
}

StoredRun check_structure(const io::H5File& f, const std::string& file, model::GptConfig* cfg) {
  StoredRun r = read_stored_run(f, file);
  *cfg = gpt_config_of(r.meta.architecture, file);
  // Bound the layout to be built by the file's own contents (a few tensors short or extra are named
  // one by one by check_tensor_set below): count the tensors before building their table, layers
  // first (a dense layer: 2 norms and 4 linears, each a weight and perhaps a bias), then what each
  // MoE layer's experts add.
  const uint64_t have = f.list_datasets().size();
  const uint64_t norm_t = cfg->normalization == model::NormKind::layernorm ? 2 : 1, lin_t = cfg->linear_bias ? 2 : 1;
  const uint64_t groups = r.state.optimizer_saved ? 3 : 1;
  uint64_t want = groups * ((2 * norm_t + 4 * lin_t) * static_cast<uint64_t>(cfg->num_layers) + (cfg->rotary ? 1 : 2) +
                          norm_t + (cfg->untie_embeddings ? 1 : 0));
  if (cfg->lora.enabled())  // adapters only: an A and a B per adapted linear of each layer
    want = 2 * groups * static_cast<uint64_t>(cfg->num_layers) * static_cast<uint64_t>(__builtin_popcount(cfg->lora.targets)) +
           2 * groups * static_cast<uint64_t>(__builtin_popcount(cfg->lora.modules_to_save));
  else if (want <= have + 36)
    for (int l = 0; l < cfg->num_layers; ++l)
      if (const int e = cfg->moe.experts_of(l, cfg->num_layers); e > 0)  // E MLPs, a router (and a coefficient) for one MLP
        want += groups * (2 * lin_t * e + 1 + (cfg->moe.residual ? 2 + 2 * lin_t : 0) - 2 * lin_t);
  if (want > have + 36)
    throw file_error(file, "holds " + std::to_string(have) + " tensors, its architecture (" + std::to_string(cfg->num_layers) +
                               " layers) needs " + std::to_string(want) + ": the checkpoint is damaged");
  check_tensor_set(f, model::Gpt::layout_for(*cfg).trained(), file, static_cast<int>(groups));
  return r;
}

nlohmann::json architecture_of(const model::GptConfig& mc) {
  nlohmann::json a = {{"model", "gpt"},
                      {"num_layers", mc.num_layers},
                      {"hidden_size", mc.hidden_size},
                      {"num_attention_heads", mc.num_heads},
                      {"num_key_value_heads", mc.kv_heads()},
                      {"ffn_hidden_size", mc.ffn()},
                      {"normalization", model::norm_name(mc.normalization)},
                      {"swiglu", mc.mlp == model::MlpKind::swiglu},
                      {"add_bias_linear", mc.linear_bias},
                      {"untie_embeddings_and_output_weights", mc.untie_embeddings},
                      {"position_embedding_type", mc.rotary ? "rope" : "learned_absolute"},
                      {"max_position_embeddings", mc.positions()},
                      {"padded_vocab_size", mc.padded_vocab()}};
  if (mc.rotary) {
    a["rotary_percent"] = mc.rotary_percent;
    a["rope_theta"] = mc.rope_theta;
  }
  if (mc.moe.enabled(mc.num_layers)) {
    a["num_experts"] = mc.moe.num_experts;
    a["expert_interval"] = mc.moe.expert_interval;
    a["topk"] = mc.moe.topk;
    a["mlp_type"] = mc.moe.residual ? "residual" : "standard";
  }
  if (mc.lora.enabled()) {  // the file holds the adapters only (the trained tensors)
    a["lora_rank"] = mc.lora.rank;
    a["lora_alpha"] = mc.lora.alpha > 0 ? mc.lora.alpha : mc.lora.rank;
    a["lora_targets"] = mc.lora.target_list();
    if (mc.lora.modules_to_save) a["lora_modules_to_save"] = mc.lora.module_list();
  }
  return a;
}

model::GptConfig gpt_config_of(const nlohmann::json& stored, const std::string& file) {
  const nlohmann::json a = with_current_keys(stored);
  auto field = [&](const char* k) {
    if (!a.is_object() || !a.contains(k) || !a[k].is_number_integer() || a[k].get<long long>() <= 0 ||
        a[k].get<long long>() > std::numeric_limits<int>::max() / 4)
      throw file_error(file, std::string("has no valid architecture.") + k + " (a positive integer): the checkpoint is damaged");
    return static_cast<int>(a[k].get<long long>());
  };
  if (!a.is_object() || !a.contains("model") || a["model"] != "gpt")
    throw file_error(file, "has an architecture whose model is not \"gpt\": not a checkpoint this version reads");
  model::GptConfig c;
  c.num_layers = field("num_layers");
  c.hidden_size = field("hidden_size");
  c.num_heads = field("num_attention_heads");
  if (!a["swiglu"].is_boolean())
    throw file_error(file, "has architecture.swiglu " + json_excerpt(a["swiglu"]) + ", not true or false: the checkpoint is damaged");
  if (a["swiglu"].get<bool>()) c.mlp = model::MlpKind::swiglu;
  if (!a["add_bias_linear"].is_boolean())
    throw file_error(file, "has architecture.add_bias_linear " + json_excerpt(a["add_bias_linear"]) +
                               ", not true or false: the checkpoint is damaged");
  c.linear_bias = a["add_bias_linear"].get<bool>();
  if (!a["untie_embeddings_and_output_weights"].is_boolean())
    throw file_error(file, "has architecture.untie_embeddings_and_output_weights " +
                               json_excerpt(a["untie_embeddings_and_output_weights"]) + ", not true or false: the checkpoint is damaged");
  c.untie_embeddings = a["untie_embeddings_and_output_weights"].get<bool>();
  if (a["position_embedding_type"] == "rope") {
    c.rotary = true;
    if (!a.contains("rotary_percent") || !a["rotary_percent"].is_number() || !a.contains("rope_theta") ||
        !a["rope_theta"].is_number())
      throw file_error(file, "has rotary positions without numbers rotary_percent and rope_theta in its architecture: "
                             "the checkpoint is damaged");
    c.rotary_percent = a["rotary_percent"].get<double>();
    c.rope_theta = a["rope_theta"].get<double>();
  } else if (a["position_embedding_type"] != "learned_absolute") {
    throw file_error(file, "has architecture.position_embedding_type " + json_excerpt(a["position_embedding_type"]) +
                               ": learned_absolute or rope; the checkpoint is damaged or from a newer version");
  }
  c.ffn_hidden_size = field("ffn_hidden_size");
  c.num_kv_heads = field("num_key_value_heads");
  if (a["normalization"] == "rmsnorm") c.normalization = model::NormKind::rmsnorm;
  else if (a["normalization"] != "layernorm")
    throw file_error(file, "has architecture.normalization " + json_excerpt(a["normalization"]) +
                               ": layernorm or rmsnorm; the checkpoint is damaged or from a newer version");
  c.max_seq_length = field("max_position_embeddings");
  c.vocab_size = field("padded_vocab_size");
  c.vocab_multiple = 1;
  if (a.contains("num_experts")) {  // an MoE model (dense checkpoints carry no MoE keys)
    const auto& ne = a["num_experts"];
    if (!ne.is_array() || ne.empty() || ne.size() > 100000)
      throw file_error(file, "has no valid architecture.num_experts (a list of counts): the checkpoint is damaged");
    for (const auto& v : ne) {
      if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > 1000000)
        throw file_error(file, "has an invalid expert count in architecture.num_experts: the checkpoint is damaged");
      c.moe.num_experts.push_back(static_cast<int>(v.get<long long>()));
    }
    c.moe.expert_interval = field("expert_interval");
    c.moe.topk = field("topk");
    if (!a.contains("mlp_type") || !a["mlp_type"].is_string())
      throw file_error(file, "has no valid architecture.mlp_type: the checkpoint is damaged");
    c.moe.residual = a["mlp_type"] == "residual";
  }
  if (a.contains("lora_rank")) {  // LoRA adapters
    c.lora.rank = field("lora_rank");
    if (!a.contains("lora_alpha") || !a["lora_alpha"].is_number() || !(a["lora_alpha"].get<double>() > 0) ||
        !a.contains("lora_targets") || !a["lora_targets"].is_string())
      throw file_error(file, "has no valid architecture.lora_alpha and lora_targets: the checkpoint is damaged");
    c.lora.alpha = a["lora_alpha"].get<double>();
    try {
      c.lora.targets = model::LoraConfig::parse_targets(a["lora_targets"].get<std::string>());
    } catch (const Error&) {
      throw file_error(file, "has an invalid architecture.lora_targets: the checkpoint is damaged");
    }
    if (a.contains("lora_modules_to_save")) {
      if (!a["lora_modules_to_save"].is_string())
        throw file_error(file, "has an invalid architecture.lora_modules_to_save: the checkpoint is damaged");
      try {
        c.lora.modules_to_save = model::LoraConfig::parse_modules(a["lora_modules_to_save"].get<std::string>());
      } catch (const Error&) {
        throw file_error(file, "has an invalid architecture.lora_modules_to_save: the checkpoint is damaged");
      }
    }
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw file_error(file, "has an impossible architecture: " + e.message());
  }
  return c;
}

CheckpointWeights read_checkpoint_weights(const std::string& path, bool adapters) {
  CheckpointWeights w;
  w.file = Checkpointer::resolve(path);
  if (w.file.empty()) throw file_error(path, "no checkpoint here (no such file, or a directory without `latest`)");
  io::H5File f = io::H5File::open(w.file, io::H5File::Mode::read, MPI_COMM_SELF);
  w.stored = check_structure(f, w.file, &w.cfg);
  if (w.cfg.lora.enabled() != adapters)
    throw file_error(w.file, adapters ? "holds a whole model, not LoRA adapters"
                                      : "holds LoRA adapters (rank " + std::to_string(w.cfg.lora.rank) + " on " +
                                            w.cfg.lora.target_list() + "), not a whole model",
                     adapters ? "give the checkpoint of a --lora-rank run"
                              : "merge them into their base model first: hpct_ckpt merge-lora " + path +
                                    " DIR --base CKPT (or --base-hf DIR)");
  const ParamLayout layout = model::Gpt::layout_for(w.cfg).trained();
  w.params.resize(layout.numel());
  for (const auto& t : layout.tensors()) {  // whole tensors (T = 1): each checked as --load checks it
    const std::string ds = Checkpointer::dataset_name("model", t.name);
    f.read(ds, 0, w.params.data() + t.offset, t.numel);
    Checkpointer::check_checksum(f, ds, Checkpointer::checksum(w.params.data() + t.offset, 0, t.numel), w.file);
  }
  f.close();
  return w;
}

}  // namespace hpct::engine
