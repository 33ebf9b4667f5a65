// hpct/io/tfevents.hpp — TensorBoard event files, written without TensorFlow.
//
// An event file is a sequence of TFRecords: uint64 length (little endian), uint32 masked CRC-32C of
// those 8 bytes, the payload, uint32 masked CRC-32C of the payload. Each payload is a serialized
// tensorflow.Event protocol buffer; the few fields used here are encoded by hand with their public
// field numbers (tensorboard/compat/proto/event.proto, summary.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//             SessionLog session_log = 7; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
//   SessionLog { SessionStatus status = 1 (START = 1); string checkpoint_path = 2; string msg = 3; }
// TensorBoard reads every events.out.tfevents.* file of a directory in name order. A SessionLog
// START at step S makes it purge the scalars it has read with step >= S: a run resumed from a
// checkpoint at iteration R writes one at R+1, so the iterations a killed segment ran past its
// last checkpoint do not show twice.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace hpct::io {

/// CRC-32C (Castagnoli), as TFRecord uses: crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
/// TFRecord's masked form of a CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

/// One event file, opened for appending records. Not thread safe; one writer per job (rank 0).
class EventFileWriter {
 public:
  /// Creates DIR (and its parents) if needed and a new file
  /// DIR/events.out.tfevents.<unix seconds>.<host>.<pid>, starting with the file_version event.
  /// Throws hpct::Error naming the directory when it cannot.
  EventFileWriter(const std::string& dir, double wall_time);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// One Event with one Summary.Value (tag, simple_value) per pair, all at this step.
  void add_scalars(const std::vector<std::pair<std::string, float>>& values, long long step, double wall_time);
  /// SessionLog START at this step (TensorBoard purges what it read at steps >= step).
  void session_start(long long step, double wall_time, const std::string& msg);
  /// Writes buffered records to the file (records are whole at every flush).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace hpct::io
