// pretrain_gpt — trains a GPT model over MPI ranks (data parallel, ZeRO, and MoE layers when
// --num-experts is given), Megatron-DeepSpeed style. The body is engine/pretrain_app.cpp, shared
// with pretrain_moe.
#include "hpct/engine/loop/pretrain_app.hpp"

int main(int argc, char** argv) { return hpct::engine::pretrain_main("pretrain_gpt", argc, argv, /*require_moe=*/false); }
