// Run records: the flags and ds_config blocks that configure them, the metrics file's trimming at
// a resume, and the CRC-32C of TensorBoard's record framing (the decoding itself is checked with
// python3-protobuf in tests/records).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "hpct/core/error.hpp"
#include "hpct/engine/records/run_records.hpp"
#include "hpct/engine/config/train_config.hpp"
#include "hpct/io/tfevents.hpp"

using namespace hpct;
using engine::TrainConfig;

namespace {
std::vector<std::string> base_args() {
  return {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "10", "--lr", "1e-3",
          "--mock-data", "--vocab-size", "100"};
}
std::string tmp(const std::string& name) { return ::testing::TempDir() + name; }
std::string write(const std::string& name, const std::string& text) {
  std::ofstream(tmp(name)) << text;
  return tmp(name);
}
std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
TrainConfig parsed(std::vector<std::string> more) {
  std::vector<std::string> a = base_args();
  a.insert(a.end(), more.begin(), more.end());
  TrainConfig c;
  engine::parse_args(a, c);
  return c;
}
std::string error_of(std::vector<std::string> more) {
  try {
    parsed(std::move(more));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(RunRecordFlags, MegatronTensorBoardFlags) {
  TrainConfig c = parsed({"--tensorboard-dir", "tb", "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard",
                          "--log-batch-size-to-tensorboard", "--log-validation-ppl-to-tensorboard",
                          "--log-optimizer-states-to-tensorboard", "--no-log-learnig-rate-to-tensorboard",
                          "--tensorboard-log-interval", "5"});
  EXPECT_EQ(c.records.tensorboard_dir, "tb");
  EXPECT_TRUE(c.records.log_timers && c.records.log_batch_size && c.records.log_validation_ppl && c.records.log_optimizer_states);
  EXPECT_FALSE(c.records.log_learning_rate);
  EXPECT_TRUE(c.records.log_loss_scale);
  EXPECT_EQ(c.records.tensorboard_log_interval, 5);
}

TEST(RunRecordFlags, BadValuesNameTheFlag) {
  EXPECT_NE(error_of({"--timing-log-level", "3"}).find("--timing-log-level must be 0, 1 or 2"), std::string::npos);
  EXPECT_NE(error_of({"--timing-log-option", "avg"}).find("--timing-log-option must be max, minmax or all"), std::string::npos);
  EXPECT_NE(error_of({"--tensorboard-log-interval", "0"}).find("--tensorboard-log-interval"), std::string::npos);
}

TEST(RunRecordFlags, DsConfigMonitorsMapOntoTheWriters) {
  const std::string ds = write("monitors.json",
                               R"({"train_batch_size": 8, "wall_clock_breakdown": true,
                                   "tensorboard": {"enabled": true, "output_path": "out/tb", "job_name": "gpt"},
                                   "csv_monitor": {"enabled": true, "output_path": "out/csv", "job_name": "gpt"}})");
  TrainConfig c = parsed({"--deepspeed_config", ds});
  EXPECT_EQ(c.records.tensorboard_dir, "out/tb/gpt");
  EXPECT_EQ(c.records.csv_dir, "out/csv/gpt");
  EXPECT_EQ(c.records.timing_log_level, 1);
  // Disabled monitors write nothing; a directory given twice must agree.
  const std::string off = write("monitors_off.json", R"({"tensorboard": {"enabled": false, "output_path": "x"}})");
  EXPECT_EQ(parsed({"--deepspeed_config", off}).records.tensorboard_dir, "");
  const std::string clash = write("monitors_clash.json", R"({"tensorboard": {"enabled": true, "output_path": "a", "job_name": "j"}})");
  const std::string e = error_of({"--tensorboard-dir", "b", "--deepspeed_config", clash});
  EXPECT_NE(e.find("disagrees with b"), std::string::npos) << e;
  EXPECT_NE(e.find("monitors_clash.json"), std::string::npos) << e;
  const std::string typo = write("monitors_typo.json", R"({"tensorboard": {"enabled": true, "outputpath": "a"}})");
  EXPECT_NE(error_of({"--deepspeed_config", typo}).find("tensorboard.outputpath"), std::string::npos);
}

TEST(MetricsFile, ResumeMovesWhatLiesPastTheCheckpoint) {
  const std::string m = tmp("trim.jsonl"), d = tmp("trim.jsonl.discarded");
  std::remove(d.c_str());
  write("trim.jsonl",
        "{\"type\":\"segment\",\"resumed_from_iteration\":0}\n"
        "{\"type\":\"train\",\"iteration\":1}\n{\"type\":\"train\",\"iteration\":2}\n"
        "{\"type\":\"eval\",\"iteration\":2}\n{\"type\":\"summary\",\"iterations\":2}\n"
        "{\"type\":\"segment\",\"resumed_from_iteration\":2}\n"
        "{\"type\":\"train\",\"iteration\":3}\n{\"type\":\"train\",\"iteration\":4}\n{\"type\":\"tr");  // killed mid-line
  EXPECT_EQ(engine::trim_metrics_file(m, 3, d), 2);  // iteration 4 and the torn line
  EXPECT_EQ(read(m),
            "{\"type\":\"segment\",\"resumed_from_iteration\":0}\n"
            "{\"type\":\"train\",\"iteration\":1}\n{\"type\":\"train\",\"iteration\":2}\n"
            "{\"type\":\"eval\",\"iteration\":2}\n{\"type\":\"summary\",\"iterations\":2}\n"
            "{\"type\":\"segment\",\"resumed_from_iteration\":2}\n{\"type\":\"train\",\"iteration\":3}\n");
  EXPECT_EQ(read(d), "{\"type\":\"train\",\"iteration\":4}\n{\"type\":\"tr\n");
  // Nothing past the checkpoint: the file is left alone. A fresh start (0) moves everything but nothing is lost.
  EXPECT_EQ(engine::trim_metrics_file(m, 3, d), 0);
  EXPECT_EQ(engine::trim_metrics_file(m, 0, d), 6);
  EXPECT_EQ(read(m), "{\"type\":\"segment\",\"resumed_from_iteration\":0}\n");
  EXPECT_EQ(engine::trim_metrics_file(tmp("no_such_metrics.jsonl"), 5, d), 0);
}

// A symbolic link planted at the .discarded name is not appended through (issue 47 item 12): the
// trim is refused, naming it, and the metrics file and the link's target are unchanged.
TEST(MetricsFile, ALinkAtTheDiscardedNameIsRefused) {
  const std::string m = write("linked.jsonl", "{\"type\":\"train\",\"iteration\":1}\n{\"type\":\"train\",\"iteration\":2}\n");
  const std::string victim = write("victim.txt", "untouched\n"), d = tmp("linked.jsonl.discarded");
  std::remove(d.c_str());
  ASSERT_EQ(::symlink(victim.c_str(), d.c_str()), 0);
  try {
    engine::trim_metrics_file(m, 1, d);
    ADD_FAILURE() << "appended through a symbolic link";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linked.jsonl.discarded"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read(victim), "untouched\n");
  EXPECT_EQ(read(m), "{\"type\":\"train\",\"iteration\":1}\n{\"type\":\"train\",\"iteration\":2}\n");
  std::remove(d.c_str());
}

TEST(MetricsFile, ALastLineWithoutNewlineIsClosed) {
  const std::string m = write("torn_ok.jsonl", "{\"type\":\"train\",\"iteration\":1}");
  EXPECT_EQ(engine::trim_metrics_file(m, 1, tmp("torn_ok.discarded")), 0);
  EXPECT_EQ(read(m), "{\"type\":\"train\",\"iteration\":1}\n");  // the next record starts on its own line
}

TEST(TfEvents, Crc32cOfTheStandardCheckString) {
  EXPECT_EQ(io::crc32c("123456789", 9), 0xE3069283u);
  const uint32_t c = io::crc32c("123456789", 9);
  EXPECT_EQ(io::masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
  // Incremental: the CRC of a concatenation continues from the first part's.
  EXPECT_EQ(io::crc32c("6789", 4, io::crc32c("12345", 5)), 0xE3069283u);
}
