// Megatron-DeepSpeed recipes' flags (train_config_compat.cpp, train_config_ds.cpp): every refused
// flag named in one error, no-op flags accepted with a note each, a flag and a ds_config value that
// disagree refused naming both, sample-based runs with Megatron's schedule (hand values).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "hpct/core/error.hpp"
#include "hpct/engine/loop/schedules.hpp"
#include "hpct/engine/config/train_config.hpp"

using namespace hpct;
using engine::TrainConfig;

namespace {

std::vector<std::string> base() {
  return {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3", "--mock-data", "--vocab-size", "100"};
}
std::vector<std::string> with(std::vector<std::string> a, std::initializer_list<std::string> more) {
  a.insert(a.end(), more);
  return a;
}
std::string error_of(const std::vector<std::string>& a, TrainConfig* out = nullptr) {
  TrainConfig c;
  try {
    engine::parse_args(a, c);
    c.finalize(2);
  } catch (const Error& e) {
    return e.what();
  }
  if (out) *out = c;
  return "";
}
std::string file(const std::string& name, const std::string& text) {
  const std::string p = ::testing::TempDir() + name;
  std::ofstream(p) << text;
  return p;
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(RecipeFlags, EveryUnknownOrRefusedFlagInOneError) {
  const std::string e = error_of(with(base(), {"--train-iters", "5", "--frobnicate", "3", "--pipeline-model-parallel-size", "2",
                                               "--no-such-switch", "--checkpoint-in-cpu", "--colour", "red"}));
  EXPECT_TRUE(has(e, "5 flags are not accepted")) << e;
  for (const char* f : {"'--frobnicate'", "--pipeline-model-parallel-size 2: pipeline parallelism is not implemented", "'--no-such-switch'",
                        "--checkpoint-in-cpu: moving recomputation checkpoints to CPU memory is not implemented", "'--colour'"})
    EXPECT_TRUE(has(e, f)) << f << " missing from: " << e;
  EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 0) << "one line";
  // One problem keeps its own key and hint.
  EXPECT_TRUE(has(error_of(with(base(), {"--train-iters", "5", "--tokenizer-type", "SentencePieceTokenizer"})),
                  "SentencePieceTokenizer needs --tokenizer-model"));
  EXPECT_TRUE(has(error_of(with(base(), {"--train-iters", "5", "--tokenizer-type", "BertWordPieceCase"})),
                  "'BertWordPieceCase' is a Megatron tokenizer not implemented here"));
}

TEST(RecipeFlags, NoOpFlagsAcceptedWithOneNoteEach) {
  TrainConfig c;
  const std::vector<std::string> noops = {"--num-workers", "0", "--data-impl", "mmap", "--distributed-backend", "nccl",
                                          "--tokenizer-type", "GPT2BPETokenizer", "--pipeline-model-parallel-size", "1",
                                          "--no-pipeline-parallel", "--no-async-tensor-model-parallel-allreduce",
                                          "--no-gradient-accumulation-fusion", "--use-flash-attn", "--override-opt_param-scheduler"};
  ASSERT_EQ(error_of(with(with(base(), {"--train-iters", "5"}), {}), nullptr), "");
  std::vector<std::string> a = with(base(), {"--train-iters", "5"});
  a.insert(a.end(), noops.begin(), noops.end());
  ASSERT_EQ(error_of(a, &c), "");
  EXPECT_EQ(c.notes.size(), 8u);  // --tokenizer-type GPT2BPETokenizer is a real choice now: no note
  for (const auto& n : c.notes) EXPECT_TRUE(has(n, "has no effect here: ")) << n;
  // Aliases of recomputation; dropout at any probability in [0, 1).
  EXPECT_EQ(error_of(with(base(), {"--train-iters", "5", "--deepspeed-activation-checkpointing"}), &c), "");
  EXPECT_TRUE(c.recompute_activations);
  EXPECT_EQ(error_of(with(base(), {"--train-iters", "5", "--recompute-granularity", "full", "--recompute-method", "uniform",
                                   "--recompute-num-layers", "1", "--hidden-dropout", "0", "--attention-dropout", "0.0"}), &c), "");
  EXPECT_TRUE(c.recompute_activations);
  EXPECT_EQ(c.model.hidden_dropout, 0.0);
  EXPECT_EQ(error_of(with(base(), {"--train-iters", "5", "--hidden-dropout", "0.1", "--attention-dropout", "0.2"}), &c), "");
  EXPECT_EQ(c.model.hidden_dropout, 0.1);
  EXPECT_EQ(c.model.attention_dropout, 0.2);
  EXPECT_TRUE(has(error_of(with(base(), {"--train-iters", "5", "--hidden-dropout", "1"})), "--hidden-dropout must be in [0, 1), got 1"));
  EXPECT_TRUE(has(error_of(with(base(), {"--train-iters", "5", "--attention-dropout", "-0.5"})), "--attention-dropout must be in [0, 1)"));
  EXPECT_EQ(error_of(with(base(), {"--train-iters", "5", "--num-workers", "3"})), "");  // any worker count
  EXPECT_TRUE(has(error_of(with(base(), {"--train-iters", "5", "--num-workers", "-1"})), "--num-workers -1 must be >= 0"));
}

TEST(RecipeFlags, FlagAndDsConfigMustAgree) {
  const std::vector<std::string> a = with(base(), {"--train-iters", "5", "--clip-grad", "1.0", "--log-interval", "10", "--fp16", "--hysteresis", "2"});
  auto run = [&](const std::string& json) { return error_of(with(a, {"--deepspeed_config", file("agree.json", json)})); };
  // The rebase recipes' own file agrees with their flags.
  EXPECT_EQ(run(R"({"train_batch_size": 8, "steps_per_print": 10, "gradient_clipping": 1.0, "prescale_gradients": false,
                    "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1,
                             "initial_scale_power": 11}, "wall_clock_breakdown": false})"), "");
  struct Case { const char* json; const char* want; };
  for (const Case& k : {Case{R"({"gradient_clipping": 0.5})", "'gradient_clipping' = 0.5 disagrees with --clip-grad 1"},
                        Case{R"({"steps_per_print": 1})", "'steps_per_print' = 1 disagrees with --log-interval 10"},
                        Case{R"({"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}})", "'optimizer.params.lr' = 0.0003 disagrees with --lr 0.001"},
                        Case{R"({"bf16": {"enabled": true}})", "bf16.enabled = true disagrees with --fp16"},
                        Case{R"({"fp16": {"enabled": false}})", "fp16.enabled = false disagrees with --fp16"},
                        Case{R"({"fp16": {"enabled": true, "hysteresis": 4}})", "'fp16.hysteresis' = 4 disagrees with --hysteresis 2"}}) {
    const std::string e = run(k.json);
    EXPECT_TRUE(has(e, k.want)) << k.json << " -> " << e;
    EXPECT_TRUE(has(e, "agree.json")) << e;
  }
  EXPECT_TRUE(has(error_of(with(base(), {"--train-iters", "5", "--bf16", "--fp16"})), "--bf16 and --fp16 are both given"));
}

TEST(RecipeFlags, SectionsThatAreOffAreAccepted) {
  const std::string p = file("off.json", R"({"train_batch_size": 8, "curriculum_learning": {"enabled": false},
      "data_efficiency": {"enabled": false}, "flops_profiler": {"enabled": false}, "wandb": {"enabled": false},
      "comms_logger": {"enabled": false}, "compression_training": {"enabled": false}})");
  EXPECT_EQ(error_of(with(base(), {"--train-iters", "5", "--deepspeed_config", p})), "");
  // A section this version has no counterpart for is refused when it is on.
  const std::string on = file("on.json", R"({"train_batch_size": 8, "compression_training": {"enabled": true}})");
  EXPECT_TRUE(has(error_of(with(base(), {"--train-iters", "5", "--deepspeed_config", on})), "compression_training"));
}

// The runtime sections real DeepSpeed configs carry: mapped (activation_checkpointing turns on
// recomputation), or accepted with one note each saying why they change nothing here; what cannot
// be followed is refused by key.
TEST(RecipeFlags, DeepSpeedRuntimeSectionsMapOrSayWhy) {
  const std::string p = file("runtime.json", R"({"train_batch_size": 8,
      "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": false, "contiguous_memory_optimization": false,
                                   "number_checkpoints": null, "synchronize_checkpoint_boundary": false, "profile": false},
      "checkpoint": {"tag_validation": "Warn", "load_universal": false, "use_node_local_storage": false},
      "data_types": {"grad_accum_dtype": "fp32"}, "gradient_predivide_factor": 2.0, "memory_breakdown": true,
      "flops_profiler": {"enabled": true, "profile_step": 1, "module_depth": -1, "top_modules": 1, "detailed": true},
      "comms_logger": {"enabled": true, "verbose": false, "prof_all": true, "debug": false},
      "wandb": {"enabled": true, "project": "p", "team": "t", "group": "g"},
      "zero_optimization": {"stage": 1, "round_robin_gradients": true}})");
  TrainConfig c;
  ASSERT_EQ(error_of(with(base(), {"--train-iters", "5", "--deepspeed_config", p}), &c), "");
  EXPECT_TRUE(c.recompute_activations) << "activation_checkpointing recomputes every layer";
  for (const char* k : {"activation_checkpointing.partition_activations", "checkpoint.tag_validation", "gradient_predivide_factor",
                        "memory_breakdown", "flops_profiler", "comms_logger", "wandb", "round_robin_gradients"}) {
    const auto n = std::count_if(c.notes.begin(), c.notes.end(), [&](const std::string& s) { return has(s, k) && has(s, "has no effect here: "); });
    EXPECT_EQ(n, 1) << k;
  }
  const auto refused = [&](const char* name, const char* json, const char* want) {
    const std::string e = error_of(with(base(), {"--train-iters", "5", "--deepspeed_config", file(name, json)}));
    EXPECT_TRUE(has(e, want)) << json << " -> " << e;
  };
  refused("cpu.json", R"({"train_batch_size": 8, "activation_checkpointing": {"cpu_checkpointing": true}})",
          "activation_checkpointing.cpu_checkpointing");
  refused("dt.json", R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "bf16"}})", "data_types.grad_accum_dtype 'bf16'");
}

// Every unknown key of a ds_config in one error, nested sections included, so three typos are
// fixed in one go.
TEST(RecipeFlags, EveryUnknownDeepSpeedKeyInOneError) {
  const std::string p = file("typos.json", R"({"train_batch_size": 8, "gradient_acumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decy": 0.1}}, "zero_optimization": {"stage": 1, "overlap_com": true}})");
  const std::string e = error_of(with(base(), {"--train-iters", "5", "--deepspeed_config", p}));
  EXPECT_TRUE(has(e, "3 unknown keys")) << e;
  for (const char* k : {"'gradient_acumulation_steps'", "'optimizer.params.weight_decy'", "'zero_optimization.overlap_com'"})
    EXPECT_TRUE(has(e, k)) << k << " missing from: " << e;
  EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 0) << "one line";
}

// Megatron's flags for what this version always does or never needs: accepted with one note each;
// --use-distributed-optimizer is ZeRO-1 (stage 0 raised to 1, a higher stage kept).
TEST(RecipeFlags, MegatronRunFlagsAreAcceptedOrMapped) {
  TrainConfig c;
  ASSERT_EQ(error_of(with(base(), {"--train-iters", "5", "--no-load-rng", "--no-save-rng", "--exit-signal-handler", "--exit-signal",
                                   "SIGTERM", "--data-cache-path", "/tmp/cache", "--wandb-project", "p", "--wandb-exp-name", "e",
                                   "--use-distributed-optimizer"}), &c), "");
  EXPECT_EQ(c.zero.stage, 1);
  for (const char* f : {"--no-load-rng", "--no-save-rng", "--exit-signal-handler", "--exit-signal SIGTERM", "--data-cache-path",
                        "--wandb-project", "--wandb-exp-name", "--use-distributed-optimizer"}) {
    const auto n = std::count_if(c.notes.begin(), c.notes.end(), [&](const std::string& s) { return s.rfind(f, 0) == 0; });
    EXPECT_EQ(n, 1) << f;
  }
  ASSERT_EQ(error_of(with(base(), {"--train-iters", "5", "--zero-stage", "2", "--use-distributed-optimizer"}), &c), "");
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_TRUE(has(error_of(with(base(), {"--train-iters", "5", "--exit-signal", "SIGINT"})), "only SIGTERM and SIGUSR1"));
}

// Megatron's OptimizerParamScheduler in samples: after step t (0-based) (t+1) x 8 samples are
// consumed; warmup 100 samples, cosine decay to 800. Hand values: step 0 -> 8/100 of the peak;
// step 11 -> 96/100; step 49 -> 400 samples, ratio (400-100)/700 = 3/7, lr = min + (max-min) x
// (cos(3pi/7)+1)/2; step 99 -> 800 samples: min_lr; past it min_lr.
TEST(RecipeFlags, SampleBasedScheduleIsMegatrons) {
  TrainConfig c;
  ASSERT_EQ(error_of(with(base(), {"--train-samples", "1000", "--lr-warmup-samples", "100", "--lr-decay-samples", "800",
                                   "--lr-decay-style", "cosine", "--min-lr", "1e-4"}), &c), "");
  EXPECT_EQ(c.train_iters, 125);  // 1000 / 8
  EXPECT_DOUBLE_EQ(engine::learning_rate(c, 0), 1e-3 * 0.08);
  EXPECT_DOUBLE_EQ(engine::learning_rate(c, 11), 1e-3 * 0.96);
  EXPECT_NEAR(engine::learning_rate(c, 49), 1e-4 + 9e-4 * 0.5 * (std::cos(M_PI * 3.0 / 7.0) + 1), 1e-15);
  EXPECT_DOUBLE_EQ(engine::learning_rate(c, 99), 1e-4);
  EXPECT_DOUBLE_EQ(engine::learning_rate(c, 120), 1e-4);
  // --lr-decay-samples defaults to --train-samples; --lr-warmup-fraction is a share of the decay.
  ASSERT_EQ(error_of(with(base(), {"--train-samples", "1000", "--lr-warmup-fraction", "0.1"}), &c), "");
  EXPECT_EQ(c.lr_decay_samples, 1000);
  EXPECT_EQ(c.lr_warmup_samples, 100);
  ASSERT_EQ(error_of(with(base(), {"--train-iters", "50", "--lr-warmup-fraction", "0.2"}), &c), "");
  EXPECT_EQ(c.lr_warmup_iters, 10);
  // Megatron's rule: iterations or samples, not both.
  EXPECT_TRUE(has(error_of(with(base(), {"--train-samples", "1000", "--train-iters", "10"})), "--train-samples and --train-iters"));
  EXPECT_TRUE(has(error_of(with(base(), {"--train-samples", "1000", "--lr-warmup-iters", "10"})), "--lr-warmup-iters belongs to iteration-based"));
  EXPECT_TRUE(has(error_of(with(base(), {"--train-iters", "10", "--lr-decay-samples", "10"})), "--lr-decay-samples belongs to sample-based"));
  EXPECT_TRUE(has(error_of(with(base(), {"--train-samples", "4"})), "less than one global batch"));
}

// Megatron's --use-flash-attn flags ask for the fused attention kernel: on the GPU the trainer then
// requires it (an error where it cannot serve: test_gpt_cuda's territory); on the CPU, which has
// the materialised kernel only, a note says so. --attention-kernel takes auto, fused or plain.
TEST(RecipeFlags, FlashAttentionFlagsAskForTheFusedKernel) {
  TrainConfig c;
  ASSERT_EQ(error_of(with(base(), {"--train-iters", "5"}), &c), "");
  EXPECT_EQ(c.attention_kernel, "auto");
  for (const char* f : {"--use-flash-attn", "--use-flash-attn-v1", "--use-flash-attn-v2", "--use-flash-attn-triton"}) {
    ASSERT_EQ(error_of(with(base(), {"--train-iters", "5", f, "--device", "cuda"}), &c), "") << f;
    EXPECT_EQ(c.attention_kernel, "fused") << f;
    EXPECT_TRUE(c.notes.empty()) << f << ": " << (c.notes.empty() ? "" : c.notes[0]);
    ASSERT_EQ(error_of(with(base(), {"--train-iters", "5", f}), &c), "") << f;
    ASSERT_EQ(c.notes.size(), 1u) << f;
    EXPECT_TRUE(has(c.notes[0], std::string(f) + " has no effect here: the CPU backend")) << c.notes[0];
  }
  for (const char* k : {"auto", "fused", "plain"}) {
    ASSERT_EQ(error_of(with(base(), {"--train-iters", "5", "--device", "cuda", "--attention-kernel", k}), &c), "") << k;
    EXPECT_EQ(c.attention_kernel, k);
  }
  EXPECT_TRUE(has(error_of(with(base(), {"--train-iters", "5", "--attention-kernel", "flash"})),
                  "'flash' is not an attention kernel: use auto, fused or plain (key: --attention-kernel)"));
}
