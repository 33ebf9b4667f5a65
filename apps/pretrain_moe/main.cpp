// pretrain_moe — trains a mixture-of-experts GPT (DeepSpeed-MoE / PR-MoE) with expert parallelism:
// pretrain_gpt's flags plus Megatron-DeepSpeed's MoE flags (--num-experts, --topk,
// --moe-expert-parallel-size, ...; docs/moe.md). One engine: engine/pretrain_app.cpp.
#include "hpct/engine/loop/pretrain_app.hpp"

int main(int argc, char** argv) { return hpct::engine::pretrain_main("pretrain_moe", argc, argv, /*require_moe=*/true); }
