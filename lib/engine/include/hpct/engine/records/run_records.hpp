// hpct/engine/records/run_records.hpp — what a training run leaves behind besides its log: the JSON-lines
// metrics file, TensorBoard event files and CSV files (docs/run-records.md).
//
// A run may be several segments (a Slurm job requeued at its time limit resumes from its last
// checkpoint). Each segment appends to the same metrics file, starting with a "segment" record:
// where it resumed, the resolved configuration, version, git commit, hosts and parallel layout.
// Records of iterations after the checkpoint it resumed from (a killed segment ran past its last
// save) are moved to <metrics>.discarded, never silently overwritten, and the segment record says
// how many; so the file holds every iteration once, in order. TensorBoard gets a new event file
// per segment with a SessionLog START at the resumed iteration + 1 (TensorBoard then drops the
// stale steps itself); CSV files are trimmed like the metrics file.
//
// Only rank 0 writes; on other ranks every call is a no-op. Not thread safe.
#pragma once
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/engine/config/train_config.hpp"

namespace hpct::io {
class EventFileWriter;
}

namespace hpct::engine {

/// One TensorBoard / CSV scalar: a tag (Megatron's names, docs/run-records.md), its value, its step
/// (usually the iteration; "... vs samples" tags count consumed samples instead).
struct Scalar {
  std::string tag;
  double value;
  long long step;
};

/// Where a segment starts and what it runs on (the "segment" record and the summary's provenance).
struct SegmentInfo {
  std::string app;                 // pretrain_gpt, pretrain_moe, ...
  long long resumed_from = 0;      // the checkpoint's iteration (0: a fresh start)
  std::string checkpoint;          // the file loaded ("" for a fresh start)
  std::vector<std::string> hosts;  // one per rank, index = world rank
  nlohmann::json layout;           // world size and parallel degrees
  nlohmann::json config;           // config_to_json()
  // --skip-train: nothing is trimmed and no TensorBoard / CSV is written (a START there would hide
  // the training run's later steps); the metrics file must be new or empty.
  bool evaluation_only = false;
};

class RunRecorder {
 public:
  RunRecorder(const TrainConfig& cfg, bool root);
  ~RunRecorder();

  /// Trims what lies past info.resumed_from, writes the segment record, opens TensorBoard / CSV.
  void begin_segment(const SegmentInfo& info);
  /// Per-iteration scalars (TensorBoard and CSV only) of iteration it, kept every
  /// tensorboard_log_interval iterations.
  void iteration(long long it, const std::vector<Scalar>& scalars);
  /// A log-interval record ("train"), an evaluation ("eval"), the segment's summary ("summary"):
  /// one line of the metrics file each (stamped with "wall_time"), plus scalars for TensorBoard / CSV.
  void record(const nlohmann::json& rec, const std::vector<Scalar>& scalars = {});
  bool tensorboard() const { return events_ != nullptr; }
  /// Flushes everything written so far to the files.
  /// Records are a by-product of training: once the segment has begun, a write that fails (a full
  /// disk) stops that writer, with one warning on stderr, and training goes on; stopped() says which.
  void flush();
  /// One line per writer that stopped mid-run ("metrics file F: ..."), for the run's summary.
  const std::vector<std::string>& stopped() const { return stopped_; }
  /// The segment's provenance (the segment record without its trimming counts).
  const nlohmann::json& provenance() const { return provenance_; }

  const RunRecordsConfig& config() const { return cfg_; }

 private:
  void write_scalars(const std::vector<Scalar>& scalars);
  /// Closes a writer that failed mid-run and says so once.
  void stop(const std::string& what, const std::string& why);
  void trim_csv(long long resumed_from);
  RunRecordsConfig cfg_;
  std::string metrics_path_;
  bool root_;
  std::ofstream metrics_;
  std::unique_ptr<io::EventFileWriter> events_;
  std::map<std::string, std::unique_ptr<std::ofstream>> csv_;  // tag -> its file
  nlohmann::json provenance_;
  std::vector<std::string> stopped_;
  bool csv_stopped_ = false;  // a CSV write failed: no CSV file is written again
};

/// Moves the records of a JSON-lines metrics file that lie past iteration R (train/eval records
/// with a larger iteration, summaries of segments that ended after R, segment records resumed
/// from after R, and unreadable lines such as a half-written last line) to `discarded_path`
/// (appended), and rewrites the file atomically without them. Returns the number moved.
/// A missing file is empty. Throws hpct::Error naming the file on IO errors.
long long trim_metrics_file(const std::string& path, long long resumed_from, const std::string& discarded_path);

}  // namespace hpct::engine
