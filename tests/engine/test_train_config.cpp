// Bad input must produce a clear error that names the flag or key. One assertion per case.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "hpct/core/error.hpp"
#include "hpct/engine/config/train_config.hpp"

using namespace hpct;
using engine::TrainConfig;

namespace {
std::vector<std::string> base_args() {
  return {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "10", "--lr", "1e-3",
          "--mock-data", "--vocab-size", "100"};
}

// base_args() less one flag and its value.
std::vector<std::string> without(std::vector<std::string> a, const std::string& flag) {
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == flag) {
      a.erase(a.begin() + i, a.begin() + i + 2);
      break;
    }
  return a;
}

// Runs parse + finalize(dp) and returns the error message ("" if none).
std::string error_of(std::vector<std::string> args, int dp = 2) {
  try {
    TrainConfig c;
    engine::parse_args(args, c);
    c.finalize(dp);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string write_tmp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

std::vector<std::string> with(std::vector<std::string> a, std::initializer_list<std::string> more) {
  a.insert(a.end(), more);
  return a;
}
}  // namespace

TEST(TrainConfig, ValidConfigParses) {
  TrainConfig c;
  ASSERT_TRUE(engine::parse_args(base_args(), c));
  c.finalize(2);
  EXPECT_EQ(c.grad_accum, 2);
  EXPECT_EQ(c.lr_decay_iters, 10);
}

// The resolved arguments, as Megatron prints them: sorted, dotted to one column, the values after
// finalize (the accumulation steps derived, the dropout default, a flag's value).
TEST(TrainConfig, ArgumentsTextListsResolvedValues) {
  TrainConfig c;
  ASSERT_TRUE(engine::parse_args(with(base_args(), {"--hidden-dropout", "0.05"}), c));
  c.finalize(2);
  const std::string t = engine::arguments_text(c);
  EXPECT_EQ(t.rfind("------------------------ arguments ------------------------\n", 0), 0u) << t;
  EXPECT_NE(t.find("\n  gradient_accumulation_steps ..................... 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("\n  attention_dropout ............................... 0.1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("\n  hidden_dropout .................................. 0.05\n"), std::string::npos) << t;
  EXPECT_NE(t.find("\n  zero_optimization.stage ......................... 0\n"), std::string::npos) << t;
  EXPECT_LT(t.find("  adam_beta1 "), t.find("  num_layers ")) << "not sorted";
  EXPECT_NE(t.find("-------------------- end of arguments ---------------------\n"), std::string::npos);
}

TEST(TrainConfig, HelpReturnsFalse) {
  TrainConfig c;
  EXPECT_FALSE(engine::parse_args({"--help"}, c));
  const std::string h = engine::help_text("pretrain_gpt");
  EXPECT_NE(h.find("--global-batch-size"), std::string::npos);
  // Grouped as Megatron groups its arguments, each flag once.
  ASSERT_NE(h.find("\nnetwork size:\n  --"), std::string::npos) << h;
  for (const char* f : {"  --hidden-size", "  --ffn-hidden-size", "  --swiglu", "  --use-rotary-position-embeddings"}) {
    EXPECT_LT(h.find("\nnetwork size:\n"), h.find(f)) << f;
    EXPECT_LT(h.find(f), h.find("\nregularization:\n")) << f;
  }
  EXPECT_LT(h.find("\nregularization:\n"), h.find("  --hidden-dropout"));
  EXPECT_LT(h.find("  --hidden-dropout"), h.find("\ntraining:\n"));
  EXPECT_EQ(h.find("\nother:\n"), std::string::npos) << "a flag without a group";
  for (const char* f : {"  --lr V", "  --bf16 ", "  --num-experts V", "  --rampup-batch-size V"}) {
    const size_t at = h.find(f);
    EXPECT_NE(at, std::string::npos) << f;
    EXPECT_EQ(h.find(f, at + 1), std::string::npos) << f << " listed twice";
  }
}

// --mock-data has no tokenizer to size its vocabulary: without --vocab-size it is refused (issue 47
// item 15: 256 was taken silently).
TEST(TrainConfig, MockDataNeedsAVocabularySize) {
  std::vector<std::string> a = base_args();
  a.erase(a.end() - 2, a.end());  // "--vocab-size", "100"
  EXPECT_NE(error_of(a).find("--mock-data needs --vocab-size V"), std::string::npos) << error_of(a);
}

TEST(TrainConfig, UnknownFlag) { EXPECT_NE(error_of(with(base_args(), {"--num-layer", "3"})).find("unknown flag '--num-layer'"), std::string::npos); }
TEST(TrainConfig, BadInteger) { EXPECT_NE(error_of(with(base_args(), {"--train-iters", "ten"})).find("--train-iters expects an integer, got 'ten'"), std::string::npos); }
TEST(TrainConfig, MissingValue) { EXPECT_NE(error_of(with(base_args(), {"--lr"})).find("--lr needs a value"), std::string::npos); }
TEST(TrainConfig, HeadsDoNotDivideHidden) {
  EXPECT_NE(error_of(with(base_args(), {"--num-attention-heads", "5"})).find("not divisible by --num-attention-heads 5"), std::string::npos);
}
TEST(TrainConfig, InconsistentBatch) {
  auto msg = error_of(with(base_args(), {"--global-batch-size", "6"}), 4);
  EXPECT_NE(msg.find("--global-batch-size 6 is not divisible by --micro-batch-size 2 x data-parallel size 4"), std::string::npos) << msg;
}
TEST(TrainConfig, NoData) {
  std::vector<std::string> a = base_args();
  a.erase(a.begin() + 16, a.end());  // drop --mock-data --vocab-size
  EXPECT_NE(error_of(a).find("no training data"), std::string::npos);
}
TEST(TrainConfig, BadDecayStyle) { EXPECT_NE(error_of(with(base_args(), {"--lr-decay-style", "cosin"})).find("unknown learning-rate decay style 'cosin'"), std::string::npos); }
TEST(TrainConfig, MinLrAboveLr) { EXPECT_NE(error_of(with(base_args(), {"--min-lr", "1"})).find("--min-lr must be in [0, --lr]"), std::string::npos); }
// TED's flags need what they act on: one error line naming the flag.
TEST(TrainConfig, TedFlagsNeedTheirParts) {
  EXPECT_NE(error_of(with(base_args(), {"--enable-expert-tensor-parallelism"})).find("--enable-expert-tensor-parallelism needs MoE layers"),
            std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--communication-aware-checkpointing"})).find("add --checkpoint-activations"),
            std::string::npos);
  EXPECT_EQ(error_of(with(base_args(), {"--communication-aware-checkpointing", "--checkpoint-activations"})), "");
}
TEST(TrainConfig, ZeroStageRange) { EXPECT_NE(error_of(with(base_args(), {"--zero-stage", "4"})).find("ZeRO stage must be 0, 1, 2 or 3"), std::string::npos); }

TEST(DsConfig, ZeroOptimizationKnobs) {
  auto p = write_tmp("ds_zero.json", R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": 2e6, "overlap_comm": false,
    "stage3_prefetch_bucket_size": 1e6, "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 3e7,
    "allgather_bucket_size": 4e6, "contiguous_gradients": true, "offload_optimizer": {"device": "none"}}})");
  TrainConfig c;
  engine::parse_args(with(base_args(), {"--deepspeed_config", p}), c);
  c.finalize(1);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_DOUBLE_EQ(c.zero.reduce_bucket_size, 2e6);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_DOUBLE_EQ(c.zero.allgather_bucket_size, 4e6);
  EXPECT_DOUBLE_EQ(c.zero.prefetch_bucket_size, 1e6);
  EXPECT_DOUBLE_EQ(c.zero.param_persistence_threshold, 1e4);
  EXPECT_DOUBLE_EQ(c.zero.max_live_parameters, 3e7);
  // the flag and the file must agree
  auto msg = error_of(with(base_args(), {"--zero-stage", "2", "--deepspeed_config", p}));
  EXPECT_NE(msg.find("'zero_optimization.stage' = 3 disagrees with --zero-stage 2"), std::string::npos) << msg;
}
TEST(DsConfig, ZeroBadKnobsNamed) {
  auto p = write_tmp("ds_zero_bad.json", R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}})");
  auto msg = error_of(with(base_args(), {"--deepspeed_config", p}));
  EXPECT_NE(msg.find("zero_optimization.reduce_bucket_size"), std::string::npos) << msg;
  auto q = write_tmp("ds_zero_off.json", R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}})");
  msg = error_of(with(base_args(), {"--deepspeed_config", q}));
  EXPECT_NE(msg.find("offloading parameters needs ZeRO stage 3"), std::string::npos) << msg;
  q = write_tmp("ds_zero_dev.json", R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}})");
  msg = error_of(with(base_args(), {"--deepspeed_config", q}));
  EXPECT_NE(msg.find("'gpu' is not a device: use none, cpu or nvme"), std::string::npos) << msg;
  q = write_tmp("ds_zero_nopath.json", R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})");
  msg = error_of(with(base_args(), {"--deepspeed_config", q}));
  EXPECT_NE(msg.find("device nvme needs nvme_path"), std::string::npos) << msg;
}

TEST(DsConfig, BatchTripleInfersMicro) {
  auto p = write_tmp("ds_ok.json", R"({"train_batch_size": 16, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "gradient_clipping": 0.5, "bf16": {"enabled": true}, "steps_per_print": 5})");
  TrainConfig c;
  std::vector<std::string> a = without(without(without(base_args(), "--micro-batch-size"), "--global-batch-size"), "--lr");
  a.insert(a.end(), {"--deepspeed_config", p});
  engine::parse_args(a, c);
  c.finalize(4);
  EXPECT_EQ(c.micro_batch, 2);
  EXPECT_DOUBLE_EQ(c.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.clip_grad, 0.5);
  EXPECT_EQ(c.log_interval, 5);
  EXPECT_EQ(c.precision, engine::PrecisionMode::bf16);
}
TEST(DsConfig, UnknownKeyNamed) {
  auto p = write_tmp("ds_unknown.json", R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "weight_decya": 0.1}}})");
  auto msg = error_of(with(base_args(), {"--deepspeed_config", p}));
  EXPECT_NE(msg.find("unknown key 'optimizer.params.weight_decya'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
}
TEST(DsConfig, WrongTypeNamed) {
  auto p = write_tmp("ds_type.json", R"({"train_micro_batch_size_per_gpu": "2"})");
  EXPECT_NE(error_of(with(base_args(), {"--deepspeed_config", p})).find("'train_micro_batch_size_per_gpu' must be an integer"), std::string::npos);
}
TEST(DsConfig, DisagreesWithFlag) {
  auto p = write_tmp("ds_dis.json", R"({"train_batch_size": 16})");
  EXPECT_NE(error_of(with(base_args(), {"--deepspeed_config", p})).find("'train_batch_size' = 16 disagrees with --global-batch-size 8"), std::string::npos);
}
TEST(DsConfig, InconsistentTriple) {
  auto p = write_tmp("ds_triple.json", R"({"gradient_accumulation_steps": 3})");
  EXPECT_NE(error_of(with(base_args(), {"--deepspeed_config", p})).find("gradient_accumulation_steps 3 does not match"), std::string::npos);
}
TEST(DsConfig, InvalidJsonNamesFile) {
  auto p = write_tmp("ds_bad.json", "{\"train_batch_size\": 8,,}");
  auto msg = error_of(with(base_args(), {"--deepspeed_config", p}));
  EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ds_bad.json"), std::string::npos) << msg;
}
TEST(DsConfig, MissingFile) {
  EXPECT_NE(error_of(with(base_args(), {"--deepspeed_config", "/nonexistent/ds.json"})).find("cannot open config file: No such file or directory (file: /nonexistent/ds.json)"), std::string::npos);
}
TEST(DsConfig, UnsupportedOptimizer) {
  auto p = write_tmp("ds_opt.json", R"({"optimizer": {"type": "Lamb", "params": {}}})");
  EXPECT_NE(error_of(with(base_args(), {"--deepspeed_config", p})).find("optimizer type 'Lamb' is not supported"), std::string::npos);
}
TEST(DsConfig, CommunicationDataType) {
  // default: the training dtype (16-bit reductions); "fp32" reduces in fp32; another 16-bit type is refused
  TrainConfig c;
  auto bf16 = write_tmp("ds_comm_default.json", R"({"bf16": {"enabled": true}})");
  ASSERT_TRUE(engine::parse_args(with(base_args(), {"--deepspeed_config", bf16}), c));
  EXPECT_FALSE(c.zero.fp32_communication);
  auto fp32 = write_tmp("ds_comm_fp32.json", R"({"bf16": {"enabled": true}, "communication_data_type": "fp32"})");
  TrainConfig c2;
  ASSERT_TRUE(engine::parse_args(with(base_args(), {"--deepspeed_config", fp32}), c2));
  EXPECT_TRUE(c2.zero.fp32_communication);
  auto bad = write_tmp("ds_comm_bad.json", R"({"bf16": {"enabled": true}, "communication_data_type": "fp16"})");
  const std::string msg = error_of(with(base_args(), {"--deepspeed_config", bad}));
  EXPECT_NE(msg.find("communication_data_type 'fp16' with bf16 training is not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"bf16\" (the default) or \"fp32\""), std::string::npos) << msg;
}
TEST(DsConfig, Fp16AndBf16Exclusive) {
  auto p = write_tmp("ds_prec.json", R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  EXPECT_NE(error_of(with(base_args(), {"--deepspeed_config", p})).find("fp16 and bf16 are both enabled"), std::string::npos);
}

TEST(TrainConfig, DeviceNamed) {
  EXPECT_NE(error_of(with(base_args(), {"--device", "tpu"})).find("'tpu' is not a device: use cpu or cuda"), std::string::npos);
  // --device cuda without offload_optimizer is GPU-resident ZeRO (stages 0-3, LoRA too): accepted.
  EXPECT_EQ(error_of(with(base_args(), {"--device", "cuda"})), "");
  auto s3 = write_tmp("ds_stage3.json", R"({"zero_optimization": {"stage": 3}})");
  EXPECT_EQ(error_of(with(base_args(), {"--device", "cuda", "--deepspeed_config", s3})), "");
  EXPECT_EQ(error_of(with(base_args(), {"--device", "cuda", "--lora-rank", "4"})), "");
  auto p = write_tmp("ds_offload_cpu.json", R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})");
  EXPECT_EQ(error_of(with(base_args(), {"--device", "cuda", "--deepspeed_config", p})), "");
}

// Issue 17, item 8: numbers that are not finite or out of range, integers that would wrap, and
// checks that depended on flag order.
TEST(TrainConfigNumbers, NonFiniteAndNegativeValuesAreRefused) {
  EXPECT_NE(error_of(with(base_args(), {"--lr", "nan"})).find("--lr expects a finite number"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--lr", "inf"})).find("--lr expects a finite number"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--lr", "-1e-3"})).find("--lr must be positive"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--weight-decay", "-0.1"})).find("--weight-decay must be >= 0"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--clip-grad", "-1"})).find("--clip-grad must be >= 0"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--min-lr", "-1e-5"})).find("--min-lr must be in [0, --lr]"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--loss-scale", "-8"})).find("--loss-scale must be positive"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--min-loss-scale", "0"})).find("--min-loss-scale must be positive"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--initial-loss-scale", "0"})).find("--initial-loss-scale must be in [1, 2^62]"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--lr-decay-iters", "-5"})).find("--lr-decay-iters must be >= 0"), std::string::npos);
}

TEST(TrainConfigNumbers, IntegersNeverWrap) {
  EXPECT_NE(error_of(with(base_args(), {"--num-layers", "4294967298"})).find("--num-layers 4294967298 is out of range"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--train-iters", "1e30"})).find("--train-iters 1e30 is out of range"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--global-batch-size", "-8"})).find("--global-batch-size -8 is out of range"), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--micro-batch-size", "2147483647"})).find("exceeds 2147483647"), std::string::npos);
  auto path = write_tmp("gas.json", R"({"train_batch_size": 8, "gradient_accumulation_steps": 4294967300})");
  EXPECT_NE(error_of(with(base_args(), {"--deepspeed_config", path})).find("'gradient_accumulation_steps' = 4294967300 is out of range"),
            std::string::npos);
  auto stage = write_tmp("stage.json", R"({"zero_optimization": {"stage": 4294967297}})");
  EXPECT_NE(error_of(with(base_args(), {"--deepspeed_config", stage})).find("'zero_optimization.stage' = 4294967297 is out of range"),
            std::string::npos);
}

TEST(TrainConfigNumbers, ChecksDoNotDependOnFlagOrder) {
  const std::string want = "--max-position-embeddings 64 is smaller than --seq-length 128";
  EXPECT_NE(error_of(with(base_args(), {"--max-position-embeddings", "64", "--seq-length", "128"})).find(want), std::string::npos);
  EXPECT_NE(error_of(with(base_args(), {"--seq-length", "128", "--max-position-embeddings", "64"})).find(want), std::string::npos);
  EXPECT_EQ(error_of(with(base_args(), {"--max-position-embeddings", "128", "--seq-length", "128"})), "");
}

TEST(TrainConfigNumbers, HostileJsonNamesTheFile) {
  auto deep = write_tmp("deep.json", std::string(100000, '[') + std::string(100000, ']'));
  auto e = error_of(with(base_args(), {"--deepspeed_config", deep}));
  EXPECT_NE(e.find("nested deeper than 64 levels"), std::string::npos) << e;
  EXPECT_NE(e.find(deep), std::string::npos) << e;
  auto big = write_tmp("big.json", R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e999}}})");
  e = error_of(with(base_args(), {"--deepspeed_config", big}));
  EXPECT_NE(e.find(big), std::string::npos) << e;
  EXPECT_NE(e.find("invalid JSON"), std::string::npos) << e;
  auto neg = write_tmp("neglr.json", R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": -0.001}}})");
  EXPECT_NE(error_of(with(without(base_args(), "--lr"), {"--deepspeed_config", neg})).find("warmup_max_lr must be positive"), std::string::npos);
}
