// Tensor-parallel training against the one-rank run, under mpirun with 2 or 4 ranks.
//
// Every layout the world can hold with T = 2 or 4 (data-parallel size world / T), ZeRO stages 0-3
// and NVMe offload, trains the tiny GPT (and a tiny MoE, with EP = 2 beside T = 2 on 4 ranks) for
// 10 steps; every rank also runs the one-rank reference
// (over MPI_COMM_SELF). Tolerance: losses within 1e-5 relative at every step, the first step's
// gradient norm within 1e-5 relative, the final weights (tensor-parallel parts assembled) within
// 1e-5 absolute (measured: losses ~5e-9 relative, weights ~1e-6). Not bitwise: the row-parallel linears and the all-reduced input gradients sum
// partial products per rank and then across ranks, the vocab-parallel softmax sums per slice, and
// data parallelism sums gradients in MPI's order: fp32 rounding (~1e-7 relative per sum), which
// Adam carries into the weights at that level times the learning rate (1e-3). A missing
// all-reduce, a bias added T times, or a replica counted T times in the norm moves the loss in the
// 2nd-3rd digit. Replicas (norms, position embeddings, row-parallel biases, experts) must stay
// bitwise identical across the tensor-parallel group.
//
// Checkpoints: a T=2 run saves; T=1 and T=4 runs (and one rank alone) load it with every tensor
// bitwise what was saved, and continue within the tolerance above; at the same layout a resume is
// bitwise. Bad layouts are refused naming the flag.
//
// Sequence parallelism (norms on 1/T of the tokens, all-gather / reduce-scatter) against the same
// one-rank run, same tolerance: the norms' weight gradients become per-rank partial sums added
// across ranks, another fp32 order. With recomputation, ZeRO, and the MoE.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "hpct/comm/process_grid.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "mpi_gtest_main.hpp"
#include "tiny_gpt.hpp"

using namespace hpct;
namespace fs = std::filesystem;

using test::shared_dir;
using test::world;

namespace {

engine::TrainConfig tiny(int iters, bool moe = false) {
  engine::TrainConfig c = test::tiny_gpt(iters, 2, 12);  // 4 heads, vocab 101 (padded 104)
  c.lr_decay_iters = 10;  // one schedule whatever train_iters: a stopped run continues as a straight one
  if (moe) {
    c.model.moe.num_experts = {4};
    c.model.moe.expert_interval = 2;
    c.model.moe.second_expert_sampling = false;
  }
  return c;
}

struct TpRun {
  std::vector<double> losses, grad_norms;
  std::vector<float> params;  // every tensor whole
  bool replicas_equal = true;
  double tp_bytes = 0;
  std::string loaded;
};

TpRun train(engine::TrainConfig c, const comm::Communicator& comm, int tp, int ep = 1) {
  c.model.tensor_parallel = tp;
  comm::ProcessGrid grid(comm, tp, ep);
  c.finalize(grid.dp().size());
  io::MockGptDataset data(c.model.vocab_size, c.model.max_seq_length, 7);
  engine::Trainer t(c, grid);
  TpRun r;
  r.loaded = t.load_checkpoint();
  auto s = t.train(data, nullptr);
  for (auto& st : s.steps) r.losses.push_back(st.lm_loss), r.grad_norms.push_back(st.grad_norm);
  r.params = t.gather_full_params();
  // Replicas: the same bits on every rank of the tensor-parallel group.
  const std::vector<float> local = t.gather_params();
  for (const auto& ts : t.model().layout().tensors()) {
    if (ts.partitioned()) continue;
    std::vector<float> mine(local.begin() + ts.offset, local.begin() + ts.offset + ts.numel), first = mine;
    grid.tp().bcast_bytes(first.data(), first.size() * 4, 0);
    r.replicas_equal = r.replicas_equal && std::memcmp(first.data(), mine.data(), mine.size() * 4) == 0;
  }
  r.replicas_equal = grid.world().allreduce_min(r.replicas_equal ? 1.0 : 0.0) > 0.5;
  r.tp_bytes = t.model().tensor_parallel().activation_bytes();
  return r;
}

void expect_close(const TpRun& got, const TpRun& ref, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  double rel = 0;
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::fabs(ref.losses[i])) << what << ", step " << i + 1;
    rel = std::max(rel, std::fabs(got.losses[i] - ref.losses[i]) / std::fabs(ref.losses[i]));
  }
  if (!ref.grad_norms.empty())
    EXPECT_NEAR(got.grad_norms[0], ref.grad_norms[0], 1e-5 * ref.grad_norms[0]) << what << ", step 1 gradient norm";
  ASSERT_EQ(got.params.size(), ref.params.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < got.params.size(); ++i) worst = std::max(worst, (double)std::fabs(got.params[i] - ref.params[i]));
  EXPECT_LE(worst, 1e-5) << what << ": largest weight difference";
  if (world().rank() == 0) std::printf("%s: loss within %.1e relative, weights within %.1e\n", what.c_str(), rel, worst);
  EXPECT_TRUE(got.replicas_equal) << what << ": a replica differs across the tensor-parallel group";
}

}  // namespace

TEST(TensorParallelTraining, GptMatchesOneRankAtEveryLayoutAndStage) {
  const auto& w = world();
  const TpRun ref = train(tiny(10), comm::Communicator::self(), 1);
  for (int tp : {2, 4}) {
    if (w.size() % tp) continue;
    for (int stage : {0, 1, 2, 3}) {
      auto c = tiny(10);
      c.zero.stage = stage;
      c.zero.param_persistence_threshold = 0;  // stage 3: every block partitioned and gathered
      const TpRun got = train(c, w, tp);
      expect_close(got, ref, "T=" + std::to_string(tp) + " x DP=" + std::to_string(w.size() / tp) + " ZeRO-" + std::to_string(stage));
      // Megatron's count per micro-step: 4 all-reduces of (B*s, h) per layer, the embedding's and
      // the LM head's input gradient; 10 steps of 12 / DP micro-batches of 1 x 16 tokens, h = 32.
      const double micro = 10.0 * 12 / (w.size() / tp);
      EXPECT_EQ(got.tp_bytes, micro * (4 * 2 + 2) * 16 * 32 * sizeof(float));
    }
  }
}

// ZeRO-Infinity: the optimizer states (stage 2) or those and the parameters (stage 3) of each
// rank's parts in its own swap file.
TEST(TensorParallelTraining, NvmeOffloadMatchesOneRank) {
  const auto& w = world();
  const TpRun ref = train(tiny(10), comm::Communicator::self(), 1);
  const std::string d = shared_dir(w, "nvme");
  for (int stage : {2, 3}) {
    auto c = tiny(10);
    c.zero.stage = stage;
    c.zero.offload_optimizer.device = "nvme";
    c.zero.offload_optimizer.nvme_path = d;
    if (stage == 3) c.zero.offload_param.device = "nvme", c.zero.offload_param.nvme_path = d;
    expect_close(train(c, w, 2), ref, "T=2 ZeRO-" + std::to_string(stage) + " NVMe offload");
  }
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

TEST(TensorParallelTraining, MoeMatchesOneRank) {
  const auto& w = world();
  const TpRun ref = train(tiny(10, true), comm::Communicator::self(), 1);
  expect_close(train(tiny(10, true), w, 2), ref, "MoE T=2");
  if (w.size() == 4) {
    expect_close(train(tiny(10, true), w, 4), ref, "MoE T=4");
    auto c = tiny(10, true);
    c.moe_ep = 2;
    expect_close(train(c, w, 2, 2), ref, "MoE T=2 x EP=2");
  }
}

TEST(TensorParallelTraining, SequenceParallelMatchesOneRank) {
  const auto& w = world();
  const TpRun ref = train(tiny(10), comm::Communicator::self(), 1);
  for (int tp : {2, 4}) {
    if (w.size() % tp) continue;
    for (int stage : {1, 3}) {
      auto c = tiny(10);
      c.model.sequence_parallel = true;
      c.zero.stage = stage;
      c.recompute_activations = stage == 3;
      const TpRun got = train(c, w, tp);
      expect_close(got, ref, "T=" + std::to_string(tp) + " sequence-parallel ZeRO-" + std::to_string(stage) +
                                 (c.recompute_activations ? " recompute" : ""));
      // Each all-reduce became an all-gather and a reduce-scatter of the same (B*s, h) buffer; with
      // recomputation the forward's 4 per layer run twice (docs/tensor-parallel.md).
      const double micro = 10.0 * 12 / (w.size() / tp), per_layer = c.recompute_activations ? 12 : 8;
      EXPECT_EQ(got.tp_bytes, micro * (per_layer * 2 + 4) * 16 * 32 * sizeof(float));
    }
  }
  const TpRun moe_ref = train(tiny(10, true), comm::Communicator::self(), 1);
  auto m = tiny(10, true);
  m.model.sequence_parallel = true;
  expect_close(train(m, w, 2), moe_ref, "MoE T=2 sequence-parallel");
  if (w.size() == 4) {
    m.moe_ep = 2;
    expect_close(train(m, w, 2, 2), moe_ref, "MoE T=2 x EP=2 sequence-parallel");
  }
}

TEST(TensorParallelTraining, CheckpointMovesBetweenSizes) {
  const auto& w = world();
  const comm::Communicator self = comm::Communicator::self();
  const std::string d = shared_dir(w, "ckpt");
  auto c = tiny(3);
  c.save_dir = d;
  const TpRun saved = train(c, w, 2);  // T=2 saves iteration 3
  auto straight = tiny(6);
  const TpRun whole = train(straight, w, 2);  // T=2 without a stop
  auto cont = [&](int tp, const comm::Communicator& comm) {
    auto k = tiny(6);
    k.load_path = d;
    return train(k, comm, tp);
  };
  // At the same layout: bitwise.
  const TpRun same = cont(2, w);
  ASSERT_FALSE(same.loaded.empty());
  ASSERT_EQ(same.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(same.losses[i], whole.losses[3 + i]) << "step " << i + 4;
  EXPECT_EQ(std::memcmp(same.params.data(), whole.params.data(), whole.params.size() * 4), 0);
  // At another T (and one rank alone): the saved weights bitwise, then the same training.
  auto loaded_only = [&](int tp, const comm::Communicator& comm) {
    auto k = tiny(3);
    k.load_path = d;
    return train(k, comm, tp);
  };
  std::vector<std::pair<int, const comm::Communicator*>> others = {{1, &w}, {1, &self}};
  if (w.size() == 4) others.push_back({4, &w});
  for (auto [tp, comm] : others) {
    const std::string what = "T=2 checkpoint at T=" + std::to_string(tp) + " on " + std::to_string(comm->size()) + " ranks";
    const TpRun at = loaded_only(tp, *comm);
    EXPECT_EQ(at.losses.size(), 0u);
    EXPECT_EQ(std::memcmp(at.params.data(), saved.params.data(), saved.params.size() * 4), 0) << what;
    TpRun next = cont(tp, *comm);
    TpRun ref = whole;
    ref.losses.erase(ref.losses.begin(), ref.losses.begin() + 3);
    ref.grad_norms.clear();
    expect_close(next, ref, what);
  }
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

// LoRA (model/lora.cpp): the adapters split with the linears they adapt, on a frozen base. Every
// linear and the embedding adapted, the final norm trained in full; T = 2 and 4 with ZeRO 0 and 2,
// and sequence parallelism with recomputation (the embedding's adapters then see 1/T of the rows),
// against the one-rank run, the tolerance above: the adapters' low-rank products are summed over
// the group, another fp32 order. A missing sum, or an update added on every rank, moves the loss in
// the 3rd digit once B has left zero (step 2). The replicated factors must stay bitwise equal
// across the group. Then the position embedding trained alone (the word embedding frozen, its
// gradient not computed), and a T=2 checkpoint of the adapters continued at T=1 and T=4.
TEST(TensorParallelTraining, LoraMatchesOneRank) {
  const auto& w = world();
  auto lora = [](int iters, unsigned modules) {
    auto c = tiny(iters);
    c.model.lora.rank = 4;
    c.model.lora.alpha = 8;
    c.model.lora.targets = 0x1F;
    c.model.lora.modules_to_save = modules;
    return c;
  };
  const unsigned norm = 1u << model::LoraConfig::final_layernorm, pos = 1u << model::LoraConfig::position_embeddings;
  const TpRun ref = train(lora(10, norm), comm::Communicator::self(), 1);
  ASSERT_GT(std::fabs(ref.losses[0] - ref.losses.back()), 1e-3) << "the adapters must train for the comparison to mean anything";
  for (int tp : {2, 4}) {
    if (w.size() % tp) continue;
    for (int stage : {0, 2}) {
      auto c = lora(10, norm);
      c.zero.stage = stage;
      expect_close(train(c, w, tp), ref, "LoRA T=" + std::to_string(tp) + " ZeRO-" + std::to_string(stage));
    }
    auto c = lora(10, norm);
    c.model.sequence_parallel = true;
    c.recompute_activations = true;
    c.zero.stage = 1;
    expect_close(train(c, w, tp), ref, "LoRA T=" + std::to_string(tp) + " sequence-parallel recompute ZeRO-1");
  }
  expect_close(train(lora(10, pos), w, 2), train(lora(10, pos), comm::Communicator::self(), 1), "LoRA T=2, positions trained");

  const std::string d = shared_dir(w, "lora_ckpt");
  auto first = lora(5, norm);
  first.save_dir = d;
  train(first, w, 2);
  std::vector<int> sizes = {1};
  if (w.size() == 4) sizes.push_back(4);
  for (int tp : sizes) {
    auto k = lora(10, norm);
    k.load_path = d;
    TpRun next = train(k, w, tp), rest = ref;
    ASSERT_FALSE(next.loaded.empty());
    rest.losses.erase(rest.losses.begin(), rest.losses.begin() + 5);
    rest.grad_norms.clear();
    expect_close(next, rest, "LoRA T=2 checkpoint continued at T=" + std::to_string(tp));
  }
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

// TED: the three 4-rank grids of tensor x expert x data parallelism (T=2 x E=2, T=2 x D=2 and
// E=2 x D=2) against one rank, ZeRO 0-3 on the full grid; duplicate token dropping (on by
// default) against its absence bitwise (it moves rows, not arithmetic: test_ted.cpp); and a T=2 x
// E=2 checkpoint resumed on one rank and at T=1 x E=1 x D=4; the same with experts split over the
// tensor-parallel group (--enable-expert-tensor-parallelism).
TEST(TensorParallelTraining, TedGridsMatchOneRank) {
  const auto& w = world();
  if (w.size() != 4) GTEST_SKIP() << "the TED grids need 4 ranks";
  const TpRun ref = train(tiny(10, true), comm::Communicator::self(), 1);
  for (int stage : {0, 1, 2, 3}) {
    auto c = tiny(10, true);
    c.zero.stage = stage;
    c.zero.param_persistence_threshold = 0;
    const TpRun got = train(c, w, 2, 2);
    expect_close(got, ref, "MoE T=2 x E=2 ZeRO-" + std::to_string(stage));
    if (stage != 1) continue;
    c.model.moe.drop_duplicate_tokens = false;
    const TpRun plain = train(c, w, 2, 2);
    EXPECT_EQ(plain.losses, got.losses) << "duplicate token dropping changed a loss";
    EXPECT_EQ(std::memcmp(plain.params.data(), got.params.data(), got.params.size() * 4), 0)
        << "duplicate token dropping changed a weight";
  }
  auto c = tiny(10, true);
  c.zero.stage = 2;
  expect_close(train(c, w, 2, 1), ref, "MoE T=2 x D=2 ZeRO-2");
  expect_close(train(c, w, 1, 2), ref, "MoE E=2 x D=2 ZeRO-2");
  // --enable-expert-tensor-parallelism: experts split like the dense MLP, ZeRO over their parts.
  c.model.moe.expert_tensor_parallel = true;
  for (int stage : {1, 3}) {
    c.zero.stage = stage;
    expect_close(train(c, w, 2, 2), ref, "MoE T=2 x E=2 expert-tensor-parallel ZeRO-" + std::to_string(stage));
  }
  c.zero.stage = 2;
  expect_close(train(c, w, 2, 1), ref, "MoE T=2 x D=2 expert-tensor-parallel ZeRO-2");
  // Offload on the grid: CPU optimizer (ZeRO-2), and NVMe optimizer and parameters (ZeRO-3), each
  // rank's dense and expert engines with their own swap files.
  const std::string d = shared_dir(w, "ted_nvme");
  auto o = c;
  o.zero.offload_optimizer.device = "cpu";
  expect_close(train(o, w, 2, 2), ref, "MoE T=2 x E=2 expert-tensor-parallel ZeRO-2 CPU offload");
  o.zero.stage = 3;
  o.zero.offload_optimizer.device = o.zero.offload_param.device = "nvme";
  o.zero.offload_optimizer.nvme_path = o.zero.offload_param.nvme_path = d;
  expect_close(train(o, w, 2, 2), ref, "MoE T=2 x E=2 expert-tensor-parallel ZeRO-3 NVMe offload");
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
  // Recomputation replaying from the forward's communication (CAC), sequence parallel too.
  c.recompute_activations = c.communication_aware_checkpointing = true;
  expect_close(train(c, w, 2, 2), ref, "MoE T=2 x E=2 expert-tensor-parallel ZeRO-2 recompute CAC");
  c.model.sequence_parallel = true;
  c.model.moe.expert_tensor_parallel = false;
  expect_close(train(c, w, 2, 2), ref, "MoE T=2 x E=2 sequence-parallel ZeRO-2 recompute CAC");
}

TEST(TensorParallelTraining, TedCheckpointResumesOnOneRank) {
  const auto& w = world();
  if (w.size() != 4) GTEST_SKIP() << "the TED grid needs 4 ranks";
  const std::string d = shared_dir(w, "ted");
  auto c = tiny(3, true);
  c.model.moe.expert_tensor_parallel = true;  // saved as parts; loaded whole at T=1
  c.save_dir = d;
  const TpRun saved = train(c, w, 2, 2);
  auto straight = tiny(6, true);
  straight.model.moe.expert_tensor_parallel = true;
  const TpRun whole = train(straight, w, 2, 2);
  auto cont = [&](int tp, int ep, const comm::Communicator& comm, int iters) {
    auto k = tiny(iters, true);
    k.model.moe.expert_tensor_parallel = tp > 1;
    k.load_path = d;
    return train(k, comm, tp, ep);
  };
  const TpRun same = cont(2, 2, w, 6);
  ASSERT_EQ(same.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(same.losses[i], whole.losses[3 + i]) << "step " << i + 4;
  TpRun ref = whole;
  ref.losses.erase(ref.losses.begin(), ref.losses.begin() + 3);
  ref.grad_norms.clear();
  const comm::Communicator self = comm::Communicator::self();
  for (const comm::Communicator* comm : {&self, &w}) {
    const std::string what = "T=2 x E=2 expert-tensor-parallel checkpoint on " + std::to_string(comm->size()) + " rank(s) at T=1 x E=1";
    const TpRun at = cont(1, 1, *comm, 3);
    EXPECT_EQ(std::memcmp(at.params.data(), saved.params.data(), saved.params.size() * 4), 0) << what;
    expect_close(cont(1, 1, *comm, 6), ref, what);
  }
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

TEST(TensorParallelTraining, BadLayoutsNameTheFlag) {
  const auto& w = world();
  auto c = tiny(1);
  c.model.num_heads = 2;  // 2 heads cannot split 4 ways
  c.model.tensor_parallel = 4;
  try {
    c.model.validate();
    FAIL() << "heads % T accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-model-parallel-size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--num-attention-heads 2"), std::string::npos) << e.what();
  }
  if (w.size() == 2 || w.size() == 4) {  // world not divisible by T
    try {
      comm::ProcessGrid g(w, 3, 1);
      FAIL() << "world " << w.size() << " accepted T=3";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--tensor-model-parallel-size"), std::string::npos) << e.what();
    }
  }
}

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
