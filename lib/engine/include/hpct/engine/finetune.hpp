// hpct/engine/finetune.hpp — starting a run from a model's weights: Megatron's --finetune (--load's
// weights, with iteration, optimizer, schedule and seed starting afresh) and --load-hf (GPT-2
// weights in Hugging Face's layout, engine/hf_gpt2.hpp). Every app's engine path: pretrain_gpt
// takes these flags too; the finetune app implies --finetune.
#pragma once
#include <string>

#include "hpct/comm/mpi.hpp"
#include "hpct/engine/train_config.hpp"
#include "hpct/engine/trainer.hpp"

namespace hpct::engine {

struct StartWeights {
  std::string from;  // "" : no weights to start from (a fresh or resumed run)
  bool hf = false;   // from is --load-hf's, else a checkpoint (--finetune --load)
};

/// Collective; before the Trainer is built. With --finetune (and --load) or --load-hf: the weights to
/// start from, and cfg.load_path cleared so the trainer starts at iteration 0. A run whose --save
/// already holds a checkpoint (a requeued job) resumes that instead: cfg.load_path = --save, and no
/// start weights. Throws config_error for --finetune without --load, or --load-hf with --finetune.
StartWeights plan_start(TrainConfig& cfg, const comm::Communicator& world);

/// Collective: every rank reads the weights, checks their architecture against the run's flags
/// (one line naming the flag and both values) and hands them to the trainer. Returns the file read.
std::string load_start_weights(Trainer& t, const TrainConfig& cfg, const StartWeights& s, const comm::Communicator& world);

}  // namespace hpct::engine
