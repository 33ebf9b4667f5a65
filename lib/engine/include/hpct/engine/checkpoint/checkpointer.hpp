// hpct/engine/checkpoint/checkpointer.hpp — parallel HDF5 checkpoints: one file per checkpoint, every logical
// tensor a dataset with its full shape, written by all ranks at once; atomic; verified on load.
//
// Layout of <save>/iter_0000050.h5:
//   /model/<tensor name with '.' -> '/'>        fp32 weights (the master copy)
//   /optimizer/exp_avg/<...>, /optimizer/exp_avg_sq/<...>   AdamW moments (absent after --no-save-optim,
//                                               with attribute optimizer_states = "none")
//   attributes on "/": format version, iteration, consumed samples, optimizer step, skipped
//   iterations, loss-scaler state, the resolved config (JSON), model architecture (JSON), tokenizer
//   identity, software version and git commit, the parallel layout it was written with, seed.
//   attribute "checksum" on every dataset: a sum over elements of mix(index, bits) mod 2^64 —
//   a function of the logical content only, so it is the same whatever the layout that wrote it.
//
// Atomic: the file is written as <name>.h5.tmp, flushed, closed, fsynced, renamed; then the
// `latest` pointer (a one-line text file, as Megatron's latest_checkpointed_iteration.txt) is
// replaced the same way; only then are checkpoints beyond --keep-last deleted. A crash at any
// point leaves the previous checkpoint and a `latest` that names a complete file.
//
// Universal: every rank writes the flat ranges it owns (its ZeRO slices; at stage 0 an equal slice
// of its replica) into the full-shape datasets, and on load reads the ranges it owns under the
// layout it runs with (the caller re-replicates), so any rank count and ZeRO stage loads any
// other's checkpoint. State offloaded to NVMe is staged piece by piece through the same path.
// Tensor parallelism: a rank's part of a tensor is a set of runs of the full dataset (ParamLayout's
// Partition); replicas are written by their primary copy's rank and read by every rank. Expert
// blocks are written by the ranks holding them. (Async save: begin_save / write_pieces / finish_save.)
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/core/param_layout.hpp"
#include "hpct/io/h5_file.hpp"
#include "hpct/parallel/zero.hpp"

namespace hpct::engine {

/// Everything besides tensors that the next step depends on.
struct TrainingState {
  long long iteration = 0;         // optimizer steps taken (including skipped ones)
  long long consumed_samples = 0;
  long long consumed_tokens = -1;  // -1: not stored (written before sequence-length warmup: samples x seq length)
  long long consumed_layer_tokens = -1;  // -1: not stored (a run without random-LTD: tokens x layers)
  long long adam_step = 0;
  long long adam_step_base = 0;    // --finetune-resume-optimizer: Adam steps the moments took before this run;
                                   // negative after --no-load-optim (the moments restarted -base steps in)
  long long skipped_iterations = 0;
  long long nan_iterations = 0;
  nlohmann::json loss_scaler;      // LossScaler::state()
  bool optimizer_saved = true;     // false: --no-save-optim, the file holds the model's weights only
                                   // (attribute optimizer_states = "none"; no /optimizer group)
};

/// What a checkpoint is written with and checked against on load.
struct CheckpointMeta {
  nlohmann::json config;        // resolved TrainConfig
  nlohmann::json architecture;  // GptConfig: a different one is refused
  std::string tokenizer;        // tokenizer_identity(vocab, merges), or "mock (vocab V)"
  nlohmann::json layout;        // {"world_size", "dp", "tp", "ep", "zero_stage"}
  unsigned long long seed = 0;
};

/// The tensors of a run, laid out by `layout`, as this rank's pieces of the flat state (its ZeRO
/// slices; at stage 0 an equal slice of a replica). The pieces of all ranks cover every element once.
/// visit(load, fn) calls fn on each piece in turn, in increasing flat order; its pointers are valid
/// during the call only, so state that lives on NVMe is staged one piece at a time. With load, fn
/// fills the piece and the owner keeps what it was given.
struct TensorSet {
  using PieceFn = std::function<void(const parallel::StatePiece&)>;
  const ParamLayout* layout = nullptr;
  std::function<void(bool load, const PieceFn& fn)> visit;
  /// A set over pieces already in memory.
  static TensorSet of(const ParamLayout& layout, std::vector<parallel::StatePiece> pieces);
};

/// Test-only fault injection (documented in docs/checkpoints.md): when the environment variable
/// HPCT_FAULT_CKPT="<rank>:<point>[:<iteration>]" is set, that rank SIGKILLs itself at <point> of
/// a save (of that iteration only, if given): "after_tensors" (data written, file not closed),
/// "before_rename", "before_latest" (the last two happen on rank 0).
class Checkpointer {
 public:
  Checkpointer(const comm::Communicator& world, std::string dir, int keep_last);

  /// Collective over world. Writes iter_<iteration>.h5 atomically, points `latest` at it, prunes.
  /// Returns the path written. Throws (on every rank) if any rank failed; the previous checkpoint
  /// and `latest` are then untouched and the partial file removed.
  std::string save(const TensorSet& t, const TrainingState& s, const CheckpointMeta& meta);

  /// The same save in three parts, for --async-save. begin_save (collective) creates the file, its
  /// metadata and space; write_pieces (local, any thread: no MPI, no HDF5) writes this rank's pieces
  /// straight to the datasets' bytes and syncs them; written() says it has returned; finish_save
  /// (collective, after every rank's write_pieces) stores the checksums, closes and publishes.
  struct PendingSave {
    long long iteration = 0;
    std::string final_path, tmp;
    const ParamLayout* layout = nullptr;
    io::H5File file;
    std::vector<uint64_t> offsets;  // (group, tensor) -> byte offset of the dataset's data
    std::vector<uint64_t> sums;     // (group, tensor) -> this rank's part of the checksum
    int groups = 3;                 // model, exp_avg, exp_avg_sq; 1 without optimizer states
    std::string error;              // the data phase's failure on this rank, if any
    std::atomic<bool> written{false};
  };
  std::unique_ptr<PendingSave> begin_save(const ParamLayout& layout, const TrainingState& s, const CheckpointMeta& meta);
  static void write_pieces(PendingSave& p, const TensorSet& t);
  static bool written(const PendingSave& p);
  std::string finish_save(PendingSave& p);

  /// The checkpoint file `path` names: a file, or a directory's `latest`. Empty when nothing is
  /// there or a directory holds no checkpoint (a fresh run). Throws for a `latest` that names a
  /// missing file or anything but a checkpoint file name (iter_NNNNNNN.h5, no path), and for a
  /// directory holding checkpoints without `latest`.
  static std::string resolve(const std::string& path);
  /// mkdir -p; throws naming the part that cannot be created.
  static void make_directory(const std::string& dir);
  /// The newest iter_NNNNNNN.h5 in dir (its name), "" if none.
  static std::string newest_checkpoint_in(const std::string& dir);

  /// Collective over world. Loads this rank's pieces and the state; checks architecture (first mismatching
  /// tensor named with both shapes) and every dataset's checksum (the tensor named). A file saved
  /// without optimizer states (--no-save-optim) leaves the pieces' moments as they are, and is
  /// refused in one line when need_moments (a resume that would continue Adam's moments).
  void load(const std::string& file, const TensorSet& t, TrainingState& s, const CheckpointMeta& meta,
            bool need_moments = true) const;

  /// Checksum of flat elements [begin, end) of a tensor whose first element has global index 0.
  static uint64_t checksum(const float* data, uint64_t begin, uint64_t end) { return checksum_at(data + begin, begin, end); }
  /// The same, with `first` pointing at element `begin`.
  static uint64_t checksum_at(const float* first, uint64_t begin, uint64_t end);
  /// Throws file_error naming the dataset when `sum` (checksum of every element) is not the one the
  /// file stores for it, or the file stores none: the one check of every load, whole or weights-only.
  static void check_checksum(const io::H5File& f, const std::string& dataset, uint64_t sum, const std::string& file);
  /// "/model/layers/3/attention/dense/weight" for "layers.3.attention.dense.weight".
  static std::string dataset_name(const std::string& group, const std::string& tensor);

 private:
  const comm::Communicator& world_;
  std::string dir_;
  int keep_last_;
};

/// File name for an iteration: iter_0000050.h5
std::string checkpoint_file_name(long long iteration);

}  // namespace hpct::engine
