// TED's MoE exchange on a tensor x expert grid (4 ranks: T = 2, E = 2), model level; and expert
// parallelism alone (E = 4): its all-to-all bytes against the formula from the routing stats.
//
// Duplicate token dropping changes who sends which rows, not what any expert computes: every
// expert still runs on all of its rows in the same order (the tensor-parallel group gathers the
// shares back before the GEMMs), so a model with it and one without, from the same weights and
// tokens, give bitwise the same loss and gradients. The bytes are checked against the formula:
// - all-to-all: the shares partition every run of rows, so the rows the T ranks of a
//   tensor-parallel group send with it sum to what one of them sends without (the counts
//   exchange, (E-1) x El ints per MoE layer, is the same for both);
// - the gathers: in each of the 4 exchanges per MoE layer (2 forward, 2 backward) a rank receives
//   every row of the output but its own share, so over the group they sum to (T-1) x the rows
//   that arrive: 2 x (rows routed here + rows this rank's experts receive), from the layer's stats.
// On a device backend (staged_cpu_ops.hpp: the CPU ops behind host_memory() == false) the exchanges
// go through host buffers: bitwise the same loss, gradients and bytes as on the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../engine/mpi_gtest_main.hpp"
#include "hpct/comm/process_grid.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/model/gpt.hpp"
#include "staged_cpu_ops.hpp"

using namespace hpct;
using test::world;

namespace {

model::GptConfig tiny(bool dtd, int topk, bool etp = false) {
  model::GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_heads = 4;
  c.max_seq_length = 8;
  c.vocab_size = 29;
  c.vocab_multiple = 8;
  c.init_std = 0.2;
  c.tensor_parallel = 2;
  c.moe.num_experts = {4};
  c.moe.expert_interval = 2;
  c.moe.topk = topk;
  c.moe.second_expert_sampling = false;
  c.moe.train_capacity_factor = 0.75;  // some routes dropped, uneven loads: shares of odd runs
  c.moe.min_capacity = 1;
  c.moe.drop_duplicate_tokens = dtd;
  c.moe.expert_tensor_parallel = etp;
  return c;
}

struct Result {
  double loss = 0, a2a = 0, gathered = 0, tp_bytes = 0;
  long long calls = 0;
  size_t kept = 0;
  std::vector<float> grads;
  std::vector<long long> load;
};

// ops: the backend (nullptr: the CPU's).
Result run(const comm::ProcessGrid& grid, bool dtd, int topk, bool etp = false, bool recompute = false, bool cac = false,
           bool sp = false, kernels::OpsBackend* ops = nullptr) {
  auto cfg = tiny(dtd, topk, etp);
  cfg.sequence_parallel = sp;
  model::Gpt g(cfg, kernels::Precision::fp32, recompute, ops, &grid.ep(), &grid.tp());
  g.set_communication_aware_checkpointing(cac);
  EXPECT_EQ(g.drops_duplicate_tokens(), dtd);
  std::vector<float> p(g.layout().numel()), d(p.size(), 0.0f);
  g.init_params(p.data(), 42);
  // Each expert-parallel rank its own tokens (the tensor-parallel pair the same ones).
  const int B = 2, S = 8;
  std::vector<int32_t> tok(B * S), tgt(B * S);
  Rng rng(7 + grid.ep().rank());
  for (int i = 0; i < B * S; ++i) tok[i] = (int)rng.below(29), tgt[i] = (int)rng.below(29);
  model::FlatParamStore store(g.layout(), p.data(), d.data());
  g.set_routing_seed(3 + grid.ep().rank());
  Result r;
  r.loss = g.forward_backward(store, tok.data(), tgt.data(), B, S, 0.05f);
  r.grads = d;
  r.a2a = g.alltoall_bytes();
  r.gathered = g.moe_tp_bytes();
  r.load = g.moe_stats().at(0).load;
  r.calls = g.alltoall_calls();
  r.kept = g.kept_for_replay_bytes();
  r.tp_bytes = g.tensor_parallel().activation_bytes();
  return r;
}

TEST(Ted, DuplicateTokenDroppingChangesNoBitAndDividesTheAllToAll) {
  const auto& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks (T = 2 x E = 2)";
  comm::ProcessGrid grid(w, 2, 2);
  for (int topk : {1, 2}) {
    const Result on = run(grid, true, topk), off = run(grid, false, topk);
    EXPECT_EQ(on.loss, off.loss) << "top-" << topk;
    ASSERT_EQ(on.grads.size(), off.grads.size());
    EXPECT_EQ(std::memcmp(on.grads.data(), off.grads.data(), on.grads.size() * 4), 0) << "top-" << topk << " gradients";

    const int C = 16, El = 2, T = 2, E = 2;
    const double counts = double(E - 1) * El * sizeof(int);  // one counts exchange, forward
    double on_rows = on.a2a - counts, off_rows = off.a2a - counts, sum_on = on_rows;
    grid.tp().allreduce_sum(&sum_on, 1);
    EXPECT_EQ(sum_on, off_rows) << "top-" << topk << ": the shares do not partition the rows";
    EXPECT_GT(off_rows, 0.0);
    EXPECT_LT(on_rows, off_rows);
    if (w.rank() == 0)
      std::printf("top-%d: all-to-all row bytes per rank %.0f with dropping, %.0f without (%.3fx)\n", topk, on_rows,
                  off_rows, off_rows / on_rows);

    // Rows routed from here (S) and rows that reach this rank's experts (R), from the routing stats.
    std::vector<double> load(on.load.begin(), on.load.end());
    double sent = 0;
    for (double v : load) sent += v;
    grid.ep().allreduce_sum(load.data(), load.size());
    double received = 0;
    for (int j = 0; j < El; ++j) received += load[grid.ep().rank() * El + j];
    double gathered = on.gathered;
    grid.tp().allreduce_sum(&gathered, 1);
    EXPECT_EQ(gathered, (T - 1) * 2.0 * (sent + received) * C * sizeof(float)) << "top-" << topk;
    EXPECT_EQ(off.gathered, 0.0);
  }
}

// Tensor-parallel experts: the partial outputs (and input gradients) are reduce-scattered into the
// shares with dropping, all-reduced without. At T = 2 either sums two numbers, a + b = b + a
// bitwise, so the two still agree exactly. Bytes per rank in the MoE tensor-parallel collectives:
// with dropping, a reduce-scatter of the outputs going back (each rank sends the others' shares) and
// the all-gathers as above; without, a ring all-reduce of them, 2(T-1)/T x the rows.
TEST(Ted, ExpertTensorParallelWithAndWithoutDropping) {
  const auto& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks (T = 2 x E = 2)";
  comm::ProcessGrid grid(w, 2, 2);
  for (int topk : {1, 2}) {
    const Result on = run(grid, true, topk, true), off = run(grid, false, topk, true);
    EXPECT_EQ(on.loss, off.loss) << "top-" << topk;
    EXPECT_EQ(std::memcmp(on.grads.data(), off.grads.data(), on.grads.size() * 4), 0) << "top-" << topk << " gradients";
    const double row = 16 * sizeof(float);
    std::vector<double> load(on.load.begin(), on.load.end());
    double sent = 0, received = 0;
    for (double v : load) sent += v;
    grid.ep().allreduce_sum(load.data(), load.size());
    for (int j = 0; j < 2; ++j) received += load[grid.ep().rank() * 2 + j];
    // Without dropping: the outputs (received rows) forward and the input gradients backward, all-reduced.
    EXPECT_DOUBLE_EQ(off.gathered, 2 * 2.0 * (2 - 1) / 2 * received * row) << "top-" << topk;
    // With: over the pair, the gathers as before plus reduce-scatters sending the other's share of the same rows.
    double pair = on.gathered;
    grid.tp().allreduce_sum(&pair, 1);
    EXPECT_EQ(pair, (2.0 * (sent + received) + 2.0 * received) * row) << "top-" << topk;
  }
}

// Communication-aware checkpointing: with recomputation the backward replays each layer from what
// the forward's collectives produced. Bitwise the same as recomputing (and as not recomputing);
// the MoE layer's row all-to-alls per step: 4 (2 forward, 2 backward) without recomputation or with
// CAC, 6 when the recompute runs the forward's 2 again; the tensor-parallel activation bytes are
// those of a run without recomputation (the replay skips g after attention and after the MLP).
TEST(Ted, CommunicationAwareCheckpointingReplaysWithoutCommunicating) {
  const auto& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks (T = 2 x E = 2)";
  comm::ProcessGrid grid(w, 2, 2);
  for (bool etp : {false, true})
    for (bool sp : {false, true}) {
      const std::string what = std::string(etp ? "expert-tensor-parallel" : "whole experts") + (sp ? ", sequence parallel" : "");
      const Result plain = run(grid, true, 2, etp, false, false, sp), re = run(grid, true, 2, etp, true, false, sp),
                   cac = run(grid, true, 2, etp, true, true, sp);
      EXPECT_EQ(plain.loss, re.loss) << what;
      EXPECT_EQ(re.loss, cac.loss) << what;
      EXPECT_EQ(plain.grads, re.grads) << what;
      EXPECT_EQ(re.grads, cac.grads) << what;
      EXPECT_EQ(plain.calls, 4) << what;
      EXPECT_EQ(re.calls, 6) << what;
      EXPECT_EQ(cac.calls, 4) << what;
      EXPECT_EQ(cac.a2a, plain.a2a) << what;
      EXPECT_EQ(cac.gathered, plain.gathered) << what;
      EXPECT_GT(re.a2a, plain.a2a) << what;
      // Without sequence parallelism the replay sends nothing over the tensor-parallel group; with
      // it the norms' all-gathers run again (2 per layer of (B*s, h), kept neither way).
      const double act = 2.0 * 8 * 16 * sizeof(float);
      EXPECT_EQ(cac.tp_bytes, plain.tp_bytes + (sp ? 2 * 2 * act : 0.0)) << what;
      EXPECT_GT(re.tp_bytes, cac.tp_bytes) << what;
      EXPECT_GT(cac.kept, 0u) << what;
      EXPECT_EQ(re.kept, 0u) << what;
    }
}

// Expert parallelism alone (E = 4 ranks, 8 experts): what a rank sends to the others in one step is
// its rows for the other ranks' experts (dispatch, and the same rows' gradients back in backward)
// plus the outputs of its own experts for the other ranks' rows (return, and their gradients in
// backward): 2 x (out + in) rows of C floats, plus one counts exchange of (E-1) x El ints, from
// every rank's routing stats.
TEST(Ted, ExpertParallelAllToAllBytesMatchTheFormula) {
  const auto& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  comm::ProcessGrid grid(w, 1, 4);
  for (int topk : {1, 2}) {
    auto c = tiny(true, topk);
    c.tensor_parallel = 1;
    c.moe.num_experts = {8};
    model::Gpt g(c, kernels::Precision::fp32, false, nullptr, &grid.ep(), nullptr);
    std::vector<float> p(g.layout().numel()), d(p.size(), 0.0f);
    g.init_params(p.data(), 42);
    std::vector<int32_t> tok(16), tgt(16);
    Rng rng(11 + w.rank());
    for (int i = 0; i < 16; ++i) tok[i] = (int)rng.below(29), tgt[i] = (int)rng.below(29);
    model::FlatParamStore store(g.layout(), p.data(), d.data());
    g.set_routing_seed(5 + w.rank());
    g.forward_backward(store, tok.data(), tgt.data(), 2, 8, 0.05f);
    const auto& load = g.moe_stats().at(0).load;
    const std::vector<double> all = grid.ep().allgather(std::vector<double>(load.begin(), load.end()));
    const int P = 4, El = 2, me = grid.ep().rank();
    double out = 0, in = 0;
    for (int e = 0; e < 8; ++e)
      if (e / El != me) out += all[me * 8 + e];
    for (int s = 0; s < P; ++s)
      for (int e = me * El; e < (me + 1) * El && s != me; ++e) in += all[s * 8 + e];
    EXPECT_EQ(g.alltoall_bytes(), 2 * (out + in) * 16 * sizeof(float) + (P - 1) * El * sizeof(int)) << "top-" << topk;
    EXPECT_GT(out + in, 0.0);
    EXPECT_EQ(g.alltoall_calls(), 4);
  }
}

// CAC keeps state between the forward and the replay: an evaluation in between (other tokens,
// shorter sequences, evaluation capacity) must not disturb it, nor a residual MoE with a jittered
// router. Two training steps with an evaluation between them, split experts, sequence parallel:
// the second step's gradients bitwise those of plain recomputation.
TEST(Ted, CommunicationAwareCheckpointingSurvivesAnEvaluationBetweenSteps) {
  const auto& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks (T = 2 x E = 2)";
  comm::ProcessGrid grid(w, 2, 2);
  std::vector<float> grads[2];
  double losses[2][3];
  for (int cac = 0; cac < 2; ++cac) {
    auto c = tiny(true, 2, true);
    c.sequence_parallel = true;
    c.moe.residual = true;
    c.moe.noisy_gate_policy = "Jitter";
    c.moe.eval_capacity_factor = 2.0;
    model::Gpt g(c, kernels::Precision::fp32, true, nullptr, &grid.ep(), &grid.tp());
    g.set_communication_aware_checkpointing(cac == 1);
    std::vector<float> p(g.layout().numel()), d(p.size(), 0.0f);
    g.init_params(p.data(), 42);
    model::FlatParamStore store(g.layout(), p.data(), d.data());
    Rng rng(9 + grid.ep().rank());
    auto batch = [&](int n) {
      std::vector<int32_t> t(n);
      for (auto& v : t) v = (int)rng.below(29);
      return t;
    };
    const auto t1 = batch(16), y1 = batch(16), te = batch(8), ye = batch(8), t2 = batch(16), y2 = batch(16);
    g.set_routing_seed(3 + grid.ep().rank());
    losses[cac][0] = g.forward_backward(store, t1.data(), y1.data(), 2, 8, 0.05f);
    losses[cac][1] = g.forward_loss(store, te.data(), ye.data(), 2, 4);
    std::fill(d.begin(), d.end(), 0.0f);
    g.set_routing_seed(4 + grid.ep().rank());
    losses[cac][2] = g.forward_backward(store, t2.data(), y2.data(), 2, 8, 0.05f);
    grads[cac] = d;
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(losses[0][i], losses[1][i]) << "loss " << i;
  EXPECT_EQ(grads[0], grads[1]) << "the second step's gradients";
}

TEST(Ted, NoDroppingWithoutBothAxes) {
  // Tensor parallelism alone (no all-to-all to save) or expert parallelism alone (no duplicates).
  const auto& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  comm::ProcessGrid tp_only(w, 4, 1), ep_only(w, 1, 4);
  auto c = tiny(true, 1);
  c.tensor_parallel = 4;
  model::Gpt a(c, kernels::Precision::fp32, false, nullptr, nullptr, &tp_only.tp());
  EXPECT_FALSE(a.drops_duplicate_tokens());
  c.tensor_parallel = 1;
  model::Gpt b(c, kernels::Precision::fp32, false, nullptr, &ep_only.ep(), nullptr);
  EXPECT_FALSE(b.drops_duplicate_tokens());
}

}  // namespace
TEST(Ted, StagedThroughTheHostAsOnADevice) {
  const auto& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks (T = 2 x E = 2)";
  comm::ProcessGrid grid(w, 2, 2);
  test::StagedCpuOps staged;
  for (bool etp : {false, true})
    for (bool sp : {false, true}) {
      const Result cpu = run(grid, true, 2, etp, false, false, sp), dev = run(grid, true, 2, etp, false, false, sp, &staged);
      EXPECT_EQ(dev.loss, cpu.loss) << "etp " << etp << " sp " << sp;
      EXPECT_EQ(std::memcmp(dev.grads.data(), cpu.grads.data(), cpu.grads.size() * 4), 0) << "etp " << etp << " sp " << sp;
      EXPECT_EQ(dev.a2a, cpu.a2a);
      EXPECT_EQ(dev.gathered, cpu.gathered);
      EXPECT_EQ(dev.tp_bytes, cpu.tp_bytes);
    }
  EXPECT_GT(staged.bytes_to_host(), 0.0);
}

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
