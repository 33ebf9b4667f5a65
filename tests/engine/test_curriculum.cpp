// Sequence-length warmup's schedule and its ds_config blocks (unit).
//
// The pacing against values worked by hand from DeepSpeed's formula (curriculum.hpp), including its
// edge cases (a min that is not a multiple of the step falls below min; min == max never moves; a
// fixed_discrete list stays at max once reached); both ds_config spellings give the same schedule;
// every bad key is refused with its path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "hpct/core/error.hpp"
#include "hpct/engine/data/curriculum.hpp"
#include "hpct/engine/config/train_config.hpp"

using namespace hpct;
using engine::CurriculumConfig;

namespace {
CurriculumConfig linear(int lo, int hi, long long total, int step) {
  CurriculumConfig c;
  c.enabled = true;
  c.key = "curriculum_learning";
  c.schedule_type = "fixed_linear";
  c.min_difficulty = lo, c.max_difficulty = hi, c.total_curriculum_step = total, c.difficulty_step = step;
  return c;
}

// A ds_config file with `body` (JSON object members) beside a batch size; returns the error text
// of parse + finalize ("" when accepted) and the resulting config.
std::string apply(const std::string& body, engine::TrainConfig* out = nullptr, int seq = 1024) {
  const std::string path = (std::filesystem::temp_directory_path() / ("hpct_cl_" + std::to_string(::getpid()) + ".json")).string();
  std::ofstream(path) << "{\"train_batch_size\": 4, " << body << "}";
  engine::TrainConfig c;
  c.model.max_seq_length = seq;
  c.micro_batch = 1;
  c.train_iters = 10;
  c.lr = 1e-3;
  c.mock_data = true;
  try {
    c.ds_config_path = path;
    engine::apply_ds_config(path, c, {});
    c.finalize(4);
  } catch (const Error& e) {
    std::filesystem::remove(path);
    return e.what();
  }
  std::filesystem::remove(path);
  if (out) *out = c;
  return "";
}
}  // namespace

TEST(Curriculum, FixedLinearByHand) {
  // DeepSpeed tutorial's example: 8 -> 1024 over 15000 steps in multiples of 8.
  const auto c = linear(8, 1024, 15000, 8);
  EXPECT_EQ(c.difficulty_at(1), 8);      // floor(1/15000 * 1016 + 8) = 8
  EXPECT_EQ(c.difficulty_at(100), 8);    // floor(6.77 + 8) = 14 -> 8
  EXPECT_EQ(c.difficulty_at(119), 16);   // floor(8.06 + 8) = 16
  EXPECT_EQ(c.difficulty_at(7500), 512); // floor(508 + 8) = 516 -> 512
  EXPECT_EQ(c.difficulty_at(15000), 1024);
  EXPECT_EQ(c.difficulty_at(90000), 1024);  // capped
  // Iteration it trains at DeepSpeed's update_difficulty(global_steps + 1).
  EXPECT_EQ(c.seqlen(0, 1024), 8);
  EXPECT_EQ(c.seqlen(118, 1024), 16);
  EXPECT_EQ(c.seqlen(117, 1024), 8);
  EXPECT_EQ(c.seqlen(14999, 1024), 1024);
  // A min that is not a multiple of the step starts below it (DeepSpeed's behaviour: 20 -> 16).
  EXPECT_EQ(linear(20, 64, 100, 8).seqlen(0, 64), 16);
  // min == max: DeepSpeed never updates it.
  EXPECT_EQ(linear(60, 60, 100, 8).seqlen(0, 64), 60);
  CurriculumConfig off;
  EXPECT_EQ(off.seqlen(5, 64), 64);
}

TEST(Curriculum, FixedRootAndDiscreteByHand) {
  auto r = linear(8, 1024, 10000, 8);
  r.schedule_type = "fixed_root";
  r.root_degree = 2;
  EXPECT_EQ(r.difficulty_at(2500), 512);  // sqrt(0.25) = 0.5: floor(508 + 8) = 516 -> 512
  EXPECT_EQ(r.difficulty_at(100), 104);   // sqrt(0.01) = 0.1: floor(101.6 + 8) = 109 -> 104
  CurriculumConfig d;
  d.enabled = true;
  d.schedule_type = "fixed_discrete";
  d.min_difficulty = 1, d.max_difficulty = 3;
  d.difficulty = {1, 2, 3};
  d.max_step = {5, 10};
  const int want[] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3};  // steps 1..12
  for (int s = 1; s <= 12; ++s) EXPECT_EQ(d.difficulty_at(s), want[s - 1]) << "step " << s;
  // Once a step reaches max_difficulty the length stays (DeepSpeed stops updating).
  d.max_difficulty = 64;
  d.difficulty = {8, 64, 32};
  EXPECT_EQ(d.seqlen(0, 64), 8);
  EXPECT_EQ(d.seqlen(5, 64), 64);
  EXPECT_EQ(d.seqlen(11, 64), 64);  // not 32
}

TEST(Curriculum, BothDsConfigSpellingsGiveOneSchedule) {
  engine::TrainConfig a, b;
  ASSERT_EQ(apply(R"("curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 8,
      "max_difficulty": 1024, "schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": 15000, "difficulty_step": 8}})", &a), "");
  ASSERT_EQ(apply(R"("data_efficiency": {"enabled": true, "seed": 1234, "data_sampling": {"enabled": true,
      "num_workers": 0, "curriculum_learning": {"enabled": true, "data_cluster_path": "/tmp/none",
      "curriculum_metrics": {"seqlen_truncate": {"index_to_sample_path": "x", "index_to_metric_path": "y",
      "difficulty_type": "value", "clustering_type": "single_cluster", "min_difficulty": 8, "max_difficulty": 1024,
      "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 15000, "difficulty_step": 8}}}}}})", &b), "");
  EXPECT_TRUE(a.curriculum.enabled && b.curriculum.enabled);
  for (long long it : {0ll, 118ll, 7499ll, 20000ll}) EXPECT_EQ(a.curriculum.seqlen(it, 1024), b.curriculum.seqlen(it, 1024));
  EXPECT_EQ(b.curriculum.key, "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.seqlen_truncate");
  // Two data metrics: both read, in name order (the JSON object's keys sorted).
  engine::TrainConfig two;
  const std::string metric = R"({"index_to_sample_path": "p", "index_to_metric_path": "q", "difficulty_type": "value",
      "clustering_type": "schedule_based", "min_difficulty": 1, "max_difficulty": 9, "schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 1}})";
  const std::string body = R"("data_efficiency": {"enabled": true, "data_sampling": {"enabled": true, "curriculum_learning":
      {"enabled": true, "curriculum_metrics": {"vocab_rarity": )" + metric + R"(, "seqlen": )" + metric + "}}}}";
  ASSERT_EQ((apply)(body, &two), "");  // parenthesised: no ADL to std::apply
  ASSERT_EQ(two.metric_curricula.size(), 2u);
  EXPECT_EQ(two.metric_curricula[0].metric, "seqlen");
  EXPECT_EQ(two.metric_curricula[1].metric, "vocab_rarity");
  EXPECT_EQ(two.metric_curricula[0].schedule.key, "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.seqlen");
  // Disabled blocks are read (unknown keys still refused) but change nothing.
  engine::TrainConfig off;
  ASSERT_EQ(apply(R"("curriculum_learning": {"enabled": false, "min_difficulty": 8})", &off), "");
  EXPECT_FALSE(off.curriculum.enabled);
}

TEST(Curriculum, BadKeysAreNamed) {
  const std::string legacy = R"("curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", )";
  struct Case { std::string body, key; };
  const Case cases[] = {
      {legacy + R"("min_difficulty": 8, "max_difficulty": 2048, "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}})",
       "curriculum_learning.max_difficulty"},  // beyond --seq-length 1024
      {legacy + R"("min_difficulty": 4, "max_difficulty": 64, "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 1000, "difficulty_step": 8}})",
       "curriculum_learning.min_difficulty"},  // rounds to 0 tokens
      {legacy + R"("min_difficulty": 8, "max_difficulty": 64, "schedule_type": "custom", "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}})",
       "curriculum_learning.schedule_type"},
      {legacy + R"("min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 10}})",
       "curriculum_learning.schedule_config.difficulty_step"},
      {legacy + R"("min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_root", "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}})",
       "curriculum_learning.schedule_config.root_degree"},
      {legacy + R"("min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [8, 64], "max_step": [5, 9]}})",
       "curriculum_learning.schedule_config.difficulty"},
      {legacy + R"("min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8, "typo": 1}})",
       "curriculum_learning.schedule_config.typo"},
      {R"("curriculum_learning": {"enabled": true, "curriculum_type": "vocab"})", "curriculum_learning.curriculum_type"},
      {legacy + R"("min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear"})",
       "curriculum_learning.schedule_config"},  // absent: named (it threw a JSON library error, found by fuzzing)
      {R"("data_efficiency": {"enabled": true, "data_sampling": {"enabled": true, "curriculum_learning": {"enabled": true, "curriculum_metrics": {"vocabularyrarity": {}}}}})",
       "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.vocabularyrarity"},
      {R"("data_efficiency": {"enabled": true, "data_routing": {"enabled": true, "random_ltd": {"enabled": true}}})",
       "data_efficiency.data_routing.random_ltd.random_ltd_schedule"},  // random-LTD without its schedule
  };
  for (const auto& c : cases) {
    const std::string e = apply(c.body);
    EXPECT_NE(e.find(c.key), std::string::npos) << "want '" << c.key << "' in: " << (e.empty() ? "(accepted)" : e);
  }
  // The Megatron-DeepSpeed switch without a curriculum is named too.
  engine::TrainConfig c;
  c.model.max_seq_length = 64;
  c.micro_batch = 1;
  c.train_iters = 1;
  c.lr = 1e-3;
  c.mock_data = true;
  c.curriculum_flag = true;
  try {
    c.finalize(1);
    FAIL() << "the flag without a curriculum was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--data-efficiency-curriculum-learning"), std::string::npos) << e.what();
  }
}

TEST(Curriculum, TokenFlagsAreCheckedByName) {
  auto run = [](std::vector<std::string> args) -> std::string {
    engine::TrainConfig c;
    try {
      std::vector<std::string> base = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                                       "--seq-length", "16", "--micro-batch-size", "1", "--train-iters", "10",
                                       "--lr", "1e-3", "--mock-data", "--vocab-size", "100"};
      base.insert(base.end(), args.begin(), args.end());
      engine::parse_args(base, c);
      c.finalize(1);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(run({"--lr-warmup-tokens", "1e3", "--lr-decay-tokens", "3e5", "--train-tokens", "1e6"}), "");
  EXPECT_NE(run({"--lr-warmup-tokens", "100", "--lr-warmup-iters", "5"}).find("--lr-warmup-tokens"), std::string::npos);
  EXPECT_NE(run({"--lr-warmup-tokens", "1000", "--lr-decay-tokens", "1000"}).find("--lr-decay-tokens"), std::string::npos);
  EXPECT_NE(run({"--train-tokens", "0"}).find("--train-tokens"), std::string::npos);
  EXPECT_NE(run({"--lr-decay-tokens", "-5"}).find("--lr-decay-tokens"), std::string::npos);
}
