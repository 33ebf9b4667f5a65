// Starting a run from a model's weights (see finetune.hpp).
#include "hpct/engine/checkpoint/finetune.hpp"

#include <iostream>

#include "hpct/core/error.hpp"
#include "hpct/engine/checkpoint/checkpoint_state.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/engine/checkpoint/hf_gpt2.hpp"
#include "hpct/io/h5_file.hpp"

namespace hpct::engine {

namespace {

void same(const char* flag, long long ours, const std::string& file, const char* what, long long theirs) {
  if (ours != theirs)
    throw config_error(flag, std::string(flag) + " is " + std::to_string(ours) + " but " + file + " has " + what + " " +
                                 std::to_string(theirs),
                       "give the flags of the model the weights belong to");
}

// Reads the weights and fits the run's model to them: the shape flags must match; the position
// table is the file's unless --max-position-embeddings says otherwise.
void read_start(StartWeights& s, TrainConfig& cfg) {
  model::GptConfig mc;
  if (s.hf) {
    HfGpt2 hf = read_hf_gpt2(s.from, cfg.model.vocab_multiple);
    s.file = hf.file;
    mc = hf.cfg;
    s.params = std::move(hf.params);
  } else {
    CheckpointWeights w = read_checkpoint_weights(s.from);
    s.file = w.file;
    mc = w.cfg;
    s.params = std::move(w.params);
  }
  const std::string& file = s.file;
  same("--num-layers", cfg.model.num_layers, file, "layers", mc.num_layers);
  // MoE: the same experts on the same layers (the expert-parallel size, top-k and capacity are the
  // run's own: they do not change the weights).
  const auto experts = [](const model::GptConfig& m) {
    std::string list;
    for (int l = 0; l < m.num_layers; ++l) list += (list.empty() ? "" : " ") + std::to_string(m.moe.experts_of(l, m.num_layers));
    return list;
  };
  if (experts(cfg.model) != experts(mc))
    throw config_error("--num-experts", "experts per layer are " + experts(cfg.model) + " here but " + experts(mc) + " in " + file,
                       "give the --num-experts and --expert-interval of the model the weights belong to");
  if (cfg.model.moe.enabled(cfg.model.num_layers) && cfg.model.moe.residual != mc.moe.residual)
    throw config_error("--mlp-type", std::string("--mlp-type is ") + (cfg.model.moe.residual ? "residual" : "standard") +
                                         " but " + file + " holds a " + (mc.moe.residual ? "residual" : "standard") + " MoE",
                       "give the --mlp-type of the model the weights belong to");
  same("--hidden-size", cfg.model.hidden_size, file, "hidden size", mc.hidden_size);
  same("--num-attention-heads", cfg.model.num_heads, file, "heads", mc.num_heads);
  if (cfg.model.mlp != mc.mlp)
    throw config_error("--swiglu", std::string(cfg.model.mlp == model::MlpKind::swiglu ? "--swiglu is given" : "--swiglu is not given") +
                                       " but " + file + " holds " + (mc.mlp == model::MlpKind::swiglu ? "SwiGLU" : "GELU") + " MLPs",
                       "give the --swiglu of the model the weights belong to");
  if (cfg.model.linear_bias != mc.linear_bias)
    throw config_error("--disable-bias-linear", std::string(cfg.model.linear_bias ? "--disable-bias-linear is not given" : "--disable-bias-linear is given") +
                                                    " but " + file + "'s linears have " + (mc.linear_bias ? "biases" : "no biases"),
                       "give the --disable-bias-linear of the model the weights belong to");
  if (cfg.model.untie_embeddings != mc.untie_embeddings)
    throw config_error("--untie-embeddings-and-output-weights",
                       std::string(cfg.model.untie_embeddings ? "--untie-embeddings-and-output-weights is given"
                                                              : "--untie-embeddings-and-output-weights is not given") +
                           " but " + file + (mc.untie_embeddings ? " has an output layer of its own" : " ties its head to the embedding"),
                       "give the --untie-embeddings-and-output-weights of the model the weights belong to");
  if (cfg.model.rotary != mc.rotary || (mc.rotary && (cfg.model.rotary_percent != mc.rotary_percent ||
                                                      cfg.model.rope_theta != mc.rope_theta)))
    throw config_error("--use-rotary-position-embeddings",
                       "the positions here (" + std::string(cfg.model.rotary ? "rotary" : "learned") + ") are not " + file +
                           "'s (" + (mc.rotary ? "rotary, " + std::to_string(mc.rotary_dims()) + " channels, theta " +
                                                     std::to_string(mc.rope_theta)
                                               : std::string("learned")) + ")",
                       "give the --use-rotary-position-embeddings, --rotary-percent and --rope-theta of the model the "
                       "weights belong to");
  same("--num-key-value-heads", cfg.model.kv_heads(), file, "key/value heads", mc.kv_heads());
  same("--ffn-hidden-size", cfg.model.ffn(), file, "an MLP width of", mc.ffn());
  if (cfg.model.normalization != mc.normalization)
    throw config_error("--normalization", std::string("--normalization is ") + model::norm_name(cfg.model.normalization) +
                                              " but " + file + " holds " + model::norm_name(mc.normalization) + " norms",
                       "give the --normalization of the model the weights belong to");
  same("--vocab-file", cfg.model.padded_vocab(), file, "a padded vocabulary of", mc.padded_vocab());
  const int rows = mc.positions();
  if (cfg.model.max_position_embeddings > 0)
    same("--max-position-embeddings", cfg.model.max_position_embeddings, file, "a position table of", rows);
  if (cfg.model.max_seq_length > rows)
    throw config_error("--seq-length", "--seq-length " + std::to_string(cfg.model.max_seq_length) + " is longer than the " +
                                           std::to_string(rows) + " positions of " + file,
                       "give --seq-length <= " + std::to_string(rows));
  cfg.model.max_position_embeddings = rows;
}

}  // namespace

StartWeights plan_start(TrainConfig& cfg, const comm::Communicator& world) {
  if (cfg.finetune_resume_optimizer && !cfg.load_hf.empty())
    throw config_error("--finetune-resume-optimizer", "--finetune-resume-optimizer takes a checkpoint's optimizer states, and "
                                                      "--load-hf's Hugging Face weights have none",
                       "drop it (the optimizer starts fresh), or --finetune --load an hpctrain checkpoint");
  if (cfg.finetune_resume_optimizer && cfg.no_load_optim)
    throw config_error("--no-load-optim", "--no-load-optim and --finetune-resume-optimizer ask for opposite things",
                       "give one of them");
  if (cfg.finetune_resume_optimizer && !cfg.finetune)
    throw config_error("--finetune-resume-optimizer", "--finetune-resume-optimizer goes with --finetune (a plain --load resumes "
                                                      "everything already)",
                       "add --finetune (the finetune app implies it)");
  if (cfg.model.lora.enabled() && !cfg.finetune && cfg.load_hf.empty())
    throw config_error("--lora-rank", "LoRA adapts a base model, and none is given",
                       "give --finetune --load CKPT or --load-hf DIR (the finetune app: --load CKPT)");
  if (!cfg.finetune && cfg.load_hf.empty()) return {};
  if (cfg.finetune && !cfg.load_hf.empty())
    throw config_error("--load-hf", "--load-hf and --finetune both name the weights to start from", "give one of them");
  if (cfg.finetune && cfg.load_path.empty())
    throw config_error("--finetune", "--finetune starts from --load's weights, but no --load is given",
                       "give --load DIR (a pretraining run's checkpoint), or --load-hf DIR for GPT-2 weights");
  if (cfg.finetune_resume_optimizer && cfg.model.lora.enabled())
    throw config_error("--finetune-resume-optimizer", "with --lora-rank only the adapters train: the base model's optimizer "
                                                      "states have nothing to resume",
                       "drop --finetune-resume-optimizer");
  const std::string from = cfg.load_hf.empty() ? cfg.load_path : cfg.load_hf;
  // A requeued job finds its own checkpoint in --save: it resumes that, whole, instead of starting over.
  std::string own = world.rank() == 0 && !cfg.save_dir.empty() ? Checkpointer::resolve(cfg.save_dir) : std::string();
  world.bcast_string(own, 0);
  if (!own.empty()) {
    const bool lora = cfg.model.lora.enabled();
    if (world.rank() == 0)
      std::cout << "> " << own << " exists: resuming this run from it (" << (lora ? "its LoRA adapters on the base " : "not from ")
                << from << ")" << std::endl;
    cfg.load_path = cfg.save_dir;
    // Its position table is the one its start weights brought, which the command may not name.
    if (cfg.model.max_position_embeddings == 0) {
      int rows = 0;
      comm::throw_if_any(world, comm::error_text_of([&] {
        if (world.rank() != 0) return;
        io::H5File f = io::H5File::open(own, io::H5File::Mode::read, MPI_COMM_SELF);
        rows = gpt_config_of(read_stored_run(f, own).meta.architecture, own).positions();
      }));
      world.bcast_bytes(&rows, sizeof rows, 0);
      if (rows >= cfg.model.max_seq_length) cfg.model.max_position_embeddings = rows;
    }
    if (!lora) return {};
    // LoRA: the checkpoint holds the adapters only; the frozen base comes from the start weights again.
  }
  StartWeights s;
  s.from = from;
  s.hf = !cfg.load_hf.empty();
  s.with_optimizer = cfg.finetune_resume_optimizer;
  if (own.empty()) cfg.load_path.clear();
  comm::throw_if_any(world, comm::error_text_of([&] { read_start(s, cfg); }));
  return s;
}

std::string load_start_weights(Trainer& t, StartWeights& s, const comm::Communicator& world) {
  if (s.from.empty()) return "";
  if (s.with_optimizer) t.load_for_finetune(s.file);  // weights and optimizer states, at any layout
  else t.load_weights(s.params);
  s.params = std::vector<float>();
  if (world.rank() == 0)
    std::cout << "> starting from the weights of " << s.file << (s.hf ? " (Hugging Face GPT-2)" : " (--finetune)")
              << (s.with_optimizer ? ": iteration 0, the checkpoint's optimizer states, a fresh learning-rate schedule"
                                   : ": iteration 0, fresh optimizer and learning-rate schedule")
              << std::endl;
  return s.file;
}

}  // namespace hpct::engine
