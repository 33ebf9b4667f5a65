// random-LTD's schedule, layer-token count and ds_config block (unit).
//
// The kept count against values worked by hand from DeepSpeed's RandomLTDScheduler (fixed_linear,
// rounded down to seq_per_step, capped at max and at the step's length); the layer-tokens of a step
// (DeepSpeed's consumed_layer_tokens formula); Megatron-DeepSpeed's template block accepted as
// written, a disabled block accepted whatever it holds, every bad key refused with its path, and the
// flag and learning-rate conflicts named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "hpct/core/error.hpp"
#include "hpct/engine/data/random_ltd.hpp"
#include "hpct/engine/config/train_config.hpp"
#include "hpct/engine/loop/trainer.hpp"

using namespace hpct;
using engine::RandomLtdConfig;

namespace {
RandomLtdConfig schedule(int lo, int hi, long long steps, int per_step) {
  RandomLtdConfig c;
  c.enabled = true;
  c.key = "data_efficiency.data_routing.random_ltd";
  c.min_value = lo, c.max_value = hi, c.require_steps = steps, c.seq_per_step = per_step;
  return c;
}

// A ds_config with `ltd` as the random_ltd block (and `extra` members); the error text of parse +
// finalize ("" when accepted) and the config. A 4-layer model, seq 128, global batch 4 on 4 ranks.
std::string apply(const std::string& ltd, engine::TrainConfig* out = nullptr, std::vector<std::string> flags = {},
                  const std::string& extra = "") {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("hpct_ltd_" + std::to_string(::getpid()) + ".json")).string();
  std::ofstream(path) << "{\"train_batch_size\": 4, " << extra
                      << "\"data_efficiency\": {\"enabled\": true, \"data_routing\": {\"enabled\": true, \"random_ltd\": "
                      << ltd << "}}}";
  engine::TrainConfig c;
  try {
    std::vector<std::string> args = {"--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
                                     "--seq-length", "128", "--micro-batch-size", "1", "--train-iters", "10",
                                     "--lr", "1e-3", "--mock-data", "--vocab-size", "100", "--deepspeed_config", path};
    args.insert(args.end(), flags.begin(), flags.end());
    engine::parse_args(args, c);
    c.finalize(4);
  } catch (const Error& e) {
    std::filesystem::remove(path);
    return e.what();
  }
  std::filesystem::remove(path);
  if (out) *out = c;
  return "";
}

// Megatron-DeepSpeed's GPT template's block (ds_config_gpt_1clmetric_TEMPLATE.json), at this size.
const std::string kTemplate = R"({"enabled": true, "total_layer_num": 4, "random_ltd_layer_num": 2,
  "random_ltd_layer_id": [1, 2], "model_mask_name": "attention_mask", "model_type": "decoder",
  "hidden_state_order": "seq_batch_dim", "random_ltd_schedule": {"min_value": 32, "max_value": 128,
  "schedule_type": "fixed_linear", "schedule_config": {"require_steps": 200, "seq_per_step": 16}}})";
}  // namespace

TEST(RandomLtdSchedule, FixedLinearByHand) {
  // The GPT-3 1.3B recipe: 128 -> 2048 over 200,000 steps in multiples of 16.
  const auto g = schedule(128, 2048, 200000, 16);
  EXPECT_EQ(g.kept_at(0), 128);
  EXPECT_EQ(g.kept_at(1666), 128);     // floor(15.99 + 128) = 143 -> 128
  EXPECT_EQ(g.kept_at(1667), 144);     // floor(16.00 + 128) = 144
  EXPECT_EQ(g.kept_at(100000), 1088);  // floor(960 + 128)
  EXPECT_EQ(g.kept_at(199999), 2032);  // floor(2047.99) = 2047 -> 2032
  EXPECT_EQ(g.kept_at(200000), 2048);
  EXPECT_EQ(g.kept_at(10000000), 2048);
  // 32 -> 128 over 200 steps in multiples of 16 (the tiny block above).
  const auto t = schedule(32, 128, 200, 16);
  const std::pair<long long, int> want[] = {{0, 32}, {33, 32}, {34, 48}, {50, 48}, {100, 80}, {199, 112}, {200, 128}};
  for (auto [it, k] : want) EXPECT_EQ(t.kept_at(it), k) << "iteration " << it;
  // Capped at the step's length (sequence-length warmup), and the full length when off.
  EXPECT_EQ(t.kept(100, 64), 64);
  EXPECT_EQ(t.kept(0, 64), 32);
  RandomLtdConfig off = t;
  off.enabled = false;
  EXPECT_EQ(off.kept(0, 64), 64);
  // min == max never moves; a min below seq_per_step rounds to 0 and is refused.
  EXPECT_EQ(schedule(64, 64, 10, 16).kept_at(5), 64);
  EXPECT_THROW(schedule(8, 128, 10, 16).validate(4, 128, 4, 1, "f.json"), Error);
}

TEST(RandomLtdSchedule, LayersAndLayerTokens) {
  auto c = schedule(32, 128, 200, 16);
  EXPECT_EQ(c.layers(4), (std::vector<int>{1, 2}));  // every layer but the first and the last
  EXPECT_EQ(c.layers(24).size(), 22u);
  c.layer_ids = {2};
  EXPECT_EQ(c.layers(4), (std::vector<int>{2}));
  // global_batch x (kept x Lr + T x (L - Lr)): 16 x (48 x 1 + 128 x 3) at iteration 50.
  EXPECT_EQ(c.step_layer_tokens(50, 128, 4, 16), 16LL * (48 + 128 * 3));
  c.enabled = false;
  EXPECT_EQ(c.step_layer_tokens(50, 128, 4, 16), 16LL * 128 * 4);
}

TEST(RandomLtdConfigBlock, TemplateIsAccepted) {
  engine::TrainConfig c;
  ASSERT_EQ(apply(kTemplate, &c, {"--random-ltd"}), "");
  const auto& r = c.random_ltd;
  EXPECT_TRUE(r.enabled);
  EXPECT_EQ(r.key, "data_efficiency.data_routing.random_ltd");
  EXPECT_EQ(r.layers(4), (std::vector<int>{1, 2}));
  EXPECT_EQ(r.min_value, 32);
  EXPECT_EQ(r.max_value, 128);
  EXPECT_EQ(r.require_steps, 200);
  EXPECT_EQ(r.seq_per_step, 16);
  EXPECT_FALSE(r.layer_token_lr);
  // A disabled block (or data_routing off) is accepted whatever it holds, and drops nothing.
  engine::TrainConfig off;
  ASSERT_EQ(apply(R"({"enabled": false, "random_ltd_schedule": {"min_value": 1}, "anything": 3})", &off), "");
  EXPECT_FALSE(off.random_ltd.enabled);
}

TEST(RandomLtdConfigBlock, BadKeysAreNamed) {
  const std::string sched = R"("random_ltd_schedule": {"min_value": 32, "max_value": 128, "schedule_type": "fixed_linear", "schedule_config": {"require_steps": 200, "seq_per_step": 16}})";
  struct Case { std::string body, key; };
  const Case cases[] = {
      {R"({"enabled": true, "total_layer_num": 24, )" + sched + "}", "random_ltd.total_layer_num"},
      {R"({"enabled": true, "random_ltd_layer_id": [1, 4], )" + sched + "}", "random_ltd.random_ltd_layer_id"},
      {R"({"enabled": true, "random_ltd_layer_id": [2, 1], )" + sched + "}", "random_ltd.random_ltd_layer_id"},
      {R"({"enabled": true, "random_ltd_layer_id": "1,2", )" + sched + "}", "random_ltd.random_ltd_layer_id"},
      {R"({"enabled": true, "random_ltd_layer_num": 3, "random_ltd_layer_id": [1, 2], )" + sched + "}", "random_ltd.random_ltd_layer_num"},
      {R"({"enabled": true, "model_type": "encoder", )" + sched + "}", "random_ltd.model_type"},
      {R"({"enabled": true, "global_batch_size": 8, )" + sched + "}", "random_ltd.global_batch_size"},
      {R"({"enabled": true, "typo": 1, )" + sched + "}", "random_ltd.typo"},
      {R"({"enabled": true, "random_ltd_schedule": {"min_value": 32, "max_value": 256, "schedule_config": {"require_steps": 2}}})",
       "random_ltd.random_ltd_schedule.max_value"},  // beyond --seq-length 128
      {R"({"enabled": true, "random_ltd_schedule": {"min_value": 64, "max_value": 32, "schedule_config": {"require_steps": 2}}})",
       "random_ltd.random_ltd_schedule.max_value"},
      {R"({"enabled": true, "random_ltd_schedule": {"min_value": 32, "max_value": 128, "schedule_type": "fixed_root", "schedule_config": {"require_steps": 2}}})",
       "random_ltd.random_ltd_schedule.schedule_type"},
      {R"({"enabled": true, "random_ltd_schedule": {"min_value": 32, "max_value": 128, "schedule_config": {"seq_per_step": 16}}})",
       "random_ltd.random_ltd_schedule.schedule_config.require_steps"},
      {R"({"enabled": true, "layer_token_lr_schedule": {"enabled": true, "total_layer_tokens": 10, "warmup_layer_tokens": 20}, )" + sched + "}",
       "random_ltd.layer_token_lr_schedule.total_layer_tokens"},
      {R"({"enabled": true, "layer_token_lr_schedule": {"enabled": true, "total_layer_tokens": 100, "warmup_type": "cosine"}, )" + sched + "}",
       "random_ltd.layer_token_lr_schedule.warmup_type"},
  };
  for (const auto& c : cases) {
    const std::string e = apply(c.body);
    EXPECT_NE(e.find(c.key), std::string::npos) << "want '" << c.key << "' in: " << (e.empty() ? "(accepted)" : e);
  }
}

TEST(RandomLtdConfigBlock, FlagsAndConflictsAreNamed) {
  // --random-ltd without an enabled block.
  EXPECT_NE(apply(R"({"enabled": false})", nullptr, {"--random-ltd"}).find("--random-ltd"), std::string::npos);
  // The layer-token schedule replaces the token flags and the step warmup.
  const std::string lt = kTemplate.substr(0, kTemplate.size() - 1) +
                         R"(, "layer_token_lr_schedule": {"enabled": true, "total_layer_tokens": 100000, "warmup_layer_tokens": 1000}})";
  engine::TrainConfig c;
  ASSERT_EQ(apply(lt, &c), "");
  EXPECT_TRUE(c.random_ltd.layer_token_lr);
  EXPECT_EQ(c.random_ltd.total_layer_tokens, 100000);
  for (const char* flag : {"--lr-decay-tokens", "--lr-warmup-tokens", "--lr-warmup-iters"}) {
    const std::string e = apply(lt, nullptr, {flag, "10"});
    EXPECT_NE(e.find(flag), std::string::npos) << e;
  }
  // Sequence parallelism splits each kept sub-batch over the ranks: micro-batch x seq_per_step (and
  // x max_value) must divide, or the flag is named.
  EXPECT_EQ(apply(kTemplate, nullptr, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}), "");
  std::string odd = kTemplate;
  for (auto [from, to] : {std::pair<std::string, std::string>{"\"seq_per_step\": 16", "\"seq_per_step\": 5"},
                          {"\"min_value\": 32", "\"min_value\": 35"}, {"\"max_value\": 128", "\"max_value\": 125"}})
    odd.replace(odd.find(from), from.size(), to);
  EXPECT_EQ(apply(odd), "") << "the odd schedule itself is valid";
  const std::string e = apply(odd, nullptr, {"--tensor-model-parallel-size", "2", "--sequence-parallel"});
  EXPECT_NE(e.find("--sequence-parallel"), std::string::npos) << e;
  EXPECT_NE(e.find("seq_per_step 5"), std::string::npos) << e;
}

TEST(RandomLtdLog, LineCarriesTheReservedLength) {
  const std::string line = engine::format_log_line(10, 100, 160, 20480, 500, 1e-3, 16, 9.5, 1, 1.2, 0, 0, 4000, 2000, 0.1,
                                                   NAN, -1, 48, 90);
  EXPECT_NE(line.find("| random ltd reserved length:    48 | actual seqlen:    90 | number of skipped"), std::string::npos)
      << line;
  const std::string both = engine::format_log_line(10, 100, 160, 20480, 500, 1e-3, 16, 9.5, 1, 1.2, 0, 0, 4000, 2000,
                                                   0.1, NAN, 64, 48, 56);
  EXPECT_NE(both.find("| curriculum seqlen:    64 | random ltd reserved length:    48 | actual seqlen:    56 |"),
            std::string::npos)
      << both;
}
