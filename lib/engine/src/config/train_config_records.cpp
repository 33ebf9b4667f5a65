// Run-record flags and ds_config monitor blocks -> TrainConfig::records. See train_config.hpp.
#include <string>

#include "flag_parse.hpp"
#include "hpct/core/error.hpp"

namespace hpct::engine::detail {

void add_run_record_flags(FlagTable& t) {
  auto on = [](bool RunRecordsConfig::*field, bool value) {
    return [field, value](TrainConfig& c, const std::string&) { c.records.*field = value; };
  };
  t.insert({
      {"--tensorboard-dir", {true, [](TrainConfig& c, const std::string& v) { c.records.tensorboard_dir = v; }, "write TensorBoard event files here (rank 0; a resumed run appends a new file)"}},
      {"--tensorboard-log-interval", {true, [](TrainConfig& c, const std::string& v) { c.records.tensorboard_log_interval = to_i32("--tensorboard-log-interval", v, 1); }, "per-iteration TensorBoard scalars every N iterations (default 1)"}},
      {"--tensorboard-queue-size", {true, [](TrainConfig& c, const std::string& v) { c.records.tensorboard_queue_size = to_i32("--tensorboard-queue-size", v, 1); }, "accepted for Megatron scripts (events are flushed at every log interval)"}},
      {"--log-timers-to-tensorboard", {false, on(&RunRecordsConfig::log_timers, true), "TensorBoard: the per-phase timers and the iteration time"}},
      {"--log-batch-size-to-tensorboard", {false, on(&RunRecordsConfig::log_batch_size, true), "TensorBoard: the global batch size"}},
      {"--log-validation-ppl-to-tensorboard", {false, on(&RunRecordsConfig::log_validation_ppl, true), "TensorBoard: validation perplexity beside the validation loss"}},
      {"--log-memory-to-tensorboard", {false, on(&RunRecordsConfig::log_memory, true), "TensorBoard: peak resident memory (max over ranks)"}},
      {"--log-world-size-to-tensorboard", {false, on(&RunRecordsConfig::log_world_size, true), "TensorBoard: the number of ranks"}},
      {"--log-params-norm", {false, on(&RunRecordsConfig::log_params_norm, true), "the fp32 weights' L2 norm after the step on every log line (params norm), in the metrics file and TensorBoard (params-norm)"}},
      {"--log-num-zeros-in-grad", {false, on(&RunRecordsConfig::log_num_zeros, true), "how many elements of the reduced gradient are zero, every step: on the log line (num zeros), in the metrics file and TensorBoard (num-zeros)"}},
      {"--log-optimizer-states-to-tensorboard", {false, on(&RunRecordsConfig::log_optimizer_states, true), "TensorBoard: L2 norms of the weights and Adam's moments"}},
      {"--no-log-learnig-rate-to-tensorboard", {false, on(&RunRecordsConfig::log_learning_rate, false), "TensorBoard: no learning rate (Megatron's spelling)"}},
      {"--no-log-learning-rate-to-tensorboard", {false, on(&RunRecordsConfig::log_learning_rate, false), "TensorBoard: no learning rate"}},
      {"--no-log-loss-scale-to-tensorboard", {false, on(&RunRecordsConfig::log_loss_scale, false), "TensorBoard: no loss scale"}},
      {"--timing-log-level", {true, [](TrainConfig& c, const std::string& v) { c.records.timing_log_level = to_i32("--timing-log-level", v, 0); if (c.records.timing_log_level > 2) throw config_error("--timing-log-level", "--timing-log-level must be 0, 1 or 2, got " + v); }, "0: no timer line; 1: forward, backward, gradient reduction, optimizer, data, checkpoint; 2: + NVMe and parameter gathers"}},
      {"--timing-log-option", {true, [](TrainConfig& c, const std::string& v) { if (v != "max" && v != "minmax" && v != "all") throw config_error("--timing-log-option", "--timing-log-option must be max, minmax or all, got '" + v + "'"); c.records.timing_log_option = v; }, "timers over ranks: max, minmax (default) or all"}},
      {"--skip-train", {false, [](TrainConfig& c, const std::string&) { c.skip_train = true; }, "no training: load the checkpoint, evaluate on the validation split, write the summary, exit"}},
  });
}

void apply_ds_monitors(JsonSection& root, TrainConfig& cfg) {
  if (auto v = root.get_bool("wall_clock_breakdown"); v && *v && cfg.records.timing_log_level == 0) cfg.records.timing_log_level = 1;
  // DeepSpeed's monitors write under output_path/job_name ("" = the launch directory).
  auto monitor = [&](const char* key, std::string& dir) {
    if (!root.has(key)) return;
    JsonSection m = root.section(key);
    const bool enabled = m.get_bool("enabled").value_or(false);
    const std::string out = m.get_string("output_path").value_or("");
    const std::string job = m.get_string("job_name").value_or("DeepSpeedJobName");
    m.finish();
    if (!enabled) return;
    if (job.empty() || job.find('/') != std::string::npos)
      throw Error("'" + std::string(key) + ".job_name' must be a non-empty name without '/'",
                  Error::Context{m.file(), std::string(key) + ".job_name", ""});
    const std::string path = (out.empty() ? std::string(".") : out) + "/" + job;
    if (!dir.empty() && dir != path)
      throw Error("'" + std::string(key) + "' writes to " + path + ", which disagrees with " + dir,
                  Error::Context{m.file(), key, "give the directory once (--tensorboard-dir or the ds_config)"});
    dir = path;
  };
  monitor("tensorboard", cfg.records.tensorboard_dir);
  monitor("csv_monitor", cfg.records.csv_dir);
}

}  // namespace hpct::engine::detail
