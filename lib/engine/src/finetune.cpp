// Starting a run from a model's weights (see finetune.hpp).
#include "hpct/engine/finetune.hpp"

#include <iostream>

#include "hpct/core/error.hpp"
#include "hpct/engine/checkpoint_state.hpp"
#include "hpct/engine/checkpointer.hpp"
#include "hpct/engine/hf_gpt2.hpp"

namespace hpct::engine {

StartWeights plan_start(TrainConfig& cfg, const comm::Communicator& world) {
  if (!cfg.finetune && cfg.load_hf.empty()) return {};
  if (cfg.finetune && !cfg.load_hf.empty())
    throw config_error("--load-hf", "--load-hf and --finetune both name the weights to start from", "give one of them");
  if (cfg.finetune && cfg.load_path.empty())
    throw config_error("--finetune", "--finetune starts from --load's weights, but no --load is given",
                       "give --load DIR (a pretraining run's checkpoint), or --load-hf DIR for GPT-2 weights");
  // A requeued job finds its own checkpoint in --save: it resumes that, whole, instead of starting over.
  std::string own = world.rank() == 0 && !cfg.save_dir.empty() ? Checkpointer::resolve(cfg.save_dir) : std::string();
  world.bcast_string(own, 0);
  if (!own.empty()) {
    if (world.rank() == 0)
      std::cout << "> " << own << " exists: resuming this run from it (not from "
                << (cfg.load_hf.empty() ? cfg.load_path : cfg.load_hf) << ")" << std::endl;
    cfg.load_path = cfg.save_dir;
    return {};
  }
  StartWeights s{cfg.load_hf.empty() ? cfg.load_path : cfg.load_hf, !cfg.load_hf.empty()};
  cfg.load_path.clear();
  return s;
}

namespace {

void same(const char* flag, long long ours, const std::string& file, const char* what, long long theirs) {
  if (ours != theirs)
    throw config_error(flag, std::string(flag) + " is " + std::to_string(ours) + " but " + file + " has " + what + " " +
                                 std::to_string(theirs),
                       "give the flags of the model the weights belong to");
}

}  // namespace

std::string load_start_weights(Trainer& t, const TrainConfig& cfg, const StartWeights& s, const comm::Communicator& world) {
  if (s.from.empty()) return "";
  std::string file;
  std::vector<float> params;
  comm::throw_if_any(world, comm::error_text_of([&] {
    model::GptConfig mc;
    if (s.hf) {
      HfGpt2 hf = read_hf_gpt2(s.from, cfg.model.vocab_multiple);
      file = hf.file;
      mc = hf.cfg;
      params = std::move(hf.params);
    } else {
      CheckpointWeights w = read_checkpoint_weights(s.from);
      file = w.file;
      mc = w.cfg;
      params = std::move(w.params);
    }
    if (mc.moe.enabled(mc.num_layers) || cfg.model.moe.enabled(cfg.model.num_layers))
      throw config_error("--num-experts", "starting from given weights is for dense models here (no MoE yet)");
    same("--num-layers", cfg.model.num_layers, file, "layers", mc.num_layers);
    same("--hidden-size", cfg.model.hidden_size, file, "hidden size", mc.hidden_size);
    same("--num-attention-heads", cfg.model.num_heads, file, "heads", mc.num_heads);
    same("--seq-length", cfg.model.max_seq_length, file, "positions (--max-position-embeddings apart from --seq-length: not yet)",
         mc.max_seq_length);
    same("--vocab-file", cfg.model.padded_vocab(), file, "a padded vocabulary of", mc.padded_vocab());
  }));
  t.load_weights(params);
  if (world.rank() == 0)
    std::cout << "> starting from the weights of " << file << (s.hf ? " (Hugging Face GPT-2)" : " (--finetune)")
              << ": iteration 0, fresh optimizer and learning-rate schedule" << std::endl;
  return file;
}

}  // namespace hpct::engine
