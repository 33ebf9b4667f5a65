// LoRA in training, under mpirun (1 or 2 ranks).
//
// - Only the adapters (on the four linears and the embedding) move: after training every base
//   tensor is bitwise its initial value, every B has moved; the model states are the adapters' (fp32: 4 + 4 + 8 bytes each) beside the frozen
//   base held once (4 bytes, or 2 in bf16 runs), as measured by the store; --estimate-memory's
//   planner (parallel::plan_memory) gives the same bytes.
// - A checkpoint holds the adapters only (and their moments), and resuming from it at iteration 4
//   equals the straight run bitwise.
// - The ZeRO-Offload bridge (DeviceStore, as a GPU run uses it) equals the plain store bitwise (one
//   micro-step per step).
// - On 2 ranks, data parallel with ZeRO 0, 2 and 3 (and 2, 3 with the position embedding training
//   in its own block) equals the one-rank run within 1e-5 relative on every loss (the adapters'
//   gradients are reduced in another order: fp32 rounding, ~1e-7).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "hpct/comm/process_grid.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "hpct/io/h5_file.hpp"
#include "hpct/parallel/memory_estimate.hpp"
#include "mpi_gtest_main.hpp"
#include "tiny_gpt.hpp"

using namespace hpct;
namespace fs = std::filesystem;

using test::world;

namespace {

engine::TrainConfig tiny(int iters) {
  engine::TrainConfig c = test::tiny_gpt(iters, 2, 4);
  c.lr = 1e-2;  // adapters from B = 0 move visibly in a few steps
  c.lr_decay_iters = 10;
  c.model.lora.rank = 4;
  c.model.lora.alpha = 8;
  c.model.lora.targets = 0x1F;  // the four linears and the embedding
  return c;
}

struct LoraRun {
  std::vector<double> losses;
  std::vector<float> params, initial;
  engine::Trainer::MemoryReport mem;
  std::string loaded;
  size_t base = 0, adapters = 0;  // elements of the model's layout
  double to_device = 0;           // via_device_store: parameter bytes DeviceStore copied in
  ParamLayout layout;
  model::GptConfig model;
};

// What --estimate-memory plans for this run at ZeRO stage 0 (ranks as host processes).
uint64_t planned_states(const LoraRun& r, parallel::StatePrecision p) {
  parallel::ClusterShape c;
  c.devices_per_node = world().size();
  c.host_bytes = 1ull << 40;
  return parallel::plan_memory(parallel::gpt_size(r.model), p, 0, parallel::Offload::none, c).device_states;
}

LoraRun train(engine::TrainConfig c, const comm::Communicator& comm) {
  comm::ProcessGrid grid(comm, 1, 1);
  c.finalize(grid.dp().size());
  io::MockGptDataset data(c.model.vocab_size, c.model.max_seq_length, 7);
  engine::Trainer t(c, grid);
  LoraRun r;
  r.initial = t.gather_full_params();
  r.loaded = t.load_checkpoint();
  auto s = t.train(data, nullptr);
  for (auto& st : s.steps) r.losses.push_back(st.lm_loss);
  r.params = t.gather_full_params();
  r.mem = t.memory_report();
  r.layout = t.model().layout();
  r.model = c.model;
  if (t.device_store()) r.to_device = t.device_store()->bytes_to_device();
  for (const auto& x : t.model().layout().tensors())
    (x.name.find(".lora_") != std::string::npos ? r.adapters : r.base) += x.numel;
  return r;
}

bool is_adapter(const TensorSpec& t) { return t.name.find(".lora_") != std::string::npos; }

void expect_close(const LoraRun& a, const LoraRun& ref, const char* what) {
  ASSERT_EQ(a.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], ref.losses[i], 1e-5 * std::fabs(ref.losses[i])) << what << ", step " << i + 1;
}
}  // namespace

TEST(LoraTraining, OnlyTheAdaptersMove) {
  const engine::TrainConfig c = tiny(6);
  const LoraRun r = train(c, world());
  ASSERT_EQ(r.params.size(), r.layout.numel());
  for (const auto& t : r.layout.tensors()) {
    const bool moved = std::memcmp(r.params.data() + t.offset, r.initial.data() + t.offset, t.numel * 4) != 0;
    if (is_adapter(t)) {
      EXPECT_TRUE(moved) << t.name << " did not train";
    } else {
      EXPECT_FALSE(moved) << t.name << " is frozen but changed";
    }
  }
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(r.losses.back(), r.losses.front());
  EXPECT_GT(r.adapters, 0u);
  EXPECT_EQ(r.adapters, 2u * 4 * 16 * 32 + 4 * (104 + 32)) << "rank x (4 + 2 + 5 + 5) x hidden per layer, rank x (Vp + hidden)";
  EXPECT_EQ(r.mem.frozen, r.base * sizeof(float));
  // Stage 0 on world().size() ranks: every rank holds the adapters' whole fp32 states.
  EXPECT_EQ(r.mem.params + r.mem.grads + r.mem.optimizer, r.adapters * 16);
  EXPECT_EQ(planned_states(r, parallel::StatePrecision::fp32), r.mem.params + r.mem.grads + r.mem.optimizer + r.mem.frozen)
      << "--estimate-memory plans what the store holds";
}

// --lora-modules-to-save: the module named trains in full (and is in the model states, as
// --estimate-memory plans them), the rest of the base stays. final_layernorm: 2 x 32 parameters;
// position_embedding: 16 x 32, in a block of its own, the word embedding staying frozen.
static void expect_module_trains(model::LoraConfig::Module module, const char* trains, const char* stays, uint64_t extra) {
  engine::TrainConfig c = tiny(4);
  c.model.lora.modules_to_save = 1u << module;
  const LoraRun r = train(c, world());
  const auto& t = r.layout.find(trains);
  EXPECT_NE(std::memcmp(r.params.data() + t.offset, r.initial.data() + t.offset, t.numel * 4), 0) << trains << " trains";
  const auto& s = r.layout.find(stays);
  EXPECT_EQ(std::memcmp(r.params.data() + s.offset, r.initial.data() + s.offset, s.numel * 4), 0) << stays << " stays";
  EXPECT_EQ(r.mem.params + r.mem.grads + r.mem.optimizer, (r.adapters + extra) * 16);
  EXPECT_EQ(planned_states(r, parallel::StatePrecision::fp32), r.mem.params + r.mem.grads + r.mem.optimizer + r.mem.frozen)
      << "--estimate-memory plans what the store holds";
}

TEST(LoraTraining, AModuleToSaveTrainsInFull) {
  expect_module_trains(model::LoraConfig::final_layernorm, "final_layernorm.weight", "embedding.word_embeddings.weight",
                       2 * 32);
  expect_module_trains(model::LoraConfig::position_embeddings, "embedding.position_embeddings.weight",
                       "embedding.word_embeddings.weight", 16 * 32);
}

TEST(LoraTraining, Bf16KeepsTheFrozenBaseIn16Bits) {
  engine::TrainConfig c = tiny(3);
  c.precision = engine::PrecisionMode::bf16;
  const LoraRun r = train(c, world());
  EXPECT_EQ(r.mem.frozen, r.base * 2);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_EQ(planned_states(r, parallel::StatePrecision::mixed), r.mem.params + r.mem.grads + r.mem.optimizer + r.mem.frozen)
      << "--estimate-memory plans what the store holds";
}

TEST(LoraTraining, CheckpointHoldsTheAdaptersAndResumesExactly) {
  const auto& w = world();
  const std::string d = test::shared_dir(w, "lora");
  const LoraRun whole = train(tiny(8), w);
  auto first = tiny(4);
  first.save_dir = d;
  train(first, w);
  if (w.rank() == 0) {
    io::H5File f = io::H5File::open(engine::Checkpointer::resolve(d), io::H5File::Mode::read, MPI_COMM_SELF);
    const ParamLayout stored = model::Gpt::layout_for(first.model).trained();
    EXPECT_EQ(f.list_datasets().size(), 3 * stored.tensors().size()) << "params and two moments per adapter";
    for (const auto& n : f.list_datasets()) EXPECT_NE(n.find("/lora_"), std::string::npos) << n;
  }
  auto rest = tiny(8);
  rest.load_path = d;
  const LoraRun cont = train(rest, w);
  ASSERT_FALSE(cont.loaded.empty());
  ASSERT_EQ(cont.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(cont.losses[i], whole.losses[4 + i]) << "step " << i + 5;
  EXPECT_EQ(std::memcmp(cont.params.data(), whole.params.data(), whole.params.size() * 4), 0);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

// One micro-step per step: with several, fp32 gradients add in another order on the two routes
// (the embedding adapter's gradient has two contributions per micro-step; test_zero explains).
TEST(LoraTraining, TheDeviceStoreBridgeEqualsThePlainStore) {
  auto c = tiny(4);
  c.micro_batch = c.global_batch / world().size();
  const LoraRun plain = train(c, world());
  c.via_device_store = true;
  const LoraRun bridged = train(c, world());
  EXPECT_EQ(bridged.losses, plain.losses);
  for (const auto& t : plain.layout.tensors())
    EXPECT_EQ(std::memcmp(bridged.params.data() + t.offset, plain.params.data() + t.offset, t.numel * 4), 0) << t.name;
  // The frozen base crosses once (it does not change); the blocks that train once per step (fp32).
  double frozen = 0, trained = 0;
  for (const auto& b : bridged.layout.blocks()) (b.trains ? trained : frozen) += 4.0 * double(b.numel);
  EXPECT_GT(frozen, 0.0);
  EXPECT_EQ(bridged.to_device, frozen + trained * double(bridged.losses.size()));
}

TEST(LoraTraining, DataParallelZeroMatchesOneRank) {
  const auto& w = world();
  if (w.size() == 1) GTEST_SKIP() << "needs 2 ranks";
  const LoraRun one = train(tiny(6), comm::Communicator::self());
  for (int stage : {0, 2, 3}) {
    auto c = tiny(6);
    c.zero.stage = stage;
    c.zero.param_persistence_threshold = 0;  // stage 3 gathers every adapter block
    expect_close(train(c, w), one, ("DP=2 ZeRO-" + std::to_string(stage)).c_str());
  }
  // The position embedding in a block of its own (--lora-modules-to-save position_embedding).
  auto pc = tiny(6);
  pc.model.lora.modules_to_save = 1u << model::LoraConfig::position_embeddings;
  const LoraRun pone = train(pc, comm::Communicator::self());
  for (int stage : {2, 3}) {
    auto c = pc;
    c.zero.stage = stage;
    c.zero.param_persistence_threshold = 0;
    expect_close(train(c, w), pone, ("positions, DP=2 ZeRO-" + std::to_string(stage)).c_str());
  }
}

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
