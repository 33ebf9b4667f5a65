// ds_config.json -> TrainConfig: DeepSpeed's keys, each checked against the flag that sets the same
// value (they must agree), with errors that name the file and the key. See docs/configuration.md.
#include <algorithm>
#include <climits>
#include <optional>
#include <sstream>
#include <tuple>

#include "flag_parse.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/json_config.hpp"
#include "hpct/engine/config/train_config.hpp"

namespace hpct::engine {
using namespace detail;

void apply_ds_config(const std::string& path, TrainConfig& cfg, const std::vector<std::string>& flags_given) {
  nlohmann::json j = JsonSection::load_file(path);
  JsonSection root(j, path);
  root.collect_unknown();  // every unknown key of the file in one error, at the end
  auto flag_given = [&](const char* f) { return std::find(flags_given.begin(), flags_given.end(), f) != flags_given.end(); };
  // A value given as a flag and in the file must agree; otherwise the file fills it in.
  // An int field from the file: in range, never wrapped (4294967300 is not 4).
  auto i32 = [&](long long v, const std::string& key, long long min) {
    if (v < min || v > INT_MAX)
      throw Error("'" + key + "' = " + std::to_string(v) + " is out of range (" + std::to_string(min) + " to " +
                      std::to_string(INT_MAX) + ")", Error::Context{path, key, ""});
    return static_cast<int>(v);
  };
  auto merge_int = [&](std::optional<long long> v, int& field, const char* flag, const std::string& key) {
    if (!v) return;
    if (*v <= 0) throw Error("'" + key + "' must be positive", Error::Context{path, key, ""});
    i32(*v, key, 1);
    if (flag_given(flag) && field != *v)
      throw Error("'" + key + "' = " + std::to_string(*v) + " disagrees with " + flag + " " + std::to_string(field),
                  Error::Context{path, key, "give the value once, or make both agree"});
    field = (int)*v;
  };
  // DeepSpeed's rule for batch sizes, applied to every value a flag also sets: a flag given on the
  // command line and the file's value must agree (compared before the file's value is taken).
  auto agree = [&](std::optional<double> v, double field, const char* flag, const std::string& key) {
    if (v && flag_given(flag) && *v != field) {
      std::ostringstream a, b;
      a << *v;
      b << field;
      throw Error("'" + key + "' = " + a.str() + " disagrees with " + flag + " " + b.str(),
                  Error::Context{path, key, "give the value once, or make both agree"});
    }
    return v;
  };
  auto agree_int = [&](std::optional<long long> v, double field, const char* flag, const std::string& key) {
    if (v) agree(double(*v), field, flag, key);
    return v;
  };
  merge_int(root.get_int("train_batch_size"), cfg.global_batch, "--global-batch-size", "train_batch_size");
  merge_int(root.get_int("train_micro_batch_size_per_gpu"), cfg.micro_batch, "--micro-batch-size",
            "train_micro_batch_size_per_gpu");
  if (auto v = root.get_int("gradient_accumulation_steps")) {
    if (*v <= 0) throw Error("'gradient_accumulation_steps' must be positive", Error::Context{path, "gradient_accumulation_steps", ""});
    cfg.grad_accum = i32(*v, "gradient_accumulation_steps", 1);
  }
  if (auto v = agree(root.get_number("gradient_clipping"), cfg.clip_grad, "--clip-grad", "gradient_clipping")) cfg.clip_grad = *v;
  if (auto v = root.get_int("steps_per_print")) {
    agree(double(*v), cfg.log_interval, "--log-interval", "steps_per_print");
    cfg.log_interval = i32(*v, "steps_per_print", 1);
  }
  apply_ds_monitors(root, cfg);  // wall_clock_breakdown, tensorboard, csv_monitor
  apply_ds_data_efficiency(root, j, cfg.curriculum, cfg.random_ltd, cfg.metric_curricula);  // curriculum_learning, data_efficiency
  apply_ds_runtime_sections(root, j, cfg);
  // A section this version does not read is accepted when it is switched off, as the recipes'
  // templates write them (flops_profiler, wandb, comms_logger, compression_training, ...).
  static const char* const read_here[] = {"fp16", "bf16", "bfloat16", "zero_optimization", "optimizer", "scheduler", "aio",
                                          "tensorboard", "csv_monitor", "curriculum_learning", "data_efficiency"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.value().is_object() && it.value().contains("enabled") && it.value()["enabled"] == false &&
        std::none_of(std::begin(read_here), std::end(read_here), [&](const char* k) { return it.key() == k; }))
      root.ignore(it.key());
  root.ignore("dataloader_drop_last");  // batches are always whole: the sampler never makes a short one
  root.ignore("zero_allow_untested_optimizer");
  root.ignore("prescale_gradients");
  if (root.has("optimizer")) {
    JsonSection opt = root.section("optimizer");
    std::string type = opt.get_string("type").value_or("");
    std::string lower = type;
    std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
    if (lower != "adam" && lower != "adamw")
      throw Error("optimizer type '" + type + "' is not supported", Error::Context{path, "optimizer.type", "use Adam or AdamW"});
    JsonSection p = opt.section("params");
    if (auto v = agree(p.get_number("lr"), cfg.lr, "--lr", "optimizer.params.lr")) cfg.lr = *v;
    if (p.has("betas")) {
      p.ignore("betas");
      // read betas by hand: it is a 2-array
      const auto& b = j["optimizer"]["params"]["betas"];
      if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number())
        throw Error("'optimizer.params.betas' must be an array of two numbers", Error::Context{path, "optimizer.params.betas", ""});
      cfg.beta1 = *agree(b[0].get<double>(), cfg.beta1, "--adam-beta1", "optimizer.params.betas[0]");
      cfg.beta2 = *agree(b[1].get<double>(), cfg.beta2, "--adam-beta2", "optimizer.params.betas[1]");
    }
    if (auto v = agree(p.get_number("eps"), cfg.eps, "--adam-eps", "optimizer.params.eps")) cfg.eps = *v;
    if (auto v = agree(p.get_number("weight_decay"), cfg.weight_decay, "--weight-decay", "optimizer.params.weight_decay")) cfg.weight_decay = *v;
    if (auto v = p.get_bool("adam_w_mode"); v && !*v)
      throw Error("adam_w_mode false (L2-coupled Adam) is not supported", Error::Context{path, "optimizer.params.adam_w_mode", "use AdamW"});
    if (auto v = p.get_number("max_grad_norm"); v && *v > 0) cfg.clip_grad = *agree(v, cfg.clip_grad, "--clip-grad", "optimizer.params.max_grad_norm");  // DS moves it to gradient_clipping
    p.ignore("torch_adam");
    p.finish();
    opt.finish();
  }
  if (root.has("scheduler")) {
    JsonSection s = root.section("scheduler");
    std::string type = s.get_string("type").value_or("");
    JsonSection p = s.section("params");
    auto wtype = [&] {
      auto t = p.get_string("warmup_type").value_or("log");
      if (t != "log" && t != "linear")
        throw Error("warmup_type must be log or linear", Error::Context{path, "scheduler.params.warmup_type", ""});
      cfg.ds_warmup_log = (t == "log");
    };
    if (type == "WarmupLR" || type == "WarmupDecayLR") {
      cfg.lr_style = type == "WarmupLR" ? LrStyle::ds_warmup : LrStyle::ds_warmup_decay;
      cfg.ds_warmup_min_lr = p.get_number("warmup_min_lr").value_or(0.0);
      cfg.ds_warmup_max_lr = agree(p.get_number("warmup_max_lr"), cfg.lr, "--lr", "scheduler.params.warmup_max_lr").value_or(0.001);
      cfg.lr_warmup_iters = agree_int(p.get_int("warmup_num_steps"), cfg.lr_warmup_iters, "--lr-warmup-iters", "scheduler.params.warmup_num_steps").value_or(1000);
      wtype();
      if (type == "WarmupDecayLR") {
        auto t = p.get_int("total_num_steps");
        if (!t) throw Error("WarmupDecayLR needs total_num_steps", Error::Context{path, "scheduler.params.total_num_steps", ""});
        cfg.lr_decay_iters = *agree_int(t, cfg.lr_decay_iters, "--lr-decay-iters", "scheduler.params.total_num_steps");
      }
      cfg.lr = cfg.ds_warmup_max_lr;
    } else if (type == "WarmupCosineLR") {
      cfg.lr_style = LrStyle::ds_warmup_cosine;
      auto t = p.get_int("total_num_steps");
      if (!t) throw Error("WarmupCosineLR needs total_num_steps", Error::Context{path, "scheduler.params.total_num_steps", ""});
      cfg.lr_decay_iters = *agree_int(t, cfg.lr_decay_iters, "--lr-decay-iters", "scheduler.params.total_num_steps");
      cfg.ds_warmup_min_ratio = p.get_number("warmup_min_ratio").value_or(0.0);
      cfg.ds_cos_min_ratio = p.get_number("cos_min_ratio").value_or(0.0001);
      cfg.lr_warmup_iters = agree_int(p.get_int("warmup_num_steps"), cfg.lr_warmup_iters, "--lr-warmup-iters", "scheduler.params.warmup_num_steps").value_or(1000);
      wtype();
    } else {
      throw Error("scheduler type '" + type + "' is not supported", Error::Context{path, "scheduler.type",
                  "use WarmupLR, WarmupDecayLR or WarmupCosineLR"});
    }
    p.finish();
    s.finish();
  }
  bool fp16 = false, bf16 = false;
  if (root.has("fp16")) {
    JsonSection f = root.section("fp16");
    fp16 = f.get_bool("enabled").value_or(false);
    LossScaleConfig& ls = cfg.loss_scale;
    if (auto v = agree(f.get_number("loss_scale"), ls.static_scale, "--loss-scale", "fp16.loss_scale")) ls.static_scale = *v;
    if (auto v = agree_int(f.get_int("initial_scale_power"), ls.initial_scale_power, "--initial-loss-scale", "fp16.initial_scale_power (log2)"))
      ls.initial_scale_power = i32(*v, "fp16.initial_scale_power", 0);
    if (auto v = agree_int(f.get_int("loss_scale_window"), ls.window, "--loss-scale-window", "fp16.loss_scale_window"))
      ls.window = i32(*v, "fp16.loss_scale_window", 1);
    if (auto v = agree_int(f.get_int("hysteresis"), ls.hysteresis, "--hysteresis", "fp16.hysteresis")) ls.hysteresis = i32(*v, "fp16.hysteresis", 1);
    if (auto v = agree(f.get_number("min_loss_scale"), ls.min_scale, "--min-loss-scale", "fp16.min_loss_scale")) ls.min_scale = *v;
    f.ignore("auto_cast");
    f.ignore("consecutive_hysteresis");
    f.finish();
  }
  for (const char* key : {"bf16", "bfloat16"}) {
    if (root.has(key)) {
      JsonSection b = root.section(key);
      bf16 = bf16 || b.get_bool("enabled").value_or(false);
      b.ignore("immediate_grad_update");
      b.finish();
    } else {
      root.ignore(key);
    }
  }
  if (fp16 && bf16) throw Error("fp16 and bf16 are both enabled", Error::Context{path, "fp16.enabled", "enable one"});
  // The precision flags against the file: what the file enables (or explicitly disables) must be the flag's.
  for (auto [flag, mode, key, on] : {std::tuple<const char*, PrecisionMode, const char*, bool>{"--fp16", PrecisionMode::fp16, "fp16", fp16},
                                     {"--bf16", PrecisionMode::bf16, "bf16", bf16}}) {
    if (!flag_given(flag)) continue;
    const bool other = mode == PrecisionMode::fp16 ? bf16 : fp16;
    const bool off = root.has(key) && !on && j[key].is_object() && j[key].contains("enabled");
    if (other || off)
      throw Error(std::string(other ? (mode == PrecisionMode::fp16 ? "bf16" : "fp16") : key) + ".enabled = " + (other ? "true" : "false") +
                      " disagrees with " + flag,
                  Error::Context{path, std::string(other ? (mode == PrecisionMode::fp16 ? "bf16" : "fp16") : key) + ".enabled",
                                 "give the precision once, or make both agree"});
  }
  if (fp16) cfg.precision = PrecisionMode::fp16;
  if (bf16) cfg.precision = PrecisionMode::bf16;
  // Gradient reductions: in the training dtype (DeepSpeed's default) or in fp32.
  if (auto v = root.get_string("communication_data_type")) {
    const std::string train = cfg.precision == PrecisionMode::bf16 ? "bf16" : cfg.precision == PrecisionMode::fp16 ? "fp16" : "fp32";
    if (*v != "fp32" && *v != train && !(*v == "bfp16" && train == "bf16"))
      throw Error("communication_data_type '" + *v + "' with " + train + " training is not supported",
                  Error::Context{path, "communication_data_type", "use \"" + train + "\" (the default) or \"fp32\""});
    cfg.zero.fp32_communication = *v == "fp32";
  }
  if (root.has("aio")) {
    JsonSection a = root.section("aio");
    cfg.zero.aio = io::AioConfig::from_json(a);
  }
  if (root.has("zero_optimization")) {
    JsonSection z = root.section("zero_optimization");
    if (auto v = z.get_int("stage")) {
      if (flag_given("--zero-stage") && cfg.zero.stage != *v)
        throw Error("'zero_optimization.stage' = " + std::to_string(*v) + " disagrees with --zero-stage " +
                        std::to_string(cfg.zero.stage),
                    Error::Context{path, "zero_optimization.stage", "give the value once, or make both agree"});
      cfg.zero.stage = i32(*v, "zero_optimization.stage", 0);
    }
    if (auto v = z.get_number("reduce_bucket_size")) cfg.zero.reduce_bucket_size = *v;
    if (auto v = z.get_bool("overlap_comm")) cfg.zero.overlap_comm = *v;
    if (auto v = z.get_number("allgather_bucket_size")) cfg.zero.allgather_bucket_size = *v;
    if (auto v = z.get_number("stage3_prefetch_bucket_size")) cfg.zero.prefetch_bucket_size = *v;
    if (auto v = z.get_number("stage3_param_persistence_threshold")) cfg.zero.param_persistence_threshold = *v;
    if (auto v = z.get_number("stage3_max_live_parameters")) cfg.zero.max_live_parameters = *v;
    // What these choose is how we always work: reduce-scatter and all-gather, contiguous buffers.
    for (const char* k : {"contiguous_gradients", "reduce_scatter", "allgather_partitions",
                          "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save"})
      z.ignore(k);
    if (auto v = z.get_bool("round_robin_gradients"); v && *v)
      cfg.notes.push_back("ds_config zero_optimization.round_robin_gradients has no effect here: each rank's gradient "
                          "shard is reduced block by block as the backward completes it");
    if (auto v = z.get_number("sub_group_size")) cfg.zero.sub_group_size = *v;
    for (const char* k : {"offload_optimizer", "offload_param"}) {
      if (!z.has(k)) continue;
      JsonSection o = z.section(k);
      parallel::OffloadConfig& oc = std::string(k) == "offload_optimizer" ? cfg.zero.offload_optimizer : cfg.zero.offload_param;
      if (auto v = o.get_string("device")) oc.device = *v;
      if (auto v = o.get_string("nvme_path")) oc.nvme_path = *v;
      if (auto v = o.get_bool("pin_memory")) oc.pin_memory = *v;
      if (auto v = o.get_int("buffer_count")) oc.buffer_count = i32(*v, std::string("zero_optimization.") + k + ".buffer_count", 2);
      // The swap pipeline always reads ahead and writes behind (pipeline_read/write on); tiles are
      // sized by sub_group_size; the rest has no effect here.
      for (const char* ok : {"buffer_size", "max_in_cpu", "pipeline_read", "pipeline_write", "fast_init"}) o.ignore(ok);
      if (auto r = o.get_number("ratio"); r && *r != 1.0)
        throw Error(std::string("zero_optimization.") + k + ".ratio " + std::to_string(*r) + " (partial offload) is not supported",
                    Error::Context{path, std::string("zero_optimization.") + k + ".ratio", "use 1.0"});
      o.finish();
    }
    z.finish();
  }
  root.finish();
  root.throw_unknown();
}

}  // namespace hpct::engine
