// Data parallelism over N ranks with global batch B must equal one rank accumulating gradients to
// the same B. Every rank also runs the one-rank reference itself (over MPI_COMM_SELF), so the test
// needs no files and runs for any N.
//
// Tolerance: the N-rank run sums each gradient over ranks in MPI's order, the reference sums the
// same micro-batch gradients in accumulation order; fp32 addition is not associative, so results
// differ by rounding (~1e-7 relative per step). Adam divides by sqrt(v), which keeps relative
// differences at that level. We allow 1e-5 relative on losses and 2e-6 absolute on parameters
// (the learning rate is 1e-3, so that is 0.2% of one step's update) after 4 steps; a real bug
// (a sample seen twice, a missing 1/N) changes losses in the 3rd digit and parameters by ~1e-4.
// bf16 and fp16 runs store gradients in 16 bits (DeepSpeed's default grad_accum_dtype: the model's):
// each rank folds its micro-steps into a 16-bit accumulator, one rounding per micro-step, so N ranks
// with k micro-steps round different partial sums than one rank with N*k. Adam divides by sqrt(v),
// so an element whose micro-step gradients nearly cancel can then step by a full lr either way;
// and GEMM inputs are rounded to 8 (bf16) or 11 (fp16) mantissa bits, a discontinuous function once
// the parameters differ. So 16-bit runs are held to: losses within 1e-4 relative (measured <= 1e-5),
// at most 1% of parameters more than 1e-4 apart (measured <= 0.4%), none more than 2 x steps x lr (+1% for weight decay).
// A sample seen twice or a missing 1/N moves the loss in the 2nd-3rd digit and every parameter.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "hpct/comm/process_grid.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "mpi_gtest_main.hpp"
#include "tiny_gpt.hpp"
#include "hpct/kernels/ops.hpp"

using namespace hpct;

namespace {
engine::TrainConfig tiny(engine::PrecisionMode prec, int iters, double dropout = 0) {
  engine::TrainConfig c = test::tiny_gpt(iters, 2, 12);  // 12: divisible by every N in 1..4
  c.precision = prec;
  c.model.attention_dropout = c.model.hidden_dropout = dropout;
  return c;
}

struct Run {
  std::vector<double> losses, grad_norms;
  std::vector<float> params;
};

Run train(engine::TrainConfig c, const comm::Communicator& comm) {
  comm::ProcessGrid grid(comm, 1, 1);
  c.finalize(grid.dp().size());
  io::MockGptDataset data(c.model.vocab_size, c.model.max_seq_length, 7);
  engine::Trainer t(c, grid);
  auto s = t.train(data, nullptr);
  Run r;
  for (auto& st : s.steps) {
    r.losses.push_back(st.lm_loss);
    r.grad_norms.push_back(st.grad_norm);
  }
  r.params = t.gather_params();
  return r;
}

void check(engine::PrecisionMode prec, int iters, double dropout = 0) {
  const bool half = prec != engine::PrecisionMode::fp32;
  const double ltol = half ? 1e-4 : 1e-5;
  auto world = comm::Communicator::world();
  Run dp = train(tiny(prec, iters, dropout), world);
  auto self = comm::Communicator::self();
  Run ref = train(tiny(prec, iters, dropout), self);
  if (dropout > 0) {  // the masks really changed the run (else the check below proves nothing new)
    Run plain = train(tiny(prec, iters), self);
    // (at init the logits are near uniform, so the first loss moves by ~5e-4: far above rounding)
    EXPECT_GT(std::fabs(plain.losses.front() - ref.losses.front()), 1e-4) << "dropout dropped nothing";
  }
  ASSERT_EQ(dp.losses.size(), ref.losses.size());
  for (size_t i = 0; i < dp.losses.size(); ++i)
    EXPECT_NEAR(dp.losses[i], ref.losses[i], ltol * std::fabs(ref.losses[i])) << "step " << i << " on " << world.size() << " ranks";
  // Step 1's gradient norm: both runs start from the same parameters, so only the 16-bit
  // accumulation order differs (2^-9 relative per rounding in bf16); a missing 1/N or a sample
  // counted twice changes it by tens of percent. (Adam's first step is lr * sign(g): the
  // parameters alone would not show a wrong scale.)
  EXPECT_NEAR(dp.grad_norms[0], ref.grad_norms[0], (half ? 1e-2 : 1e-5) * ref.grad_norms[0]) << "step 1 gradient norm on " << world.size() << " ranks";
  ASSERT_EQ(dp.params.size(), ref.params.size());
  double maxdiff = 0;
  size_t off = 0;
  for (size_t i = 0; i < dp.params.size(); ++i) {
    const double d = std::fabs(double(dp.params[i]) - ref.params[i]);
    maxdiff = std::max(maxdiff, d);
    off += d > 1e-4;
  }
  if (half) {
    EXPECT_LE(double(off), 0.01 * dp.params.size()) << "parameters more than 1e-4 apart on " << world.size() << " ranks";
    EXPECT_LE(maxdiff, 2 * iters * 1e-3 * 1.01) << "max parameter difference on " << world.size() << " ranks";
  } else {
    EXPECT_LE(maxdiff, 2e-6) << "max parameter difference on " << world.size() << " ranks";
  }
  if (world.rank() == 0)
    std::printf("[ %s, %d steps, %d ranks ] max |param - 1 rank| = %.3g, %zu of %zu more than 1e-4 apart\n",
                kernels::precision_name(half ? (prec == engine::PrecisionMode::bf16 ? kernels::Precision::bf16
                                                                                   : kernels::Precision::fp16)
                                             : kernels::Precision::fp32),
                iters, world.size(), maxdiff, off, dp.params.size());
  // the training really moved the parameters (the comparison is not between two untouched inits)
  if (iters > 1) {
    EXPECT_GT(std::fabs(ref.losses.front() - ref.losses.back()), 1e-3);
  }
}
}  // namespace

TEST(DpEquivalence, Fp32) { check(engine::PrecisionMode::fp32, 4); }
// Dropout 0.1 on every site (Megatron's default): the masks follow each sample's global index, so
// N ranks drop what one rank drops; the same tolerances as without it.
TEST(DpEquivalence, Fp32WithDropout) { check(engine::PrecisionMode::fp32, 4, 0.1); }
// --rampup-batch-size 12 12 24 to a global batch of 24 (12 is a multiple of every N in 1..4):
// batches 12, 12, 24, 24 on 96 samples; N ranks must equal one rank step by step as without a
// ramp (each step's micro-steps follow its batch), with the same tolerances.
TEST(DpEquivalence, Fp32WithBatchRampup) {
  auto ramped = [] {
    engine::TrainConfig c = tiny(engine::PrecisionMode::fp32, 0);
    c.global_batch = 24;
    c.train_iters = 0;
    c.train_samples = 72;
    c.lr_warmup_iters = 0;
    c.lr_warmup_samples = 12;
    c.rampup = {12, 12, 24};
    return c;
  };
  auto world = comm::Communicator::world();
  auto self = comm::Communicator::self();
  const auto dp = train(ramped(), world), ref = train(ramped(), self);
  ASSERT_EQ(ref.losses.size(), 4u) << "12 + 12 + 24 + 24 samples";
  ASSERT_EQ(dp.losses.size(), ref.losses.size());
  for (size_t i = 0; i < dp.losses.size(); ++i)
    EXPECT_NEAR(dp.losses[i], ref.losses[i], 1e-5 * std::fabs(ref.losses[i])) << "step " << i << " on " << world.size() << " ranks";
  double maxdiff = 0;
  for (size_t i = 0; i < dp.params.size(); ++i) maxdiff = std::max(maxdiff, std::fabs(double(dp.params[i]) - ref.params[i]));
  EXPECT_LE(maxdiff, 2e-6) << "max parameter difference on " << world.size() << " ranks";
}

TEST(DpEquivalence, Bf16OneStep) { check(engine::PrecisionMode::bf16, 1); }
TEST(DpEquivalence, Bf16FourSteps) { check(engine::PrecisionMode::bf16, 4); }
TEST(DpEquivalence, Fp16FourSteps) { check(engine::PrecisionMode::fp16, 4); }

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
