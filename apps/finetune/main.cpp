// finetune — trains a GPT from a model's weights: a pretraining run's checkpoint (--load, as
// Megatron's --finetune: iteration, optimizer and schedule start afresh) or GPT-2 weights in Hugging
// Face's layout (--load-hf), on prompt/response JSON lines (--data-path FILE.jsonl: the loss on the
// responses only) or a Megatron corpus (continued pretraining). pretrain_gpt's flags and engine:
// engine/pretrain_app.cpp; --eval-only evaluates and exits. docs/finetune.md.
#include "hpct/engine/loop/pretrain_app.hpp"

int main(int argc, char** argv) {
  return hpct::engine::pretrain_main("finetune", argc, argv, /*require_moe=*/false, /*finetune_app=*/true);
}
