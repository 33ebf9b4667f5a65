// GPU-resident ZeRO (parallel::DeviceEngine) against the host ZeroEngine, on this machine: under
// mpirun with N = 1, 2, 4.
//
// Two backends stand in for the GPU: the CPU backend (TrainConfig::via_device_engine: the engine's
// buffers are host memory, its collectives run on them directly) and StagedCpuOps (the CPU ops
// behind host_memory() == false: the model and the engine take every device path, collectives and
// checkpoint pieces staged through host copies). Both compute as the CPU does, and DeviceEngine
// mirrors ZeroEngine's rounding points, reductions (the same MPI calls and 16-bit operator) and
// update runs, so every comparison here is bitwise: losses, grad norms and final parameters, at
// stages 0-3 (stage 3 with blocks both partitioned and kept whole), fp32/bf16/fp16, one and several micro-steps per step, MoE with expert parallelism
// and tensor parallelism, and resumes from its own checkpoints and from ZeroEngine's. The staged
// backend computes every GEMM from the 16-bit weights the engine hands out (ParamStore::params16,
// stage 3's gathered ones included), so those are checked bitwise too. What this
// cannot check: CUDA's kernels (gpu-labelled tests compare them with the CPU), a host read of
// device memory (StagedCpuOps' memory is the host's).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../model/host_device_collectives.hpp"
#include "../model/staged_cpu_ops.hpp"
#include "hpct/comm/process_grid.hpp"
#include "hpct/core/error.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "mpi_gtest_main.hpp"
#include "tiny_gpt.hpp"

using namespace hpct;
using test::shared_dir;
using test::world;

namespace {

// device_collectives: the staged backend with the data-parallel collectives on its memory through
// a transport (test::HostDeviceCollectives), the path NCCL takes on GPUs of their own.
// device_queued: the same with the transport holding each started reduction until the engine
// joins it, as NCCL runs it on its own stream behind the backward.
enum class Route { host, device_on_cpu, device_staged, device_collectives, device_queued };
const char* route_name(Route r) {
  switch (r) {
    case Route::host: return "host ZeroEngine";
    case Route::device_on_cpu: return "DeviceEngine (CPU backend)";
    case Route::device_staged: return "DeviceEngine (staged)";
    case Route::device_collectives: return "DeviceEngine (staged, device collectives)";
    default: return "DeviceEngine (staged, queued device collectives)";
  }
}
const char* prec_name(engine::PrecisionMode p) {
  return p == engine::PrecisionMode::fp32 ? "fp32" : p == engine::PrecisionMode::bf16 ? "bf16" : "fp16";
}

struct TrainRun {
  std::vector<double> losses, grad_norms;
  std::vector<float> params;  // every tensor whole
  engine::Trainer::MemoryReport mem;
  size_t numel = 0;
  bool device_store = false;
  double staged_to_host = 0;  // StagedCpuOps: bytes copied to the host
  int collective_calls = 0;   // device_collectives: calls the transports took
  size_t held_peak = 0;       // device_queued: the most started reductions a transport held at once
  size_t gather_peak = 0;     // device_queued: the most started all-gathers likewise
  std::string dp_collectives;  // the start line's account of them
  std::vector<double> device_ms;  // the summary's device time per iteration (backends with markers)
  size_t marks_left = 0;          // StagedCpuOps: markers not yet read when training ended
  bool params_in_backend = true;  // StagedCpuOps: every block's parameters, as the model gets them, in its memory
  long long half_operands = 0;    // StagedCpuOps: GEMM inputs that came with a 16-bit form (computed from it)
};

TrainRun train(engine::TrainConfig c, Route route, int tp = 1, int ep = 1, int fail_at = 0) {
  c.model.tensor_parallel = tp;
  c.moe_ep = ep;
  comm::ProcessGrid grid(world(), tp, ep);
  c.via_device_engine = route != Route::host;
  c.finalize(grid.dp().size());
  std::unique_ptr<kernels::OpsBackend> be;
  test::StagedCpuOps* staged = nullptr;
  const bool collectives = route == Route::device_collectives || route == Route::device_queued;
  if (route == Route::device_staged || collectives) {
    auto s = std::make_unique<test::StagedCpuOps>();
    s->prefer_half(true);  // the weights' 16-bit copies the engine hands out (params16) are what the GEMMs read
    staged = s.get();
    be = std::move(s);
  }
  std::vector<test::HostDeviceCollectives*> transports;
  engine::Trainer::DeviceCollectivesFactory dcs;
  if (collectives)
    dcs = [&](const comm::Communicator& g) {
      auto dc = std::make_unique<test::HostDeviceCollectives>(g, fail_at, route == Route::device_queued);
      transports.push_back(dc.get());
      return dc;
    };
  io::MockGptDataset data(c.model.vocab_size, c.model.max_seq_length, 7);
  engine::Trainer t(c, grid, std::move(be), dcs);
  t.load_checkpoint();
  auto s = t.train(data, nullptr);
  TrainRun r;
  for (auto& st : s.steps) r.losses.push_back(st.lm_loss), r.grad_norms.push_back(st.grad_norm);
  r.device_ms = s.device_ms;
  r.params = t.gather_full_params();
  r.mem = t.memory_report();
  r.numel = t.model().layout().numel();
  r.device_store = t.device_store() != nullptr;
  r.dp_collectives = t.dp_collectives();
  for (const auto* dc : transports) r.collective_calls += dc->calls(), r.held_peak = std::max(r.held_peak, dc->held_peak()),
                                 r.gather_peak = std::max(r.gather_peak, dc->gather_peak());
  if (staged) {
    r.staged_to_host = staged->bytes_to_host();
    r.half_operands = staged->half_operands();
    r.marks_left = staged->marks_held();
    auto& store = t.zero();
    for (int blk = 0; blk < static_cast<int>(t.model().layout().blocks().size()); ++blk) {
      if (!store.holds(blk)) continue;
      r.params_in_backend = r.params_in_backend && staged->owns(store.params(blk));
      store.release(blk);
    }
  }
  return r;
}

void expect_same(const TrainRun& got, const TrainRun& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], want.losses[i]) << what << ", step " << i;
    // NaN on an fp16 step skipped for overflow on both routes: compare as bits.
    EXPECT_TRUE(got.grad_norms[i] == want.grad_norms[i] || (std::isnan(got.grad_norms[i]) && std::isnan(want.grad_norms[i])))
        << what << ", grad norm of step " << i << ": " << got.grad_norms[i] << " vs " << want.grad_norms[i];
  }
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < got.params.size(); ++i) differ += got.params[i] != want.params[i];
  EXPECT_EQ(differ, 0u) << what << ": parameters that differ";
}

// At stage 3 the tiny model's layer blocks (about 12.7k elements) are partitioned and gathered,
// while the embedding (about 3.8k) and the final LayerNorm stay whole on every rank: both of the
// engine's stage-3 paths run in one model.
constexpr double kMixedPersistence = 5000;

engine::TrainConfig tiny(int stage, engine::PrecisionMode p, int micro) {
  engine::TrainConfig c = test::tiny_gpt(3, 2, 12);  // 12: divisible by 1, 2, 4
  c.zero.stage = stage;
  c.zero.param_persistence_threshold = kMixedPersistence;
  c.precision = p;
  c.micro_batch = micro;
  c.clip_grad = 1.0;  // the norms are above 1 here: clipping runs, so the norm must agree too
  return c;
}

// Stages 0-3, the three precisions, one micro-step per step and 12/N of them.
TEST(DeviceEngine, EqualsTheHostEngineBitwise) {
  const int n = world().size();
  for (int stage : {0, 1, 2, 3})
    for (auto p : {engine::PrecisionMode::fp32, engine::PrecisionMode::bf16, engine::PrecisionMode::fp16})
      for (int micro : {12 / n, 1}) {
        const auto c = tiny(stage, p, micro);
        const TrainRun ref = train(c, Route::host);
        EXPECT_GT(std::fabs(ref.losses.front() - ref.losses.back()), 1e-4) << "training moved nothing";
        for (Route r : {Route::device_on_cpu, Route::device_staged}) {
          const std::string what = std::string(route_name(r)) + ", " + prec_name(p) + " stage " + std::to_string(stage) +
                                   ", " + std::to_string(n) + " ranks, " + std::to_string(12 / (micro * n)) +
                                   " micro-steps";
          const TrainRun got = train(c, r);
          EXPECT_FALSE(got.device_store) << what << ": the resident engine needs no ZeRO-Offload bridge";
          expect_same(got, ref, what);
          if (r == Route::device_staged && p != engine::PrecisionMode::fp32) {
            EXPECT_GT(got.half_operands, 0) << what << ": the linears were given no 16-bit weights";
          }
        }
      }
}

// fp32 communication of 16-bit gradients (ds_config communication_data_type fp32) takes the other
// reduction branches: fp32 working buffers reduced, then rounded once.
TEST(DeviceEngine, Fp32CommunicationEqualsTheHostEngine) {
  for (int stage : {0, 1, 2, 3})
    for (auto p : {engine::PrecisionMode::bf16, engine::PrecisionMode::fp16}) {
      auto c = tiny(stage, p, 1);
      c.zero.fp32_communication = true;
      const TrainRun ref = train(c, Route::host);
      const TrainRun got = train(c, Route::device_staged);
      expect_same(got, ref, std::string("fp32 communication, ") + prec_name(p) + " stage " + std::to_string(stage));
    }
}

// The layouts with more than one engine or partitioned tensors: MoE with expert parallelism (an
// engine per reducing group) and tensor parallelism (replicas counted once in the norms).
TEST(DeviceEngine, MoeAndTensorParallelLayouts) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "expert and tensor parallelism need 2 ranks";
  for (int stage : {1, 2, 3})
    for (auto p : {engine::PrecisionMode::fp32, engine::PrecisionMode::bf16}) {
      auto c = tiny(stage, p, 1);
      c.model.moe.num_experts = {4};
      c.model.moe.expert_interval = 2;
      c.model.moe.second_expert_sampling = false;
      const std::string tag = std::string(prec_name(p)) + " stage " + std::to_string(stage);
      expect_same(train(c, Route::device_staged, 1, 2), train(c, Route::host, 1, 2), "MoE, EP 2, " + tag);
      auto d = tiny(stage, p, 1);
      expect_same(train(d, Route::device_staged, 2, 1), train(d, Route::host, 2, 1), "TP 2, " + tag);
    }
}

// The model states are the host engine's, byte for byte, in the device's memory: K = 12 bytes of
// fp32 masters and moments per parameter (over N at stages 1-3), 2 + 2 of 16-bit parameters and
// gradients (the gradients over N at stages 2-3, the parameters too at stage 3, here with every
// block partitioned). Nothing goes through ZeRO-Offload's bridge.
TEST(DeviceEngine, MemoryIsTheDevicesAndFollowsTheFormulas) {
  const double N = world().size();
  for (int stage : {0, 1, 2, 3}) {
    auto c = tiny(stage, engine::PrecisionMode::bf16, 1);
    c.zero.param_persistence_threshold = 0;  // stage 3: every block partitioned
    const TrainRun host = train(c, Route::host);
    const TrainRun dev = train(c, Route::device_staged);
    EXPECT_TRUE(dev.mem.states_on_device);
    EXPECT_FALSE(host.mem.states_on_device);
    const double P = double(dev.numel);
    auto within = [](double got, double want) { return got >= want * 0.999 && got <= want * 1.05; };
    EXPECT_TRUE(within(dev.mem.params, stage == 3 ? 2 * P / N : 2 * P)) << "stage " << stage << ": params " << dev.mem.params;
    EXPECT_TRUE(within(dev.mem.grads, stage >= 2 ? 2 * P / N : 2 * P)) << "stage " << stage << ": grads " << dev.mem.grads;
    EXPECT_TRUE(within(dev.mem.optimizer, stage == 0 ? 12 * P : 12 * P / N)) << "stage " << stage;
    EXPECT_EQ(dev.mem.params, host.mem.params) << "stage " << stage;
    EXPECT_EQ(dev.mem.grads, host.mem.grads) << "stage " << stage;
    EXPECT_EQ(dev.mem.grad_shard, host.mem.grad_shard) << "stage " << stage;
    EXPECT_EQ(dev.mem.optimizer, host.mem.optimizer) << "stage " << stage;
    EXPECT_EQ(dev.mem.device_params_grads, 0u) << "no ZeRO-Offload bridge";
    // On one rank nothing but the step's scalars (the loss, the norm) and the checkpoint-free run's
    // final gather_full_params come back: far less than one copy of the parameters per step.
    if (N == 1) {
      EXPECT_LT(dev.staged_to_host, 4 * P * 2) << "stage " << stage << ": bytes read back";
    }
  }
}

// Checkpoints: 2 steps, save, resume for 2 more == 4 straight, bitwise; from the engine's own files
// (synchronous and asynchronous saves) and across engines (host -> device, device -> host).
TEST(DeviceEngine, ResumesBitwise) {
  const std::string dir = shared_dir(world(), "device_engine_ckpt");
  for (int stage : {0, 2, 3})
    for (auto p : {engine::PrecisionMode::fp32, engine::PrecisionMode::bf16}) {
      auto base = tiny(stage, p, 1);
      base.train_iters = 4;
      base.lr_decay_iters = 10;
      const TrainRun straight = train(base, Route::host);
      for (auto [from, to, async] : {std::tuple{Route::device_staged, Route::device_staged, false},
                                      std::tuple{Route::device_staged, Route::device_staged, true},
                                      std::tuple{Route::host, Route::device_staged, false},
                                      std::tuple{Route::device_staged, Route::host, false}}) {
        const std::string what = std::string(prec_name(p)) + " stage " + std::to_string(stage) + ": " +
                                 route_name(from) + " -> " + route_name(to) + (async ? ", async save" : "");
        auto c1 = base;
        c1.save_dir = dir + "/s" + std::to_string(stage) + prec_name(p) + std::to_string(int(from)) +
                      std::to_string(int(to)) + (async ? "a" : "");
        // The asynchronous save is an interval save (every final save, here the exit at 3, is
        // synchronous), resumed from its own file.
        c1.exit_interval = async ? 3 : 2;
        c1.save_interval = async ? 2 : 0;
        c1.async_save = async;
        train(c1, from);
        auto c2 = base;
        c2.load_path = async ? c1.save_dir + "/iter_0000002.h5" : c1.save_dir;
        const TrainRun resumed = train(c2, to);
        ASSERT_EQ(resumed.losses.size(), 2u) << what;
        EXPECT_EQ(resumed.losses[0], straight.losses[2]) << what;
        EXPECT_EQ(resumed.losses[1], straight.losses[3]) << what;
        size_t differ = 0;
        for (size_t i = 0; i < straight.params.size(); ++i) differ += resumed.params[i] != straight.params[i];
        EXPECT_EQ(differ, 0u) << what << ": parameters that differ";
      }
    }
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// f(stage, precision, config, description) for stages 0-3, the three precisions, and one and
// 12/N micro-steps per step.
template <class F>
void for_each_case(F&& f) {
  const int n = world().size();
  for (int stage : {0, 1, 2, 3})
    for (auto p : {engine::PrecisionMode::fp32, engine::PrecisionMode::bf16, engine::PrecisionMode::fp16})
      for (int micro : {12 / n, 1})
        f(stage, p, tiny(stage, p, micro),
          std::string(prec_name(p)) + " stage " + std::to_string(stage) + ", " + std::to_string(n) + " ranks, " +
              std::to_string(12 / (micro * n)) + " micro-steps");
}

// With device collectives (NCCL on GPUs of their own; here a transport on the test backend's
// memory) the gradients and parameters never leave the device: stages 0-3, the three precisions,
// one and several micro-steps, blocks padded to equal slices for the collectives. On 2 ranks every
// sum has two terms, so the bits are the host engine's whatever the reduction's order; on 4 the
// transport's MPI_Reduce_scatter_block may add in another order than the host engine's
// MPI_Ireduce_scatter, so the losses are held to 1e-6 relative (fp32: a few ulps of each gradient
// after 3 steps) and 2e-3 (16-bit: a reordered bf16 sum moves a gradient by its 8-bit mantissa's ulp).
TEST(DeviceEngine, DeviceCollectivesKeepTheStepOnTheDevice) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "collectives need 2 ranks";
  for_each_case([&](int, engine::PrecisionMode p, const engine::TrainConfig& c, const std::string& what) {
    const TrainRun ref = train(c, Route::host);
    const TrainRun staged = train(c, Route::device_staged);
    const TrainRun got = train(c, Route::device_collectives);
    EXPECT_GT(got.collective_calls, 0) << what << ": the transport was never called";
    // Staged through the host, every step copies its gradients out; on the device only the
    // scalars and the final gather_full_params come back.
    EXPECT_LT(got.staged_to_host, staged.staged_to_host / 2) << what;
    EXPECT_LT(got.staged_to_host, 4.0 * got.numel * 2) << what << ": bytes read back";
    if (n == 2) {
      expect_same(got, ref, what);
      return;
    }
    const double tol = p == engine::PrecisionMode::fp32 ? 1e-6 : 2e-3;
    ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
    for (size_t i = 0; i < ref.losses.size(); ++i)
      EXPECT_NEAR(got.losses[i], ref.losses[i], tol * std::fabs(ref.losses[i])) << what << ", step " << i;
  });
}

// overlap_comm: the gradient reductions started as the backward finishes each block and joined
// later (on a GPU they run on NCCL's stream beside the backward); the parameter all-gathers after
// the update started for every whole block and joined when the next forward asks for the block;
// stage 3's partitioned blocks gathered ahead of use along the recorded order (the prefetch). The
// transport runs each one only when the engine joins it, so an engine that read a result before its join, or reused or changed
// a buffer a started reduction still reads, would give other numbers: the same transport's
// blocking calls are the reference, bitwise, on any number of ranks (the same MPI calls on the
// same buffers, later). Stages 0-3, the three precisions, 1 and 12/N micro-steps; fp32
// communication of 16-bit gradients; MoE with expert parallelism. With the default bucket (5e8
// elements) every reduction of a micro-step is in flight before the first is joined; with a bucket
// of one layer's gradient at most two; without overlap_comm one.
TEST(DeviceEngine, QueuedReductionsOverlapTheBackwardAndEqualTheBlockingOnes) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "collectives need 2 ranks";
  for_each_case([&](int stage, engine::PrecisionMode, const engine::TrainConfig& c, const std::string& what) {
    const TrainRun blocking = train(c, Route::device_collectives);
    const TrainRun queued = train(c, Route::device_queued);
    expect_same(queued, blocking, what);
    // Stage 3 prefetches, and keeps the forward's last layer for the backward (gathered right
    // back otherwise): fewer gathers than the blocking route's, which gathers each use.
    if (stage < 3) {
      EXPECT_EQ(queued.collective_calls, blocking.collective_calls) << what;
    } else {
      EXPECT_LT(queued.collective_calls, blocking.collective_calls) << what << ": no block kept for the backward";
    }
    EXPECT_GE(queued.held_peak, 3u) << what << ": the reductions did not overlap the backward";
    // After the update every whole block's all-gather is started before the next forward
    // joins the first (stages 1-2: every block); stage 3 starts the next layers' ahead of use.
    if (stage >= 1) {
      EXPECT_GE(queued.gather_peak, 2u) << what << ": the all-gathers were waited for one by one";
    }
    EXPECT_EQ(blocking.held_peak + blocking.gather_peak, 0u) << what;
  });
  for (auto p : {engine::PrecisionMode::bf16, engine::PrecisionMode::fp16})
    for (int stage : {0, 2}) {
      auto c = tiny(stage, p, 1);
      c.zero.fp32_communication = true;
      expect_same(train(c, Route::device_queued), train(c, Route::device_collectives),
                  std::string("fp32 communication, ") + prec_name(p) + " stage " + std::to_string(stage));
    }
  {
    auto c = tiny(2, engine::PrecisionMode::bf16, 1);
    c.model.moe.num_experts = {4};
    c.model.moe.expert_interval = 2;
    c.model.moe.second_expert_sampling = false;
    expect_same(train(c, Route::device_queued, 1, 2), train(c, Route::device_collectives, 1, 2), "MoE, EP 2, stage 2");
  }
  // Stage 3 with every block partitioned (nothing gathered after the update): the prefetch alone
  // starts gathers ahead of use, within stage3_prefetch_bucket_size (one element: none ahead).
  for (double window : {5e7, 1.0}) {
    auto c = tiny(3, engine::PrecisionMode::bf16, 1);
    c.zero.param_persistence_threshold = 0;
    c.zero.prefetch_bucket_size = window;
    const std::string what = "stage 3, every block partitioned, prefetch window " + std::to_string(window);
    const TrainRun queued = train(c, Route::device_queued);
    expect_same(queued, train(c, Route::device_collectives), what);
    if (window > 1) {
      EXPECT_GE(queued.gather_peak, 2u) << what << ": nothing gathered ahead of use";
    } else {
      EXPECT_EQ(queued.gather_peak, 1u) << what;
    }
  }
  size_t unbounded = 0;
  for (auto [bucket, overlap] : {std::tuple{5e8, true}, std::tuple{13000.0, true}, std::tuple{5e8, false}}) {
    auto c = tiny(2, engine::PrecisionMode::bf16, 1);
    c.zero.reduce_bucket_size = bucket;  // a layer's block is about 12.7k elements
    c.zero.allgather_bucket_size = bucket;
    c.zero.overlap_comm = overlap;
    const std::string what = "bucket " + std::to_string(bucket) + (overlap ? "" : ", overlap_comm false");
    const TrainRun queued = train(c, Route::device_queued);
    expect_same(queued, train(c, Route::device_collectives), what);
    // The start line says what runs beside what.
    EXPECT_NE(queued.dp_collectives.find(overlap ? "the gradient reductions beside the backward"
                                                 : "each gradient reduction finished before the backward"),
              std::string::npos)
        << queued.dp_collectives;
    EXPECT_NE(queued.dp_collectives.find("the parameter all-gathers beside the next forward"), std::string::npos)
        << queued.dp_collectives;
    if (!overlap) {
      EXPECT_EQ(queued.held_peak, 1u) << what;
    } else if (bucket > 1e6) {
      unbounded = queued.held_peak;
      EXPECT_GE(queued.gather_peak, 3u) << what;
    } else {  // a layer in flight, the next one started beside it (and a small block before them)
      EXPECT_GE(queued.held_peak, 2u) << what;
      EXPECT_LE(queued.held_peak, 3u) << what;
      EXPECT_LT(queued.held_peak, unbounded) << what << ": the bucket did not bound the reductions in flight";
      EXPECT_LE(queued.gather_peak, 3u) << what << ": the all-gather bucket did not bound them";
    }
  }
}

// A collective that fails (a dead peer, a timeout) stops the step on every rank with one line
// naming the collective and the rank, instead of waiting; a started one too.
TEST(DeviceEngine, AFailedDeviceCollectiveNamesItselfAndTheRank) {
  if (world().size() < 2) GTEST_SKIP() << "collectives need 2 ranks";
  for (Route r : {Route::device_collectives, Route::device_queued}) {
    try {
      train(tiny(2, engine::PrecisionMode::bf16, 1), r, 1, 1, /*fail_at=*/3);
      FAIL() << route_name(r) << ": the failed collective went unnoticed";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("data-parallel"), std::string::npos) << msg;
      EXPECT_NE(msg.find("rank " + std::to_string(world().rank())), std::string::npos) << msg;
      EXPECT_NE(msg.find("a peer did not answer"), std::string::npos) << msg;
    }
  }
}

// LoRA: the frozen base is held whole where the states live (the device's memory beside this
// engine), the adapters trained by it; bitwise the host store's, at stages 0, 2 and 3.
TEST(DeviceEngine, LoraEqualsTheHostEngine) {
  for (int stage : {0, 2, 3})
    for (auto p : {engine::PrecisionMode::fp32, engine::PrecisionMode::bf16}) {
      auto c = tiny(stage, p, 1);
      c.lr = 1e-2;  // adapters from B = 0 move visibly in a few steps
      c.model.lora.rank = 4;
      c.model.lora.alpha = 8;
      c.model.lora.targets = 0x1F;  // the four linears and the embedding
      c.zero.param_persistence_threshold = 0;  // stage 3: every adapter block gathered
      const std::string what = std::string("LoRA, ") + prec_name(p) + " stage " + std::to_string(stage);
      const TrainRun ref = train(c, Route::host);
      const TrainRun got = train(c, Route::device_staged);
      EXPECT_GT(std::fabs(ref.losses.front() - ref.losses.back()), 1e-4) << what << ": training moved nothing";
      expect_same(got, ref, what);
      EXPECT_TRUE(got.mem.states_on_device) << what;
      EXPECT_TRUE(got.params_in_backend) << what << ": the model would read a block from host memory";
      EXPECT_GT(got.mem.frozen, 0u) << what;
      EXPECT_EQ(got.mem.frozen, ref.mem.frozen) << what;
    }
}

// The device timers: a backend with markers (CUDA events on a GPU; here the staged backend's host
// clock) gives the summary its device time per iteration by phase, the phases adding up to the
// step (idle: the device waiting for the host), every marker read by the end; the CPU backend,
// which has none, gives none.
TEST(DeviceEngine, DeviceTimersComeFromTheBackendsMarkers) {
  auto c = tiny(2, engine::PrecisionMode::bf16, 1);
  c.train_iters = 5;
  c.log_interval = 2;  // markers read at iterations 2, 4 and the last
  const TrainRun host = train(c, Route::host);
  EXPECT_TRUE(host.device_ms.empty());
  const TrainRun dev = train(c, Route::device_staged);
  ASSERT_EQ(dev.device_ms.size(), 5u) << "forward, backward, optimizer, idle, step";
  const double fwd = dev.device_ms[0], bwd = dev.device_ms[1], opt = dev.device_ms[2], idle = dev.device_ms[3],
               step = dev.device_ms[4];
  EXPECT_GT(fwd, 0);
  EXPECT_GT(bwd, 0);
  EXPECT_GT(opt, 0);
  EXPECT_GE(idle, 0);
  EXPECT_NEAR(fwd + bwd + opt + idle, step, 1e-9 + 1e-9 * step);
  EXPECT_EQ(dev.marks_left, 0u) << "markers left unread after the run";
}

// Offloading is the host engine's: the resident engine refuses it by the ds_config key.
TEST(DeviceEngine, OffloadIsRefusedWithItsKey) {
  auto c = tiny(2, engine::PrecisionMode::bf16, 1);
  c.zero.offload_optimizer.device = "cpu";
  try {
    train(c, Route::device_staged);
    FAIL() << "offload_optimizer on the device-resident engine should be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("offload_optimizer.device"), std::string::npos) << msg;
  }
}

// A run that asks for the fused attention kernel (--attention-kernel fused, --use-flash-attn) on a
// device backend that cannot serve it stops at the start, naming the flag and the backend's
// reason (here the CPU ops' materialised kernel); auto trains on the materialised kernel.
TEST(DeviceEngine, FusedAttentionAskedWhereItCannotServeStops) {
  auto c = tiny(1, engine::PrecisionMode::bf16, 1);
  c.train_iters = 1;
  c.attention_kernel = "fused", c.attention_kernel_flag = "--use-flash-attn";
  try {
    train(c, Route::device_staged);
    FAIL() << "--use-flash-attn without a fused kernel should stop the run";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the fused attention kernel (--use-flash-attn) cannot serve this run: materialised softmax"),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("(key: --use-flash-attn)"), std::string::npos) << msg;
  }
  c.attention_kernel = "auto";
  EXPECT_EQ(train(c, Route::device_staged).losses.size(), 1u);
}

// The pre-flight memory check (engine/config/preflight.hpp): a GPU without room for the run's
// states and one micro-batch's activations stops it on every rank before the engines allocate, with
// the figures and what to change; the same run with room trains. StagedCpuOps reports the device
// memory; GPU-resident (via_device_engine) and ZeRO-Offload (the staged backend without it) each.
TEST(DeviceEngine, AGpuWithoutRoomIsRefusedBeforeTheFirstStep) {
  for (bool resident : {true, false}) {
    auto c = tiny(2, engine::PrecisionMode::bf16, 1);
    c.train_iters = 1;
    c.via_device_engine = resident;
    comm::ProcessGrid grid(world(), 1, 1);
    c.finalize(grid.dp().size());
    io::MockGptDataset data(c.model.vocab_size, c.model.max_seq_length, 7);
    const char* route = resident ? "GPU-resident" : "ZeRO-Offload";
    for (size_t free_b : {size_t(4096), size_t(64) << 30}) {
      auto be = std::make_unique<test::StagedCpuOps>();
      be->set_device_memory(free_b, size_t(80) << 30);
      if (free_b > 4096) {
        engine::Trainer t(c, grid, std::move(be));
        EXPECT_EQ(t.train(data, nullptr).steps.size(), 1u) << route;
        continue;
      }
      try {
        engine::Trainer t(c, grid, std::move(be));
        ADD_FAILURE() << route << ": 4 KiB of free GPU memory should stop the run";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("this run needs at least"), std::string::npos) << msg;
        EXPECT_NE(msg.find("of GPU memory on staged-cpu"), std::string::npos) << msg;
        EXPECT_NE(msg.find("the activations of one micro-batch of 1 x"), std::string::npos) << msg;
        EXPECT_NE(msg.find(resident ? "GPU-resident ZeRO stage 2 states" : "ZeRO-Offload's 16-bit parameters"),
                  std::string::npos) << msg;
        EXPECT_NE(msg.find(resident ? "offload_optimizer.device cpu" : "--recompute-activations"), std::string::npos) << msg;
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
