// ZeRO-Offload's host optimizer step behind the next step's forward (parallel::DeviceStore::
// update_behind), under mpirun with N = 1, 2 and 4: the same numbers as the step run before the
// forward, bit for bit, at stages 0-3.
//
// The device route is StagedCpuOps with deferred transfers, the GEMMs reading the device's 16-bit
// copies (tests/model/staged_cpu_ops.hpp), and the store's worker slowed (StepBehind::slow_for_tests: 2 ms before each block's report, 20 ms after the step), so the forward
// reaches every block before the step behind has updated it and the backward's first gradient
// comes before the step's end: a block used before its update, uploaded before it, or a gradient
// handed to the engine while the step still reads the last one gives other losses (measured, one
// at a time: not waiting in params(), letting upload_ahead() take blocks not yet updated, and not
// joining at the first gradient each fail this test). At stages 1-2 over several ranks the
// step's all-gathers are the training thread's (AdamParams::regather_later), in the step's order
// up to the block the forward needs and no further: a rank that took more of them early than
// another would make its collectives in another order than its peers, between the forward's own
// and wait in a collective its peers make later: a hang. Taking the reports as they come instead
// hangs this test at 2 ranks (MoE at EP 2: the experts' all-to-all between the dense all-gathers;
// tried), and CTest's timeout fails it. Where small collectives complete eagerly and no hang
// shows, the test still sees it: each rank's worker runs at its own pace and every rank must have
// made its re-gathers at the same points (StepBehind::regather_order).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "mpi_gtest_main.hpp"
#include "zero_runs.hpp"

using namespace hpct;
using namespace hpct::test::zero_runs;

namespace {

using test::world;

const char* prec_name(engine::PrecisionMode p) {
  return p == engine::PrecisionMode::fp32 ? "fp32" : p == engine::PrecisionMode::bf16 ? "bf16" : "fp16";
}

std::unique_ptr<kernels::OpsBackend> staged(bool pin) {
  auto s = std::make_unique<test::StagedCpuOps>();
  s->defer_transfers(true);
  s->prefer_half(true);  // the GEMMs read the device's 16-bit copies (params16): awaited, right offsets
  s->allow_pinning(pin);
  return s;
}

constexpr double kDelay = 2e-3;  // seconds per block on the worker: longer than a tiny block's forward
constexpr uint64_t test_fnv_basis = 1469598103934665603ull;  // regather_order() before any re-gather

// The tiny MoE these tests train at expert parallelism 2 (4 experts every second layer, top-1):
// returns the expert-parallel size.
int moe_at_ep2(engine::TrainConfig& c) {
  c.model.moe.num_experts = {4};
  c.model.moe.expert_interval = 2;
  c.model.moe.second_expert_sampling = false;
  return 2;
}

// The same run with the step waited for, and behind the forward with each rank's worker at its
// own pace (pinned uploads): {want, got}.
std::pair<Result, Result> waited_and_behind(engine::TrainConfig c, int ep) {
  c.optimizer_overlap = false;
  Result want = train(c, world(), staged(true), 0, 1, ep);
  c.optimizer_overlap = true;
  Result got = train(c, world(), staged(true), kDelay * (1 + world().rank()), 1, ep);
  return {std::move(want), std::move(got)};
}

void expect_same(const Result& got, const Result& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < got.losses.size(); ++i) EXPECT_EQ(got.losses[i], want.losses[i]) << "step " << i << ", " << what;
  EXPECT_EQ(max_diff(got.params, want.params), 0.0) << what;
}

// Stages 0-2, the three precisions, 1 and 4 micro-steps per rank, pinned uploads and uploads
// through slots: the step behind against the step waited for, on the same backend (an fp16 step
// skipped for overflow has no update to run behind: `updates` counts the steps taken).
TEST(OptimizerOverlap, EqualsTheStepRunBeforeTheForward) {
  const int n = world().size();
  if (n > 2) GTEST_SKIP() << "1 and 2 ranks cover it; 4 run the parallel layouts below";
  for (int stage : {0, 1, 2})
    for (auto prec : {engine::PrecisionMode::fp32, engine::PrecisionMode::bf16, engine::PrecisionMode::fp16})
      for (int micro : {12 / n, 3 / n > 0 ? 3 / n : 1})
        for (bool pin : {true, false}) {
          if (!pin && prec == engine::PrecisionMode::fp32) continue;  // fp32 blocks always go through slots
          engine::TrainConfig c = tiny(stage, 4);
          c.micro_batch = micro;
          c.precision = prec;
          const std::string what = std::string(prec_name(prec)) + " stage " + std::to_string(stage) + ", " +
                                   std::to_string(n) + " ranks, micro batch " + std::to_string(micro) +
                                   (pin ? ", pinned" : ", through slots");
          c.optimizer_overlap = false;
          const Result want = train(c, world(), staged(pin));
          c.optimizer_overlap = true;
          const Result got = train(c, world(), staged(pin), kDelay);
          expect_same(got, want, what);
          EXPECT_EQ(got.steps_behind, got.updates) << what;
          EXPECT_EQ(want.steps_behind, 0) << what;
          EXPECT_GT(got.updates, 0) << what << ": no step taken";
          // The forward ran beside the step: it was handed blocks the step had updated while the
          // step still updated the rest.
          EXPECT_GT(got.uses_behind, 0) << what;
          EXPECT_EQ(got.uploads_in_step, want.uploads_in_step) << what;
          EXPECT_EQ(got.to_device, want.to_device) << what;
          EXPECT_EQ(got.changed_under_upload, 0) << what << ": the step wrote a block while it was uploaded";
          EXPECT_EQ(got.freed_under_transfer, 0) << what;
          EXPECT_GT(std::fabs(want.losses.front() - want.losses.back()), 1e-4) << "training moved nothing, " << what;
        }
}

// Models with more than one engine or frozen blocks: MoE (the experts' engine updates after every
// dense block, so the forward waits for an expert block longer) and LoRA (the base is frozen and
// never uploaded again), at stage 0 and at stage 2 (re-gathers beside the frozen group on 2 ranks).
TEST(OptimizerOverlap, MoeAndLora) {
  const int n = world().size();
  if (n > 2) GTEST_SKIP() << "1 and 2 ranks cover it";
  for (int stage : {0, 2})
  for (int kind : {0, 1})
    for (auto prec : {engine::PrecisionMode::fp32, engine::PrecisionMode::bf16}) {
      engine::TrainConfig c = tiny(stage, 3);
      c.micro_batch = 12 / n;
      c.precision = prec;
      if (kind == 0) {
        c.model.moe.num_experts = {4};
        c.model.moe.expert_interval = 2;
      } else {
        c.model.lora.rank = 4;
        c.model.lora.alpha = 8;
        c.model.lora.targets = 0x1F;  // the four linears and the embedding
      }
      const std::string what = std::string(kind == 0 ? "MoE " : "LoRA ") + prec_name(prec) + " stage " +
                               std::to_string(stage) + ", " + std::to_string(n) + " ranks";
      c.optimizer_overlap = false;
      const Result want = train(c, world(), staged(true));
      c.optimizer_overlap = true;
      const Result got = train(c, world(), staged(true), kDelay);
      expect_same(got, want, what);
      EXPECT_EQ(got.steps_behind, 3) << what;
      EXPECT_GT(got.uses_behind, 0) << what;
      EXPECT_EQ(got.changed_under_upload, 0) << what;
    }
}

// Logging the optimizer states' norms needs the step's sums on the log line: that step waits for
// itself, the others run behind. Evaluations between steps see the step's weights.
TEST(OptimizerOverlap, LoggedNormsAndEvaluations) {
  if (world().size() > 2) GTEST_SKIP() << "1 and 2 ranks cover it";
  for (int stage : {0, 2}) {
    engine::TrainConfig c = tiny(stage, 4);
    c.micro_batch = 12 / world().size();
    c.records.log_params_norm = true;
    c.log_interval = 2;  // steps 2 and 4 log the parameters' norm
    c.eval_iters = 1;
    c.eval_interval = 1;
    const std::string what = "stage " + std::to_string(stage);
    c.optimizer_overlap = false;
    const Result want = train(c, world(), staged(true));
    c.optimizer_overlap = true;
    const Result got = train(c, world(), staged(true), kDelay);
    expect_same(got, want, what);
    EXPECT_EQ(got.steps_behind, 2) << what;
    ASSERT_EQ(got.weight_l2.size(), 4u) << what;
    for (size_t i : {1, 3}) {
      EXPECT_TRUE(std::isfinite(got.weight_l2[i])) << what << ", step " << i;
      EXPECT_EQ(got.weight_l2[i], want.weight_l2[i]) << what << ", step " << i;
    }
    ASSERT_EQ(got.val_losses.size(), 4u) << what;
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got.val_losses[i], want.val_losses[i]) << what << ", evaluation " << i;
  }
}

// Checkpoints: 2 steps, save (synchronous or asynchronous), resume for 2 more == 4 straight, with
// the step behind on both legs, and across the routes (a run that waited resumed behind). The
// asynchronous save is an interval save (iteration 2; the exit save at 3 is synchronous, as every
// final save is), resumed from its own file.
TEST(OptimizerOverlap, ResumesBitwise) {
  if (world().size() > 2) GTEST_SKIP() << "1 and 2 ranks cover it";
  const std::string dir = test::shared_dir(world(), "optimizer_overlap_ckpt");
  const int n = world().size();
  for (int stage : {0, 2})
    for (auto prec : {engine::PrecisionMode::fp32, engine::PrecisionMode::bf16}) {
      engine::TrainConfig base = tiny(stage, 4);
      base.micro_batch = 12 / n;
      base.precision = prec;
      base.lr_decay_iters = 10;
      base.optimizer_overlap = true;
      const Result straight = train(base, world(), staged(true), kDelay);
      for (auto [first_behind, async] : {std::pair{true, false}, std::pair{true, true}, std::pair{false, false}}) {
        const std::string what = std::string(prec_name(prec)) + " stage " + std::to_string(stage) +
                                 (first_behind ? "" : ", first leg waited") + (async ? ", async save" : "");
        engine::TrainConfig c1 = base;
        c1.save_dir = dir + "/s" + std::to_string(stage) + prec_name(prec) + (first_behind ? "b" : "w") + (async ? "a" : "");
        c1.exit_interval = async ? 3 : 2;
        c1.save_interval = async ? 2 : 0;
        c1.async_save = async;
        c1.optimizer_overlap = first_behind;
        train(c1, world(), staged(true), kDelay);
        engine::TrainConfig c2 = base;
        c2.load_path = async ? c1.save_dir + "/iter_0000002.h5" : c1.save_dir;
        const Result resumed = train(c2, world(), staged(true), kDelay);
        ASSERT_EQ(resumed.losses.size(), 2u) << what;
        EXPECT_EQ(resumed.losses[0], straight.losses[2]) << what;
        EXPECT_EQ(resumed.losses[1], straight.losses[3]) << what;
        EXPECT_EQ(max_diff(resumed.params, straight.params), 0.0) << what;
        EXPECT_EQ(resumed.steps_behind, 2) << what;
      }
    }
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// The step's all-gathers (stages 1-2) beside the forward's collectives: MoE with EP 2 (two
// engines, the experts' all-to-alls between the dense all-gathers), TP 2 (the forward's
// all-reduces) and plain data parallelism, each rank's worker at its own pace: bitwise, and the
// re-gathers at the same points on every rank (taking the reports as they come hangs the MoE case
// and fails this check in the plain one; tried).
TEST(OptimizerOverlap, ParallelLayoutsRegatherInOneOrder) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "expert and tensor parallelism need 2 ranks";
  for (int stage : {1, 2})
    for (auto prec : {engine::PrecisionMode::fp32, engine::PrecisionMode::bf16})
      for (int layout : {0, 1, 2}) {  // MoE at EP 2, TP 2, plain data parallelism
        engine::TrainConfig c = tiny(stage, 3);
        c.micro_batch = 12 / n;
        c.precision = prec;
        int tp = 1, ep = 1;
        if (layout == 0) {
          ep = moe_at_ep2(c);
        } else if (layout == 1) {
          tp = 2;
          c.micro_batch = 12 / (n / 2);
        }
        const std::string what = std::string(layout == 0 ? "MoE EP 2 " : layout == 1 ? "TP 2 " : "DP ") + prec_name(prec) + " stage " +
                                 std::to_string(stage) + ", " + std::to_string(n) + " ranks";
        c.optimizer_overlap = false;
        const Result want = train(c, world(), staged(true), 0, tp, ep);
        c.optimizer_overlap = true;
        // Each rank's worker at its own pace (rank r: r + 1 times kDelay a block).
        const Result got = train(c, world(), staged(true), kDelay * (1 + world().rank()), tp, ep);
        expect_same(got, want, what);
        EXPECT_EQ(got.steps_behind, 3) << what;
        // The same traffic per step (a step's re-gathers are made in the next one, the last one's
        // at the end of training, all counted).
        EXPECT_EQ(got.comm_bytes, want.comm_bytes) << what;
        // The re-gathers at the same points on every rank (only the dense blocks' groups have more
        // than one rank under EP 2 at 2 ranks; the order is the same structure everywhere).
        const std::vector<double> orders = world().allgather(static_cast<double>(got.regather_order % (1ull << 52)));
        for (size_t r = 1; r < orders.size(); ++r) EXPECT_EQ(orders[r], orders[0]) << what << ": rank " << r;
        const int dp = layout == 1 ? n / 2 : n;  // TP 2 leaves n / 2 data-parallel ranks
        if (dp > 1) EXPECT_NE(got.regather_order, test_fnv_basis) << what << ": no re-gather recorded";
        else EXPECT_EQ(got.regather_order, test_fnv_basis) << what << ": a group of one rank re-gathers nothing";
        EXPECT_GT(got.uses_behind, 0) << what;
        EXPECT_EQ(got.changed_under_upload, 0) << what;
        if (layout == 0) {
          // The device keeps the parameters and gradient sum of this rank's blocks only: not the
          // other rank's experts (it kept the whole layout's once).
          const size_t elem = prec == engine::PrecisionMode::fp32 ? 4 : 2;
          ASSERT_LT(got.held_numel, got.numel) << what;
          EXPECT_EQ(got.resident_bytes, 2 * elem * got.held_numel) << what;
        }
      }
}

// Stage 3: the forward gathers each block from the ranks' slices, prefetching the next ones, so
// every gather (and prefetch) waits for that block's update on this rank (the engine's
// before_gather hook; without it this test fails, tried), the gathers in the forward's order on
// every rank. With every block partitioned (threshold 0) nothing is re-gathered after the step;
// with the embedding and the final norm persistent (threshold 5000: the layers hold about 12.7k
// elements each) those are re-gathered in the step's order, as at stages 1-2. Plain DP and MoE at
// EP 2, each rank at its own pace, several micro-steps (the prefetch crosses them).
TEST(OptimizerOverlap, Stage3GathersWaitForEachBlocksUpdate) {
  const int n = world().size();
  for (double threshold : {0.0, 5000.0})
    for (auto prec : {engine::PrecisionMode::fp32, engine::PrecisionMode::bf16})
      for (int layout : {0, 1}) {  // plain DP, MoE at EP 2
        if (layout == 1 && n < 2) continue;
        engine::TrainConfig c = tiny(3, 3);
        c.zero.param_persistence_threshold = threshold;
        c.micro_batch = n == 4 ? 3 : 12 / n / 2;  // several micro-steps: the prefetch crosses them
        c.precision = prec;
        const int ep = layout == 1 ? moe_at_ep2(c) : 1;
        const std::string what = std::string(layout == 1 ? "MoE EP 2 " : "DP ") + prec_name(prec) +
                                 " stage 3, persistence threshold " + std::to_string(int(threshold)) + ", " +
                                 std::to_string(n) + " ranks";
        const auto [want, got] = waited_and_behind(c, ep);
        expect_same(got, want, what);
        EXPECT_EQ(want.steps_behind, 0) << what;
        EXPECT_EQ(got.steps_behind, 3) << what;
        EXPECT_GT(got.uses_behind, 0) << what << ": the forward never ran beside the step";
        EXPECT_EQ(got.comm_bytes, want.comm_bytes) << what;
        EXPECT_EQ(got.gathers, want.gathers) << what << ": the prefetch changed";
        const std::vector<double> orders = world().allgather(static_cast<double>(got.regather_order % (1ull << 52)));
        for (size_t r = 1; r < orders.size(); ++r) EXPECT_EQ(orders[r], orders[0]) << what << ": rank " << r;
        if (threshold == 0 || n == 1) {
          EXPECT_EQ(got.regather_order, test_fnv_basis) << what << ": nothing to re-gather";
        }
        EXPECT_GT(std::fabs(want.losses.front() - want.losses.back()), 1e-4) << "training moved nothing, " << what;
      }
}

// ZeRO-Infinity's optimizer states on NVMe at stages 1-2: the sweep of the swap file runs behind
// the forward, each block reported as the sweep passes the end of its slice (tiles of 4096
// elements: several per layer), with the same numbers, the same NVMe traffic and collectives.
// Plain DP (fp32: the fp32 parameters in memory; bf16: the masters in the file) and MoE at EP 2
// (two engines, two swap files per rank). Stage 3 with the parameters in the file keeps the step
// before the forward (its gathers read the file the sweep writes): not run behind, same numbers.
TEST(OptimizerOverlap, NvmeSweepRunsBehindTheForward) {
  const int n = world().size();
  const std::string dir = test::shared_dir(world(), "overlap_nvme");
  for (int stage : {1, 2, 3})
    for (auto prec : {engine::PrecisionMode::fp32, engine::PrecisionMode::bf16})
      for (int layout : {0, 1}) {  // plain DP, MoE at EP 2
        if ((layout == 1 && n < 2) || (stage == 3 && layout == 1)) continue;
        engine::TrainConfig c = tiny(stage, 3);
        c.micro_batch = n == 4 ? 3 : 12 / n / 2;
        c.precision = prec;
        c.zero.sub_group_size = 4096;
        c.zero.offload_optimizer.device = "nvme";
        c.zero.offload_optimizer.nvme_path = dir;
        if (stage == 3) c.zero.offload_param.device = "nvme", c.zero.offload_param.nvme_path = dir;
        const int ep = layout == 1 ? moe_at_ep2(c) : 1;
        const std::string what = std::string(layout == 1 ? "MoE EP 2 " : "DP ") + prec_name(prec) + " stage " +
                                 std::to_string(stage) + " NVMe, " + std::to_string(n) + " ranks";
        const auto [want, got] = waited_and_behind(c, ep);
        expect_same(got, want, what);
        EXPECT_EQ(want.steps_behind, 0) << what;
        EXPECT_GT(want.nvme_bytes, 0) << what << ": the states were not swept from the file";
        EXPECT_EQ(got.nvme_bytes, want.nvme_bytes) << what;
        EXPECT_EQ(got.comm_bytes, want.comm_bytes) << what;
        EXPECT_EQ(want.sweep_seconds_behind, 0) << what;
        if (stage == 3) {
          EXPECT_EQ(got.steps_behind, 0) << what << ": the gathers would read the file beside the sweep";
          EXPECT_EQ(got.sweep_seconds_behind, 0) << what;
        } else {
          EXPECT_EQ(got.steps_behind, 3) << what;
          EXPECT_GT(got.uses_behind, 0) << what << ": the forward never ran beside the sweep";
          EXPECT_GT(got.sweep_seconds_behind, 0) << what;
        }
        const std::vector<double> orders = world().allgather(static_cast<double>(got.regather_order % (1ull << 52)));
        for (size_t r = 1; r < orders.size(); ++r) EXPECT_EQ(orders[r], orders[0]) << what << ": rank " << r;
        EXPECT_GT(std::fabs(want.losses.front() - want.losses.back()), 1e-4) << "training moved nothing, " << what;
      }
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
