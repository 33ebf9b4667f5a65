// hpct/engine/checkpoint/finetune.hpp — starting a run from a model's weights: Megatron's --finetune (--load's
// weights, with iteration, optimizer, schedule and seed starting afresh) and --load-hf (GPT-2
// weights in Hugging Face's layout, engine/hf_gpt2.hpp). Every app's engine path: pretrain_gpt
// takes these flags too; the finetune app implies --finetune.
#pragma once
#include <string>
#include <vector>

#include "hpct/comm/mpi.hpp"
#include "hpct/engine/config/train_config.hpp"
#include "hpct/engine/loop/trainer.hpp"

namespace hpct::engine {

struct StartWeights {
  std::string from;  // "" : no weights to start from (a fresh or resumed run)
  bool hf = false;   // from is --load-hf's, else a checkpoint (--finetune --load)
  bool with_optimizer = false;  // --finetune-resume-optimizer: the checkpoint's optimizer states too
  std::string file;  // the file the weights were read from
  std::vector<float> params;  // the whole model, in the layout of cfg.model (emptied by loading)
};

/// Collective; before the Trainer is built. With --finetune (and --load) or --load-hf: every rank
/// reads the weights to start from and checks their architecture against the run's flags (one line
/// naming the flag and both values); cfg.load_path is cleared so the trainer starts at iteration 0.
/// The position table comes with the weights: without --max-position-embeddings the run takes the
/// file's rows (GPT-2's 1024 at any --seq-length up to them). A run whose --save already holds a
/// checkpoint (a requeued job) resumes that instead: cfg.load_path = --save, and no start weights.
/// Throws config_error for --finetune without --load, or --load-hf with --finetune, or
/// --finetune-resume-optimizer without --finetune (or with --load-hf, which has no optimizer states).
StartWeights plan_start(TrainConfig& cfg, const comm::Communicator& world);

/// Hands the planned weights to the trainer (local; every rank holds them). Returns the file read.
std::string load_start_weights(Trainer& t, StartWeights& s, const comm::Communicator& world);

}  // namespace hpct::engine
