// Parallel HDF5 checkpoints (lib/engine/checkpointer, lib/io/h5_file), run under 1..3 ranks:
// exact resume (N straight steps == k + save + load + N-k, bitwise), universal load (a checkpoint
// written by N ranks loads on one and vice versa: parameters bitwise equal, training continues
// within the data-parallel tolerance of test_dp_equivalence), keep-last pruning, and refusal of a
// corrupted tensor, a truncated file and another architecture with a message naming the tensor or
// file. A full filesystem (a tiny tmpfs; root only, else skipped) fails the save cleanly and
// leaves the previous checkpoint and `latest` intact.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/mount.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "hpct/comm/process_grid.hpp"
#include "hpct/engine/checkpoint/checkpoint_state.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "mpi_gtest_main.hpp"
#include "tiny_gpt.hpp"
#include "hpct/io/h5_file.hpp"
#include "hpct/kernels/backend.hpp"

using namespace hpct;
namespace fs = std::filesystem;

using test::shared_dir;
using test::world;

namespace {

engine::TrainConfig tiny(int iters, int hidden = 32) {
  engine::TrainConfig c = test::tiny_gpt(iters, 2, 6, hidden);  // 6: divisible by 1, 2, 3
  // One schedule for every run length, so that a run continued with more iterations resumes the
  // checkpoint's schedule (a changed one is refused without --override-opt_param-scheduler).
  c.lr_decay_iters = 8;
  return c;
}

struct RunOut {
  std::vector<double> losses;  // per iteration trained in this run
  std::vector<float> params;
  std::string loaded;
};

RunOut train(engine::TrainConfig c, const comm::Communicator& comm) {
  comm::ProcessGrid grid(comm, 1, 1);
  c.finalize(grid.dp().size());
  io::MockGptDataset data(c.model.vocab_size, c.model.max_seq_length, 7);
  engine::Trainer t(c, grid);
  RunOut r;
  r.loaded = t.load_checkpoint();
  auto s = t.train(data, nullptr);
  for (const auto& st : s.steps) r.losses.push_back(st.lm_loss);
  r.params = t.gather_params();
  return r;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(H5Boxes, FlatRangesCoverExactlyTheirElements) {
  std::vector<std::vector<int64_t>> shapes = {{7}, {3, 5}, {2, 3, 4}, {4, 1, 3, 2}};
  for (const auto& shape : shapes) {
    uint64_t n = 1;
    for (auto d : shape) n *= d;
    for (uint64_t a = 0; a <= n; ++a)
      for (uint64_t b = a; b <= n; ++b) {
        std::vector<int> hit(n, 0);
        auto boxes = io::flat_range_boxes(shape, a, b);
        EXPECT_LE(boxes.size(), 2 * shape.size());
        uint64_t last = a;
        for (const auto& bx : boxes) {
          // enumerate the box row-major; it must continue the flat sequence
          std::vector<uint64_t> idx(shape.size(), 0);
          uint64_t cnt = 1;
          for (auto c : bx.count) cnt *= c;
          for (uint64_t k = 0; k < cnt; ++k) {
            uint64_t rem = k, flat = 0;
            for (size_t d = shape.size(); d-- > 0;) {
              idx[d] = bx.offset[d] + rem % bx.count[d];
              rem /= bx.count[d];
            }
            for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
            ASSERT_EQ(flat, last) << "box out of order";
            ++last;
            ++hit[flat];
          }
        }
        ASSERT_EQ(last, b);
      }
  }
}

// 8 steps straight == 4 steps + save + a new process state loading it + 4 steps, bitwise. With
// dropout too: its masks are a function of the seed and the samples, so nothing else need be saved.
void check_exact_resume(const char* tag, double dropout) {
  const auto& w = world();
  std::string d = shared_dir(w, tag);
  auto tiny = [dropout](int iters) {
    auto c = ::tiny(iters);
    c.model.attention_dropout = c.model.hidden_dropout = dropout;
    return c;
  };
  RunOut straight = train(tiny(8), w);
  auto c1 = tiny(8);
  c1.save_dir = d;
  c1.exit_interval = 4;
  RunOut first = train(c1, w);
  ASSERT_EQ(first.losses.size(), 4u);
  EXPECT_TRUE(fs::exists(d + "/iter_0000004.h5"));
  auto c2 = tiny(8);
  c2.save_dir = d;
  c2.load_path = d;
  RunOut second = train(c2, w);
  EXPECT_EQ(second.loaded, d + "/iter_0000004.h5");
  ASSERT_EQ(second.losses.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(first.losses[i], straight.losses[i]) << "iteration " << i + 1;
    EXPECT_EQ(second.losses[i], straight.losses[4 + i]) << "iteration " << 5 + i;
  }
  ASSERT_EQ(second.params.size(), straight.params.size());
  EXPECT_EQ(std::memcmp(second.params.data(), straight.params.data(), straight.params.size() * 4), 0)
      << "final weights differ after resume";
  // The final save at iteration 8 and `latest` pointing at it.
  std::ifstream latest(d + "/latest");
  std::string name;
  std::getline(latest, name);
  EXPECT_EQ(name, "iter_0000008.h5");
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

TEST(Checkpoint, ExactResumeIsBitwise) { check_exact_resume("exact", 0.0); }

// --rampup-batch-size 6 6 12 to a global batch of 12 (batches 6, 6, 12, 12, ...), 84 samples = 8
// iterations: 2 steps, save, resume inside the ramp, 6 more == 8 straight, bitwise; and a resume
// under a ramp that would have consumed other samples by then is refused naming the flag.
TEST(Checkpoint, ExactResumeInsideABatchRamp) {
  const auto& w = world();
  std::string d = shared_dir(w, "ramp");
  auto ramped = [](long long start) {
    auto c = tiny(0);
    c.global_batch = 12;
    c.train_iters = 0;
    c.train_samples = 84;
    c.lr_decay_iters = 0;
    c.lr_warmup_iters = 0;
    c.lr_warmup_samples = 12;
    c.rampup = {start, 6, 12};
    return c;
  };
  RunOut straight = train(ramped(6), w);
  ASSERT_EQ(straight.losses.size(), 8u);
  auto c1 = ramped(6);
  c1.save_dir = d;
  c1.exit_interval = 2;
  RunOut first = train(c1, w);
  ASSERT_EQ(first.losses.size(), 2u);
  auto c2 = ramped(6);
  c2.load_path = d;
  RunOut second = train(c2, w);
  ASSERT_EQ(second.losses.size(), 6u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(first.losses[i], straight.losses[i]) << "iteration " << i + 1;
  for (int i = 0; i < 6; ++i) EXPECT_EQ(second.losses[i], straight.losses[2 + i]) << "iteration " << 3 + i;
  EXPECT_EQ(std::memcmp(second.params.data(), straight.params.data(), straight.params.size() * 4), 0)
      << "final weights differ after resuming inside the ramp";
  auto other = ramped(6);  // ramped over 3 samples: batches 6, 12, ...: 18 samples before iteration 3, not 12
  other.rampup.samples = 3;
  other.load_path = d;
  const std::string e = error_of([&] { train(other, w); });
  EXPECT_NE(e.find("--rampup-batch-size"), std::string::npos) << e;
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}
TEST(Checkpoint, ExactResumeWithDropoutIsBitwise) { check_exact_resume("exact_dropout", 0.1); }

// --async-save: interval saves are written by a background thread while training goes on. Each
// must hold the state of its own iteration (the copy is taken at the boundary, training then moves
// the weights on): resuming from the iteration-2 and iteration-4 files and training to 6 must
// equal 6 straight iterations bitwise; the final save (6) is synchronous; `latest` names it.
// A background save holds the state of the iteration it was started at. The copy runs beside the
// next forward and backward; the optimizer step waits for it. With the copy held back (test-only
// delay), that step reaches the fence first: without the fence the file would hold a later state.
static void check_async_saves(const char* tag, int copy_delay_ms) {
  const auto& w = world();
  std::string d = shared_dir(w, tag);
  RunOut straight = train(tiny(6), w);
  auto c = tiny(6);
  c.save_dir = d;
  c.save_interval = 2;
  c.async_save = true;
  if (copy_delay_ms > 0) ::setenv("HPCT_TEST_ASYNC_COPY_DELAY_MS", std::to_string(copy_delay_ms).c_str(), 1);
  RunOut run = train(c, w);
  ::unsetenv("HPCT_TEST_ASYNC_COPY_DELAY_MS");
  EXPECT_EQ(std::memcmp(run.params.data(), straight.params.data(), straight.params.size() * 4), 0)
      << "training with background saves differs";
  for (const char* f : {"/iter_0000002.h5", "/iter_0000004.h5", "/iter_0000006.h5"}) EXPECT_TRUE(fs::exists(d + f)) << f;
  std::ifstream latest(d + "/latest");
  std::string name;
  std::getline(latest, name);
  EXPECT_EQ(name, "iter_0000006.h5");
  for (const char* f : {"/iter_0000002.h5", "/iter_0000004.h5"}) {
    auto r = tiny(6);
    r.load_path = d + f;
    RunOut resumed = train(r, w);
    EXPECT_EQ(std::memcmp(resumed.params.data(), straight.params.data(), straight.params.size() * 4), 0)
        << "resumed from " << f << " (written in the background)";
  }
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

TEST(Checkpoint, AsyncSaveHoldsItsIteration) { check_async_saves("async", 0); }
TEST(Checkpoint, AsyncSaveCopyBehindTheNextStep) { check_async_saves("async_late", 300); }

// Rank 0 alone trains and saves with `save`; the whole world loads that checkpoint with `load`
// (its load_path set here) and must hold the same weights, bitwise.
static void saved_alone_loaded_by_world(const comm::Communicator& w, const char* tag, engine::TrainConfig save,
                                        engine::TrainConfig load) {
  std::string d = shared_dir(w, tag);
  RunOut one_saved;
  if (w.rank() == 0) {
    save.save_dir = d;
    one_saved = train(save, comm::Communicator::self());
  }
  w.barrier();
  load.load_path = d;
  RunOut world_loaded = train(load, w);
  if (w.rank() == 0) {
    EXPECT_EQ(std::memcmp(world_loaded.params.data(), one_saved.params.data(), one_saved.params.size() * 4), 0);
  }
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

// Written by the N-rank world, loaded by each rank alone (and the other way round).
TEST(Checkpoint, LoadsOnAnotherRankCount) {
  const auto& w = world();
  const comm::Communicator self = comm::Communicator::self();
  std::string d = shared_dir(w, "universal");
  auto c = tiny(4);
  c.save_dir = d;
  RunOut saved = train(c, w);  // saves iteration 4
  auto cont = tiny(8);
  cont.load_path = d;
  RunOut world_cont = train(cont, w);  // N ranks continue 5..8
  // Each rank alone (1 rank) loads the N-rank checkpoint: same weights, bitwise; then continues.
  auto one = tiny(4);
  one.load_path = d;
  RunOut loaded_alone = train(one, self);  // train_iters 4 = nothing more to do
  EXPECT_EQ(loaded_alone.losses.size(), 0u);
  EXPECT_EQ(std::memcmp(loaded_alone.params.data(), saved.params.data(), saved.params.size() * 4), 0);
  auto one_cont = tiny(8);
  one_cont.load_path = d;
  RunOut alone_cont = train(one_cont, self);
  ASSERT_EQ(alone_cont.losses.size(), world_cont.losses.size());
  for (size_t i = 0; i < alone_cont.losses.size(); ++i)
    EXPECT_NEAR(alone_cont.losses[i], world_cont.losses[i], 1e-5 * std::abs(world_cont.losses[i])) << i;
  // And back: rank 0 alone writes, the N-rank world loads.
  saved_alone_loaded_by_world(w, "universal_one", tiny(3), tiny(3));
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

// Across rank counts and ZeRO stages at once: the N-rank world at stage 3 (every block partitioned)
// saves; each rank alone at stage 1 loads it (bitwise the same weights); rank 0 alone at stage 2
// saves and the world at stage 3 loads it (bitwise).
TEST(Checkpoint, LoadsAcrossRankCountsAndStages) {
  const auto& w = world();
  const comm::Communicator self = comm::Communicator::self();
  std::string d = shared_dir(w, "stages");
  auto c = tiny(3);
  c.zero.stage = 3;
  c.zero.param_persistence_threshold = 0;
  c.save_dir = d;
  RunOut saved = train(c, w);
  auto one = tiny(3);
  one.zero.stage = 1;
  one.load_path = d;
  RunOut alone = train(one, self);
  EXPECT_EQ(std::memcmp(alone.params.data(), saved.params.data(), saved.params.size() * 4), 0);
  auto s1 = tiny(2);
  s1.zero.stage = 2;
  auto lw = tiny(2);
  lw.zero.stage = 3;
  lw.zero.param_persistence_threshold = 0;
  saved_alone_loaded_by_world(w, "stages_one", s1, lw);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

TEST(Checkpoint, KeepLastPrunesOldest) {
  const auto& w = world();
  std::string d = shared_dir(w, "keep");
  auto c = tiny(8);
  c.save_dir = d;
  c.save_interval = 2;
  c.keep_last = 2;
  train(c, w);
  w.barrier();
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(d)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"iter_0000006.h5", "iter_0000008.h5", "latest"}));
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

TEST(Checkpoint, CorruptTruncatedAndForeignAreRefused) {
  const auto& w = world();
  std::string d = shared_dir(w, "refuse");
  auto c = tiny(2);
  c.save_dir = d;
  train(c, w);
  std::string file = d + "/iter_0000002.h5";
  std::string victim = "/model/layers/1/mlp/dense_h_to_4h/weight";
  // Another architecture: hidden 48 instead of 32; the first mismatching tensor is named with both shapes.
  auto other = tiny(2, 48);
  other.load_path = file;
  std::string e1 = error_of([&] { train(other, w); });
  EXPECT_NE(e1.find("/model/embedding/word_embeddings/weight"), std::string::npos) << e1;
  EXPECT_NE(e1.find("[104, 32]"), std::string::npos) << e1;
  EXPECT_NE(e1.find("[104, 48]"), std::string::npos) << e1;
  // Flip bytes inside one tensor's data: the load names that tensor.
  uint64_t off = 0;
  {
    io::H5File f = io::H5File::open(file, io::H5File::Mode::read, w.raw());
    ASSERT_TRUE(f.has_dataset(victim)) << "dataset names changed; update the test";
    off = f.dataset_file_offset(victim);
  }
  std::string copy = d + "/corrupt.h5";
  if (w.rank() == 0) {
    fs::copy_file(file, copy);
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(off + 40));
    char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    f.write(junk, 8);
  }
  w.barrier();
  auto load_corrupt = tiny(2);
  load_corrupt.load_path = copy;
  std::string e2 = error_of([&] { train(load_corrupt, w); });
  EXPECT_NE(e2.find(victim), std::string::npos) << e2;
  EXPECT_NE(e2.find("checksum"), std::string::npos) << e2;
  // A truncated file (a copy cut in half) is refused naming the file.
  std::string cut = d + "/truncated.h5";
  if (w.rank() == 0) {
    fs::copy_file(file, cut);
    fs::resize_file(cut, fs::file_size(cut) / 2);
  }
  w.barrier();
  auto load_cut = tiny(2);
  load_cut.load_path = cut;
  std::string e3 = error_of([&] { train(load_cut, w); });
  EXPECT_NE(e3.find(cut), std::string::npos) << e3;
  // A `latest` naming a missing file.
  if (w.rank() == 0) {
    std::ofstream(d + "/latest") << "iter_0000099.h5\n";
  }
  w.barrier();
  auto load_missing = tiny(2);
  load_missing.load_path = d;
  std::string e4 = error_of([&] { train(load_missing, w); });
  EXPECT_NE(e4.find("iter_0000099.h5"), std::string::npos) << e4;
  w.barrier();
  if (w.rank() == 0) fs::remove_all(d);
}

// A save that runs out of space fails on every rank, removes its partial file, and leaves the
// previous checkpoint and `latest` as they were.
TEST(Checkpoint, FullDiskKeepsPreviousCheckpoint) {
  const auto& w = world();
  std::string d = shared_dir(w, "full");
  int mounted = 0;
  std::string mnt = d + "/tmpfs";
  if (w.rank() == 0) {
    fs::create_directories(mnt);
    // One checkpoint of the tiny model is ~0.5 MB; 800 KiB holds one, not two.
    mounted = ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=800k") == 0 ? 1 : 0;
  }
  HPCT_CHECK_MPI(MPI_Bcast(&mounted, 1, MPI_INT, 0, w.raw()));
  if (!mounted) {
    if (w.rank() == 0) fs::remove_all(d);
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  }
  auto c = tiny(2);
  c.save_dir = mnt;
  train(c, w);  // iteration 2 fits
  auto more = tiny(4);
  more.save_dir = mnt;
  more.load_path = mnt;
  std::string e = error_of([&] { train(more, w); });
  EXPECT_NE(e.find("No space left on device"), std::string::npos) << e;
  w.barrier();
  if (w.rank() == 0) {
    std::ifstream latest(mnt + "/latest");
    std::string name;
    std::getline(latest, name);
    EXPECT_EQ(name, "iter_0000002.h5");
    EXPECT_FALSE(fs::exists(mnt + "/iter_0000004.h5.tmp"));
    EXPECT_FALSE(fs::exists(mnt + "/iter_0000004.h5"));
  }
  w.barrier();
  // The previous checkpoint still loads.
  auto again = tiny(2);
  again.load_path = mnt;
  RunOut r = train(again, w);
  EXPECT_EQ(r.loaded, mnt + "/iter_0000002.h5");
  w.barrier();
  if (w.rank() == 0) {
    ::umount2(mnt.c_str(), MNT_DETACH);
    fs::remove_all(d);
  }
}

int main(int argc, char** argv) {
  comm::Environment env(&argc, &argv);
  kernels::BackendScope backend;
  ::testing::InitGoogleTest(&argc, argv);
  if (world().rank() != 0) ::testing::GTEST_FLAG(output) = "";
  int rc = RUN_ALL_TESTS();
  // Any rank's failure fails the run.
  int all = rc;
  MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return all;
}

// The architecture attribute: max_position_embeddings is the position table (written by every
// writer through architecture_of); a file from before it was recorded names the table seq_length,
// which reads as the same model and passes the resume check against today's attribute.
TEST(Checkpoint, ArchitectureRecordsPositionsAndReadsOlderFiles) {
  model::GptConfig mc;
  mc.max_seq_length = 32;
  mc.max_position_embeddings = 64;
  const nlohmann::json a = engine::architecture_of(mc);
  EXPECT_EQ(a.at("max_position_embeddings"), 64);
  EXPECT_FALSE(a.contains("seq_length"));  // the sequence length is the run's, free on resume
  EXPECT_EQ(engine::gpt_config_of(a, "f.h5").positions(), 64);

  nlohmann::json old = a;
  old.erase("max_position_embeddings");
  old["seq_length"] = 64;
  EXPECT_EQ(engine::gpt_config_of(old, "old.h5").positions(), 64);
  engine::StoredRun r;
  r.meta.architecture = old;
  engine::CheckpointMeta here;
  here.architecture = a;
  EXPECT_NO_THROW(engine::check_compatible(r, here, "old.h5"));
  here.architecture["max_position_embeddings"] = 128;
  try {
    engine::check_compatible(r, here, "old.h5");
    ADD_FAILURE() << "a 64-row table loaded into a 128-row model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings is 64 in the checkpoint"), std::string::npos) << e.what();
  }
}

// Megatron's rule for the learning-rate schedule on resume: the checkpoint's, unless
// --override-opt_param-scheduler; nothing to keep at iteration 0 (an import), for a key the
// checkpoint predates, or for a run that trains nothing (--skip-train).
TEST(Checkpoint, ResumeKeepsTheScheduleUnlessOverridden) {
  engine::StoredRun r;
  r.state.iteration = 5;
  r.meta.architecture = nlohmann::json::object();
  r.meta.tokenizer = "unknown: test";
  r.meta.config = {{"lr", 1e-3}, {"lr_decay_iters", 24}};
  engine::CheckpointMeta here;
  here.architecture = nlohmann::json::object();
  here.config = {{"lr", 1e-3}, {"lr_decay_iters", 30}, {"lr_decay_samples", 0}};
  try {
    engine::check_compatible(r, here, "ck.h5");
    ADD_FAILURE() << "a changed --lr-decay-iters was taken silently";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--lr-decay-iters 30 differs from the checkpoint's 24 (ck.h5)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--override-opt_param-scheduler"), std::string::npos) << e.what();
  }
  here.config["override_opt_param_scheduler"] = true;
  EXPECT_NO_THROW(engine::check_compatible(r, here, "ck.h5"));
  here.config["override_opt_param_scheduler"] = false;
  here.config["skip_train"] = true;  // an evaluation steps no schedule
  EXPECT_NO_THROW(engine::check_compatible(r, here, "ck.h5"));
  here.config["skip_train"] = false;
  r.state.iteration = 0;
  EXPECT_NO_THROW(engine::check_compatible(r, here, "ck.h5"));
  r.state.iteration = 5;
  here.config["lr_decay_iters"] = 24;  // the same schedule; lr_decay_samples is not in the older file
  EXPECT_NO_THROW(engine::check_compatible(r, here, "ck.h5"));
}
