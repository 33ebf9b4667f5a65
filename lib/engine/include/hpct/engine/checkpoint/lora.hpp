// hpct/engine/checkpoint/lora.hpp — folding a LoRA run's adapters into its base model (hpct_ckpt merge-lora).
//
// A --lora-rank run's checkpoints hold its adapters only (model/gpt.hpp, LoraConfig); generate,
// export and --finetune want a whole model. merge_lora writes W + (alpha / rank) B A into each
// adapted linear's weight of the base, the model the adapted one computes (test_lora checks the
// adapted model against this merge). Local, arithmetic in double per element, no MPI.
#pragma once
#include <string>
#include <vector>

#include "hpct/model/gpt.hpp"

namespace hpct::engine {

/// adapters: the LoRA run's stored tensors (Gpt::layout_for(lora).trained() order); base: the base
/// model's weights (Gpt::layout_for(base_cfg) order), updated in place. Throws config_error naming
/// `base_flag` when the base's shape differs from the adapters' (layers, hidden, heads), with both.
void merge_lora(const model::GptConfig& lora, const std::vector<float>& adapters, const model::GptConfig& base_cfg,
                std::vector<float>& base, const std::string& base_flag);

}  // namespace hpct::engine
