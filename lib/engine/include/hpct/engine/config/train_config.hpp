// hpct/engine/config/train_config.hpp — everything a training run is told, as one typed struct.
//
// Filled from Megatron-style flags and/or a DeepSpeed ds_config.json (both write the same fields;
// a value given both ways must agree), then validate() checks it identically on every rank and
// names the offending flag or key. The library never sees argv: apps hand over the argument list.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/engine/data/batch_schedule.hpp"
#include "hpct/engine/data/curriculum.hpp"
#include "hpct/engine/data/data_sampling.hpp"
#include "hpct/io/tokenizer.hpp"
#include "hpct/model/gpt.hpp"
#include "hpct/parallel/zero.hpp"

namespace hpct::cli {
class Parser;
}

namespace hpct::engine {

enum class PrecisionMode { fp32, bf16, fp16 };
enum class LrStyle { constant, linear, cosine, inverse_square_root, ds_warmup, ds_warmup_decay, ds_warmup_cosine };

struct LossScaleConfig {
  double static_scale = 0;        // 0 = dynamic (DeepSpeed fp16.loss_scale)
  int initial_scale_power = 16;   // DeepSpeed default; Megatron's --initial-loss-scale is 2^32
  int window = 1000;              // overflow-free steps before the scale doubles
  int hysteresis = 2;             // overflows tolerated before the scale halves
  double min_scale = 1;
};

/// What a run records besides its log lines (docs/run-records.md): TensorBoard event files, CSV
/// files, and the per-phase timers. Megatron's flags; ds_config's tensorboard, csv_monitor and
/// wall_clock_breakdown map onto the same fields.
struct RunRecordsConfig {
  std::string tensorboard_dir;          // --tensorboard-dir (ds_config tensorboard: output_path/job_name)
  int tensorboard_log_interval = 1;     // per-iteration scalars every N iterations
  int tensorboard_queue_size = 1000;    // accepted; events are flushed at every log interval
  bool log_timers = false;              // --log-timers-to-tensorboard
  bool log_batch_size = false;          // --log-batch-size-to-tensorboard
  bool log_validation_ppl = false;      // --log-validation-ppl-to-tensorboard
  bool log_memory = false;              // --log-memory-to-tensorboard
  bool log_world_size = false;          // --log-world-size-to-tensorboard
  bool log_learning_rate = true;        // --no-log-learnig-rate-to-tensorboard turns it off (Megatron's spelling)
  bool log_loss_scale = true;           // --no-log-loss-scale-to-tensorboard
  bool log_optimizer_states = false;    // --log-optimizer-states-to-tensorboard: Adam moment norms
  bool log_params_norm = false;         // --log-params-norm: the weights' L2 norm on every log line
  bool log_num_zeros = false;           // --log-num-zeros-in-grad: zeros in the reduced gradient, every step
  std::string csv_dir;                  // ds_config csv_monitor: output_path/job_name
  int timing_log_level = 0;             // 0: no timer line; 1: phases; 2: + NVMe, gathers (--timing-log-level)
  std::string timing_log_option = "minmax";  // max | minmax | all (over ranks)
  bool enabled() const { return !tensorboard_dir.empty() || !csv_dir.empty(); }
};

struct TrainConfig {
  model::GptConfig model;
  // batch (DeepSpeed's triple; dp is the data-parallel size known at run time)
  int micro_batch = 0;
  int global_batch = 0;
  int grad_accum = 0;  // derived
  // schedule
  long long train_iters = 0;
  double lr = 0;
  double min_lr = 0;
  long long lr_warmup_iters = 0;
  long long lr_decay_iters = 0;  // 0 = train_iters
  // Megatron-DeepSpeed's token-based schedule (0: not given): warmup and decay by consumed tokens,
  // and a stop when --train-tokens are consumed (what sequence-length warmup is paired with).
  long long lr_warmup_tokens = 0, lr_decay_tokens = 0, train_tokens = 0;
  // Megatron's sample-based runs (train_config_compat.cpp): --train-samples sets train_iters =
  // samples / global batch, warmup and decay counted in samples ((step + 1) x global batch).
  long long train_samples = 0, lr_warmup_samples = 0, lr_decay_samples = 0;
  // --rampup-batch-size start increment samples (sample-based runs only; batch_schedule.hpp).
  BatchRampup rampup;
  double lr_warmup_fraction = -1;  // --lr-warmup-fraction (-1: not given): warmup = fraction x decay
  bool override_opt_param_scheduler = false;  // a resume may change the schedule flags (Megatron's flag)
  double exit_duration_mins = 0;   // --exit-duration-in-mins: save and stop after this long (0: never)
  LrStyle lr_style = LrStyle::linear;
  double ds_warmup_min_lr = 0, ds_warmup_max_lr = 0.001, ds_warmup_min_ratio = 0, ds_cos_min_ratio = 0.0001;
  bool ds_warmup_log = true;
  // optimizer
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01, clip_grad = 1.0;
  PrecisionMode precision = PrecisionMode::fp32;
  LossScaleConfig loss_scale;
  bool recompute_activations = false;
  bool distributed_optimizer = false;  // --use-distributed-optimizer: ZeRO stage >= 1
  bool communication_aware_checkpointing = false;  // TED's CAC: the recompute replays without communicating
  parallel::ZeroConfig zero;  // ds_config zero_optimization; stage also --zero-stage
  int moe_ep = 1;             // --moe-expert-parallel-size (the MoE architecture is model.moe)
  // --device: where the model computes. cuda = the node-local GPU (node-local rank modulo the GPUs
  // seen). There the ZeRO states and the optimizer step stay on the GPU (parallel::DeviceEngine),
  // unless zero_optimization.offload_optimizer puts them on the host (ZeRO-Offload: DeviceStore in
  // front of the host ZeroEngine); states_on_device() says which.
  std::string device = "cpu";
  // --attention-kernel: auto (cuDNN's fused kernel where it serves on the GPU, else the materialised
  // one), fused (required on the GPU: an error where it cannot serve) or plain (the materialised
  // kernel always). Megatron's --use-flash-attn (-v1, -v2, -triton) ask for fused; the CPU backend
  // has the materialised kernel only (a note says so). attention_kernel_flag: the flag that asked.
  std::string attention_kernel = "auto";
  std::string attention_kernel_flag;
  // Tests only: a CPU run routed through ZeRO-Offload's DeviceStore (the data flow of a cuda run,
  // with memcpys for the copies), so that path is checked where there is no GPU. Not a flag.
  bool via_device_store = false;
  // Tests only: a CPU run whose states live in the model backend's memory through DeviceEngine
  // (the engine of a resident cuda run), so it is checked where there is no GPU. Not a flag.
  bool via_device_engine = false;
  /// The states and the optimizer step live on the device (a cuda run without offload_optimizer),
  /// or the test hook routes a CPU run through the same engine.
  bool states_on_device() const {
    return (device == "cuda" && zero.offload_optimizer.device == "none") || via_device_engine;
  }
  // data
  // finetuning (train_config_finetune.cpp): start from weights only, prompt/response JSON lines
  bool finetune = false;          // --finetune: --load's weights only; iteration, optimizer, schedule start afresh
  bool no_load_optim = false;  // --no-load-optim: a resume with fresh Adam moments and loss scale
  bool no_save_optim = false;  // --no-save-optim: checkpoints hold the weights and run state, no Adam moments
  bool finetune_resume_optimizer = false;  // --finetune-resume-optimizer: --finetune, with the Adam moments and step count
  std::string load_hf;            // --load-hf: GPT-2 weights in Hugging Face's layout to start from
  std::string prompt_key = "prompt", response_key = "response";  // fields of a --data-path FILE.jsonl
  bool pack_examples = false;     // --pack-examples: several prompt/response examples per sample
  bool eod_mask_loss = false;     // --eod-mask-loss: no loss on targets whose input is end-of-document
  // --data-path PREFIX, or Megatron's blend w1 PREFIX1 w2 PREFIX2 ... (weights normalised; empty
  // when one prefix); --train/valid/test-data-path: blends per split instead of --split.
  std::vector<std::string> data_path;
  std::vector<double> data_weights;
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::vector<double> train_data_weights, valid_data_weights, test_data_weights;
  // the tokenizer: Megatron's --tokenizer-type, --vocab-file/--merge-file (GPT2BPETokenizer) or
  // --tokenizer-model (the SentencePiece and Hugging Face types)
  std::string tokenizer_type = "GPT2BPETokenizer", tokenizer_model;
  std::string vocab_file, merge_file, split = "969,30,1";
  io::TokenizerSpec tokenizer_spec() const { return {tokenizer_type, vocab_file, merge_file, tokenizer_model}; }
  bool mock_data = false;
  unsigned long long seed = 1234;
  // logging / eval
  int log_interval = 100;
  int eval_interval = 1000;
  int eval_iters = 100;
  std::string metrics_file;
  std::string json_summary;
  RunRecordsConfig records;
  // data efficiency: sequence-length warmup from the ds_config (curriculum.hpp)
  CurriculumConfig curriculum;
  bool curriculum_flag = false;  // --data-efficiency-curriculum-learning was given
  // random-LTD from the ds_config's data_efficiency.data_routing (random_ltd.hpp)
  RandomLtdConfig random_ltd;
  // curriculum by data metrics (data_sampling.hpp): each metric's index files and schedule, in name
  // order (empty: off); a sample is drawn once every metric allows it
  std::vector<MetricCurriculumConfig> metric_curricula;
  bool random_ltd_flag = false;  // --random-ltd was given
  bool skip_train = false;  // --skip-train: load, evaluate on the validation split, exit (Megatron)
  std::string ds_config_path;
  // checkpoints (Megatron's flags; see docs/checkpoints.md)
  std::string save_dir;        // --save DIR
  std::string load_path;       // --load DIR (its `latest`) or FILE
  long long save_interval = 0; // --save-interval N: save every N iterations (0: only at the end / on signal)
  long long exit_interval = 0; // --exit-interval N: save and stop after iteration N (Megatron)
  int keep_last = 0;           // --keep-last K: keep the newest K checkpoints (0: all)
  int optimizer_threads = 0;   // --optimizer-threads: host AdamW threads (0: kernels::optimizer_threads' default)
  // ZeRO-Offload on a device: the host AdamW runs beside the next step's forward at stages 0-2
  // (parallel::DeviceStore::update_behind; the same numbers).
  // --no-optimizer-overlap: the step waits for it.
  bool optimizer_overlap = true;
  bool async_save = false;     // --async-save: interval saves copy the state and write it on a background thread
  // --estimate-memory: print the ZeRO memory plan for a cluster shape and exit (docs/zero.md).
  // Sizes in GB (1e9 bytes); -1 = this machine (MemTotal, free disk); GPU memory 0 = ranks are host processes.
  struct MemoryEstimateFlags {
    bool enabled = false;
    int nodes = 1;
    int gpus_per_node = 2;
    double gpu_memory_gb = 0;
    double cpu_memory_gb = -1;
    double nvme_gb = -1;
  } estimate;
  bool vocab_size_given = false;
  // Flags accepted without effect (Megatron-DeepSpeed recipes pass them): one line each, printed at start.
  std::vector<std::string> notes;  // --vocab-size was given (the estimate otherwise assumes GPT-2's 50257)

  /// Every rank calls it with the same dp; throws config_error naming the flag or key.
  void finalize(int dp);
};

/// The resolved arguments as Megatron prints them at start: one "  name ..... value" line per
/// setting of config_to_json (the model's without their group prefix), sorted by name, between
/// Megatron's "arguments" rulers.
std::string arguments_text(const TrainConfig& cfg);
/// Parses Megatron-style flags (and --deepspeed_config FILE) into cfg. Unknown flags are errors.
/// Returns false if --help was asked (help text printed to stdout by the caller via help_text()).
/// Defaults that are Megatron's on its command line but not in TrainConfig{} (whose model trains
/// as a library call asks) are set first: --attention-dropout and --hidden-dropout 0.1.
bool parse_args(const std::vector<std::string>& args, TrainConfig& cfg);
/// The same with an app's own flags declared first on the same parser (core/cli.hpp: one error
/// names every problem of the line); a training flag of the same name is then the app's.
bool parse_args(const std::vector<std::string>& args, TrainConfig& cfg,
                const std::function<void(cli::Parser&)>& app_flags);
/// Applies a ds_config.json file: batch, optimizer, scheduler, fp16/bf16, gradient_clipping,
/// steps_per_print, zero_optimization. Unknown keys are errors naming the key.
void apply_ds_config(const std::string& path, TrainConfig& cfg, const std::vector<std::string>& flags_given);
std::string help_text(const std::string& prog);
/// The resolved config as JSON (stored in checkpoints; every field, after finalize()).
nlohmann::json config_to_json(const TrainConfig& cfg);

}  // namespace hpct::engine
