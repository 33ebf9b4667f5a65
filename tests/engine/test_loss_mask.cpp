// Loss masks (TokenDataset::get_loss_mask, what prompt/response data will give): the trainer's step
// on a dataset that masks each sample's first 3-7 targets equals, on 1 and 2 ranks with gradient
// accumulation, the model run directly on the same samples with those targets set to -1 and the
// loss averaged over the targets that count: the logged loss within 1e-6 relative (the same sums in
// another order over ranks), the gradient norm within 1e-5 (the gradients summed over micro-steps
// and ranks in another order; fp32). And the mean is over the counted targets, not B*T: the
// loss differs from the masked sum divided by B*T by the ratio of the two counts. The same holds
// for Megatron's --eod-mask-loss on top of such a mask, with documents inside the samples.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "hpct/comm/process_grid.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "hpct/io/gpt_dataset.hpp"
#include "hpct/model/gpt.hpp"
#include "mpi_gtest_main.hpp"
#include "tiny_gpt.hpp"

using namespace hpct;
using test::world;

namespace {

// Mock tokens whose sample i counts only targets t >= 3 + i % 5 (a "prompt" of 3 to 7 tokens).
class MaskedMock : public io::TokenDataset {
 public:
  MaskedMock(int V, int T) : base_(V, T, 7), T_(T) {}
  size_t size() const override { return base_.size(); }
  size_t seq_length() const override { return base_.seq_length(); }
  void get(size_t i, int32_t* out) const override { base_.get(i, out); }
  bool has_loss_mask() const override { return true; }
  void get_loss_mask(size_t i, uint8_t* out) const override {
    for (int t = 0; t < T_; ++t) out[t] = t >= prompt(i);
  }
  static int prompt(size_t i) { return 3 + static_cast<int>(i % 5); }

 private:
  io::MockGptDataset base_;
  int T_;
};

// One step of the trainer on `data` against the model run by hand on its first global batch, with
// the targets where counts(sample, t, tokens) is false set to -1 and the mean over the rest.
template <class Counts>
void check_step(const io::TokenDataset& data, engine::TrainConfig c, Counts counts) {
  const auto& comm = world();
  comm::ProcessGrid grid(comm, 1, 1);
  c.finalize(grid.dp().size());
  engine::Trainer t(c, grid);
  const auto s = t.train(data, nullptr);
  ASSERT_EQ(s.steps.size(), 1u);

  // The same step by hand on one process: samples 0..3, uncounted targets -1, mean over the rest.
  const int T = c.model.max_seq_length, B = c.global_batch;
  model::Gpt g(c.model, kernels::Precision::fp32, false);
  std::vector<float> p(g.layout().numel()), grads(p.size(), 0.0f);
  g.init_params(p.data(), c.seed);
  model::FlatParamStore store(g.layout(), p.data(), grads.data());
  std::vector<int32_t> buf(T + 1), tok((size_t)B * T), tgt((size_t)B * T);
  long long counted = 0;
  for (int i = 0; i < B; ++i) {
    data.get(i, buf.data());
    for (int k = 0; k < T; ++k) {
      const bool n = counts(i, k, buf);
      tok[(size_t)i * T + k] = buf[k];
      tgt[(size_t)i * T + k] = n ? buf[k + 1] : -1;
      counted += n;
    }
  }
  const double sum = g.forward_backward(store, tok.data(), tgt.data(), B, T, static_cast<float>(1.0 / counted));
  double sq = 0;
  for (float x : grads) sq += double(x) * x;
  const auto& st = s.steps[0];
  EXPECT_EQ(st.targets, counted);
  EXPECT_NEAR(st.lm_loss, sum / counted, 1e-6 * sum / counted);
  EXPECT_NEAR(st.grad_norm, std::sqrt(sq), 1e-5 * std::sqrt(sq));
  EXPECT_GT(std::fabs(st.lm_loss - sum / (double(B) * T)), 0.1 * st.lm_loss) << "the mean must not be over B*T";
}

}  // namespace

TEST(LossMask, StepEqualsTheModelOnMaskedTargets) {
  engine::TrainConfig c = test::tiny_gpt(1, 2, 4);
  c.lr_warmup_iters = 0;
  MaskedMock data(c.model.vocab_size, c.model.max_seq_length);
  check_step(data, c, [](int i, int k, const std::vector<int32_t>&) { return k >= MaskedMock::prompt(i); });
}

// Megatron's --eod-mask-loss over a dataset with its own mask (io::EodMaskedDataset), with documents
// inside the samples (--reset-attention-mask, --reset-position-ids: the trainer's model derives them
// as the hand-run one does): a target counts where the inner mask says so and its input token is
// not the end-of-document token. Token 0 plays end-of-document; the check needs it to occur.
TEST(LossMask, EodMaskOnTopOfTheDatasetsMask) {
  engine::TrainConfig c = test::tiny_gpt(1, 2, 4);
  c.lr_warmup_iters = 0;
  c.model.vocab_size = 7;  // small: token 0 appears in every sample
  c.model.reset_attention_mask = c.model.reset_position_ids = true;
  c.model.eod_token = 0;
  c.eod_mask_loss = true;
  auto inner = std::make_shared<MaskedMock>(c.model.vocab_size, c.model.max_seq_length);
  io::EodMaskedDataset data(inner, 0);
  int eods = 0;
  check_step(data, c, [&](int i, int k, const std::vector<int32_t>& b) {
    eods += b[k] == 0 && k >= MaskedMock::prompt(i);
    return k >= MaskedMock::prompt(i) && b[k] != 0;
  });
  EXPECT_GT(eods, 0) << "no end-of-document token where the inner mask counts: nothing was checked";
}

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
