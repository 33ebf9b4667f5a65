// hpct/engine/loop/pretrain_app.hpp — the whole of a pretraining app's main(), shared by pretrain_gpt and
// pretrain_moe so that their flags, banner, log lines, summary and exit codes are one code path.
// Exit codes: 0 done, 1 error (printed once when every rank agreed on it, else the job is aborted),
// 75 (kExitSavedOnSignal) saved on SIGUSR1/SIGTERM: requeue and resume with --load.
#pragma once

namespace hpct::engine {

/// Runs MPI (Environment), parses argv, trains, reports. require_moe: refuse a dense model
/// (pretrain_moe). finetune_app: start from --load's weights (implied --finetune) or --load-hf's.
int pretrain_main(const char* prog, int argc, char** argv, bool require_moe, bool finetune_app = false);

}  // namespace hpct::engine
