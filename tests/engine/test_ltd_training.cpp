// random-LTD in training, under mpirun (1 or 2 ranks).
//
// - Pinned at the full length (min = max = --seq-length) it is the baseline, bitwise: losses and
//   weights; the layer-tokens are tokens x layers.
// - A schedule 4 -> 16 kept tokens trains step i with the scheduled count (recorded per step),
//   counts DeepSpeed's consumed layer-tokens, differs from the baseline from step 1, and takes its
//   activations once, before the first step.
// - Stopped at iteration 4 and resumed from the checkpoint it equals the straight run, bitwise (the
//   kept count is a function of the iteration, the positions of the sample; the layer-tokens come
//   back from the file).
// - On 2 ranks it equals the one-rank run within 1e-5 relative on every loss: data parallel
//   (ZeRO-2), expert parallel (MoE layers among the dropping ones) and tensor parallel (T = 2):
//   the kept positions depend on the sample, not the rank; reductions are summed in another order
//   (fp32 rounding, ~1e-7; the tensor-parallel tolerance of test_tp_training).
// - The layer-token learning-rate schedule gives, at every step, the rate worked by hand from the
//   layer-tokens through that step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "hpct/comm/process_grid.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "mpi_gtest_main.hpp"
#include "tiny_gpt.hpp"

using namespace hpct;
namespace fs = std::filesystem;

using test::world;

namespace {

engine::TrainConfig tiny(int iters, int lo = 0, int hi = 0) {
  engine::TrainConfig c = test::tiny_gpt(iters, 4, 4);  // seq 16, 4 layers
  c.lr_decay_iters = 10;
  if (lo > 0) {
    auto& r = c.random_ltd;
    r.enabled = true;
    r.key = "data_efficiency.data_routing.random_ltd";
    r.min_value = lo, r.max_value = hi, r.require_steps = 8, r.seq_per_step = 4;  // layers 1 and 2
  }
  return c;
}

struct LtdRun {
  size_t act_start = 0, act_end = 0;
  std::vector<double> losses, lrs;
  std::vector<int> kept;
  std::vector<float> params;
  long long tokens = 0, layer_tokens = 0;
  std::string loaded;
};

LtdRun train(engine::TrainConfig c, const comm::Communicator& comm, int tp = 1, int ep = 1) {
  comm::ProcessGrid grid(comm, tp, ep);
  c.model.tensor_parallel = tp;
  c.moe_ep = ep;
  c.finalize(grid.dp().size());
  io::MockGptDataset data(c.model.vocab_size, c.model.max_seq_length, 7);
  engine::Trainer t(c, grid);
  LtdRun r;
  r.loaded = t.load_checkpoint();
  r.act_start = t.model().activation_bytes();
  auto s = t.train(data, nullptr);
  r.act_end = t.model().activation_bytes();
  for (auto& st : s.steps) r.losses.push_back(st.lm_loss), r.kept.push_back(st.ltd_kept), r.lrs.push_back(st.learning_rate);
  r.params = t.gather_full_params();
  r.tokens = t.consumed_tokens();
  r.layer_tokens = t.consumed_layer_tokens();
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void expect_close(const LtdRun& a, const LtdRun& ref, const char* what) {
  ASSERT_EQ(a.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], ref.losses[i], 1e-5 * std::fabs(ref.losses[i])) << what << ", step " << i + 1;
  EXPECT_EQ(a.kept, ref.kept) << what;
  EXPECT_EQ(a.layer_tokens, ref.layer_tokens) << what;
}
}  // namespace

TEST(RandomLtdTraining, PinnedAtFullLengthIsTheBaselineBitwise) {
  const LtdRun base = train(tiny(6), world());
  const LtdRun pinned = train(tiny(6, 16, 16), world());
  ASSERT_EQ(pinned.losses.size(), base.losses.size());
  for (size_t i = 0; i < base.losses.size(); ++i) EXPECT_EQ(pinned.losses[i], base.losses[i]) << "step " << i + 1;
  EXPECT_TRUE(same_bits(pinned.params, base.params));
  EXPECT_EQ(pinned.layer_tokens, 6 * 4 * 16 * 4);
  EXPECT_EQ(base.layer_tokens, pinned.layer_tokens);
}

TEST(RandomLtdTraining, TrainsWithTheScheduledKeptCounts) {
  const LtdRun base = train(tiny(10), world());
  const LtdRun ltd = train(tiny(10, 4, 16), world());
  // fixed_linear 4 -> 16 over 8 steps in multiples of 4: floor(it/8 * 12 + 4) rounded down.
  const std::vector<int> want = {4, 4, 4, 8, 8, 8, 12, 12, 16, 16};
  EXPECT_EQ(ltd.kept, want);
  long long layer_tokens = 0;
  for (int k : want) layer_tokens += 4LL * (k * 2 + 16 * 2);  // GB x (kept x 2 LTD layers + 16 x 2 others)
  EXPECT_EQ(ltd.layer_tokens, layer_tokens);
  EXPECT_EQ(ltd.tokens, 10 * 4 * 16) << "the data tokens are all consumed";
  EXPECT_NE(ltd.losses[0], base.losses[0]) << "the first step dropped nothing";
  EXPECT_GT(ltd.act_start, 0u);
  EXPECT_EQ(ltd.act_end, ltd.act_start) << "activations are taken before the first step";
  for (double l : ltd.losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(RandomLtdTraining, ResumeMidScheduleIsExact) {
  const auto& w = world();
  const std::string d = test::shared_dir(w, "ltd");
  const LtdRun whole = train(tiny(10, 4, 16), w);
  auto first = tiny(4, 4, 16);
  first.save_dir = d;
  train(first, w);
  auto rest = tiny(10, 4, 16);
  rest.load_path = d;
  const LtdRun cont = train(rest, w);
  ASSERT_FALSE(cont.loaded.empty());
  ASSERT_EQ(cont.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(cont.losses[i], whole.losses[4 + i]) << "step " << i + 5;
    EXPECT_EQ(cont.kept[i], whole.kept[4 + i]) << "step " << i + 5;
  }
  EXPECT_TRUE(same_bits(cont.params, whole.params));
  EXPECT_EQ(cont.layer_tokens, whole.layer_tokens);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

TEST(RandomLtdTraining, ParallelLayoutsMatchOneRank) {
  const auto& w = world();
  if (w.size() == 1) GTEST_SKIP() << "needs 2 ranks";
  const LtdRun one = train(tiny(10, 4, 16), comm::Communicator::self());
  auto c = tiny(10, 4, 16);
  c.zero.stage = 2;
  expect_close(train(c, w), one, "DP=2 ZeRO-2");
  expect_close(train(tiny(10, 4, 16), w, 2), one, "T=2");
  auto moe = tiny(10, 4, 16);
  moe.model.moe.num_experts = {4};
  moe.model.moe.expert_interval = 2;  // layers 1 and 3 (0-based) are MoE; 1 and 2 drop tokens
  moe.model.moe.second_expert_sampling = false;
  const LtdRun moe_one = train(moe, comm::Communicator::self());
  expect_close(train(moe, w, 1, 2), moe_one, "MoE EP=2");
}

// warmup_layer_tokens 400 and total_layer_tokens 2000, linear: the rate of each step follows the
// layer-tokens through it (4 x (kept x 2 + 16 x 2): 160, 320, 480, 672, 864, 1056, 1280, ...).
TEST(RandomLtdTraining, LayerTokenLearningRate) {
  auto c = tiny(8, 4, 16);
  c.lr_warmup_iters = 0;
  c.lr_style = engine::LrStyle::linear;
  c.random_ltd.layer_token_lr = true;
  c.random_ltd.warmup_layer_tokens = 400;
  c.random_ltd.total_layer_tokens = 2000;
  const LtdRun r = train(c, world());
  const double through[] = {160, 320, 480, 672, 864, 1056, 1280, 1504};
  ASSERT_EQ(r.lrs.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const double x = through[i];
    const double want = x <= 400 ? c.lr * x / 400 : c.min_lr + (1 - (x - 400) / (2000 - 400)) * (c.lr - c.min_lr);
    EXPECT_NEAR(r.lrs[i], want, 1e-12) << "step " << i + 1;
  }
}

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
