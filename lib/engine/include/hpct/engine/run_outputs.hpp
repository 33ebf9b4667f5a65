// hpct/engine/run_outputs.hpp — the files a run will write, checked before it trains (issue 17:
// outputs found unwritable only after the work, and a --save directory of another run overwritten).
#pragma once
#include <string>

#include "hpct/engine/train_config.hpp"

namespace hpct::engine {

/// Local (rank 0). Throws config_error naming the flag when:
/// - --save names something that is not a directory, or a directory that cannot be created or
///   written;
/// - --save holds checkpoints (or a `latest`) and this run does not resume from that directory
///   (`loaded` is the checkpoint file this run loads, "" if none): its saves would overwrite them,
///   and --keep-last would delete them;
/// - --json or --metrics-file is in a directory that does not exist or cannot be written, or
///   names a directory.
/// Creates the --save directory (as the first save would).
void check_run_outputs(const TrainConfig& cfg, const std::string& loaded);

}  // namespace hpct::engine
