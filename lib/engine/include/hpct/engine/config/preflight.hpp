// hpct/engine/config/preflight.hpp — what a run is checked for before it allocates or trains (issue 17):
// the files it will write (found unwritable only after the work before, and a --save directory of
// another run overwritten) and whether its model states fit the node's memory (a bare
// std::bad_alloc before).
#pragma once
#include <string>

#include "hpct/engine/config/train_config.hpp"

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

/// Local. Throws config_error naming `flag` when the file `file` could not be written later: it is
/// a directory, or its directory does not exist or cannot be written. "" passes.
void check_file_output(const std::string& file, const char* flag);

/// The newest checkpoint in directory `dir` ("latest" when only that file is there; "" when none,
/// or no such directory).
std::string checkpoints_in(const std::string& dir);

/// Local. For a tool that writes a new checkpoint at iteration 0 into `dir` (hpct_ckpt import,
/// merge-lora): throws config_error naming `what` when `dir` already holds checkpoints, whose
/// `latest` it would repoint (a requeued --load DIR --save DIR would then restart at iteration 0).
void require_no_checkpoints(const std::string& dir, const std::string& what);

/// Local. The ZeRO memory plan of this run (parallel/memory_estimate: model states and ZeRO's
/// working buffers per rank, for its stage, precision and offload; activations not counted) times
/// the ranks on this node (partitions over all world_size ranks), against the node's available memory (MemAvailable). Throws config_error
/// naming the flags and the figures when it cannot fit. No-op with --device cuda.
void check_host_memory(const TrainConfig& cfg, int ranks_on_node, int world_size);

/// What a device run's GPU must hold before its first step, and what it has (bytes).
struct DeviceNeed {
  std::string device;              // the backend's name ("cuda:0 (NVIDIA H100 ...)")
  uint64_t free = 0, total = 0;    // the GPU's memory now
  uint64_t activations = 0;        // one micro-batch's workspace (model::Gpt::workspace_bytes)
  uint64_t offload_states = 0;     // ZeRO-Offload: what its store keeps there (DeviceStore::device_bytes_needed)
};
/// Local, a device run (before the engines allocate): the model states the GPU holds
/// (GPU-resident: the ZeRO plan's device states for the stage, partitioned over world_size ranks;
/// ZeRO-Offload: need.offload_states) and the activations, against its free memory. A lower bound
/// (the ZeRO working buffers, the libraries' workspaces and the allocator's slack are not counted),
/// so what it refuses cannot run. Throws config_error naming the flags and the figures.
void check_device_memory(const TrainConfig& cfg, int world_size, const DeviceNeed& need);

}  // namespace hpct::engine
