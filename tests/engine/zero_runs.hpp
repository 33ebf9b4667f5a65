// ZeRO runs of the tiny GPT for the engine tests (test_zero.cpp, test_device_store.cpp): one
// training run under a config and what it leaves (losses, parameters, memory, traffic, the 16-bit
// copies' staleness, DeviceStore's copies).
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "hpct/comm/process_grid.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "hpct/io/gpt_dataset.hpp"
#include "hpct/kernels/half.hpp"
#include "../model/staged_cpu_ops.hpp"
#include "tiny_gpt.hpp"

namespace hpct::test::zero_runs {

inline engine::TrainConfig tiny(int stage, int iters) {
  engine::TrainConfig c = test::tiny_gpt(iters, 3, 12);  // 12: divisible by every N in 1..4
  c.zero.stage = stage;
  c.zero.param_persistence_threshold = 0;  // partition every block (the tiny blocks would all persist)
  c.zero.prefetch_bucket_size = 5000;      // about one layer ahead
  return c;
}

struct Result {
  std::vector<double> losses;
  std::vector<float> params;
  engine::Trainer::MemoryReport mem;
  double comm_bytes = 0;
  long long gathers = 0;
  size_t numel = 0;
  size_t held_numel = 0;     // the blocks this rank holds (expert parallelism: not the others' experts)
  size_t stale_copies = -1;  // 16-bit runs: elements the model computes with that are not round(master)
  size_t stale_after_load = -1;  // the same, right after load_checkpoint (16-bit runs that load)
  double param_read_seconds = 0;  // time waiting for parameter slices read from the swap file
  double nvme_bytes = 0;          // read + written by the optimizer's sweeps of the swap file
  double sweep_seconds_behind = 0;  // ... of those sweeps' time, run behind the forward
  size_t store_bytes = 0;         // via_device_store: DeviceStore's parameter and gradient bytes (peak)
  size_t resident_bytes = 0;      // ... the part kept between uses (DeviceStore::resident_bytes)
  double to_device = 0, to_host = 0;  // via_device_store: bytes DeviceStore copied each way
  std::vector<size_t> blocks;     // numel of each block
  int transfers = -1;             // a StagedCpuOps backend: asynchronous transfers it deferred
  int freed_under_transfer = -1;  // ... and device buffers released while a download still read them
  int changed_under_upload = -1;  // ... and uploads whose host source changed while in flight
  long long uploads_in_step = -1;  // via a DeviceStore: uploads it started from the optimizer step
  size_t pinned_bytes = 0;         // ... and the engine's 16-bit bytes it pinned for them
  long long steps_behind = -1;     // ... optimizer steps it ran behind the next forward
  long long uses_behind = -1;      // ... blocks it handed to the model while such a step still ran
  uint64_t regather_order = 0;     // ... StepBehind::regather_order()
  int updates = 0;                 // optimizer steps taken (not skipped for an fp16 overflow)
  std::vector<double> weight_l2;   // per step: the weights' norm where logged (NaN elsewhere)
  std::vector<double> val_losses;  // the evaluations' (c.eval_iters > 0: on the training data)
};

// 16-bit runs: every block as the model sees it (stage 3: gathered, a collective in block order on
// every rank) against the rounding of the fp32 masters; the number of elements that differ.
inline size_t count_stale_copies(engine::Trainer& t, const engine::TrainConfig& c) {
  const auto p = c.precision == engine::PrecisionMode::bf16 ? kernels::Precision::bf16 : kernels::Precision::fp16;
  const std::vector<float> masters = t.gather_params();
  size_t stale = 0;
  std::vector<uint16_t> h;
  std::vector<float> want;
  const auto& blocks = t.model().layout().blocks();
  for (int bi : t.model().held_blocks()) {  // expert parallelism: this rank's experts only
    const auto b = static_cast<size_t>(bi);
    const size_t n = blocks[b].numel;
    h.resize(n);
    want.resize(n);
    kernels::to_half(masters.data() + blocks[b].offset, h.data(), n, p);
    kernels::from_half(h.data(), want.data(), n, p);
    const float* got = t.zero().params((int)b);
    for (size_t i = 0; i < n; ++i) stale += got[i] != want[i];
    t.zero().release((int)b);
  }
  return stale;
}

/// backend: the model's (nullptr: the CPU's); a device backend (host_memory() false) puts
/// ZeRO-Offload's DeviceStore in front of the engine, as a GPU does. update_delay: seconds the
/// store's worker waits per block of an optimizer step run behind the forward
/// (StepBehind::slow_for_tests), so that the forward catches up with it. tp, ep: tensor- and
/// expert-parallel sizes (the rest of the ranks data-parallel).
inline Result train(engine::TrainConfig c, const comm::Communicator& comm,
                    std::unique_ptr<kernels::OpsBackend> backend = nullptr, double update_delay = 0, int tp = 1,
                    int ep = 1) {
  c.model.tensor_parallel = tp;
  c.moe_ep = ep;
  comm::ProcessGrid grid(comm, tp, ep);
  c.finalize(grid.dp().size());
  io::MockGptDataset data(c.model.vocab_size, c.model.max_seq_length, 7);
  auto* staged = dynamic_cast<test::StagedCpuOps*>(backend.get());
  engine::Trainer t(c, grid, std::move(backend));
  if (update_delay > 0 && t.device_store()) t.device_store()->step_behind().slow_for_tests(update_delay);
  t.load_checkpoint();
  Result r;
  const bool half = c.precision != engine::PrecisionMode::fp32;
  if (half && !c.load_path.empty()) r.stale_after_load = count_stale_copies(t, c);
  auto s = t.train(data, c.eval_iters > 0 ? &data : nullptr);
  for (const auto& [at, v] : s.val_losses) r.val_losses.push_back(v);
  const parallel::SwapTraffic tr = t.zero().swap_traffic();  // before gather_params reads slices
  r.param_read_seconds = tr.param_read_seconds;
  r.nvme_bytes = tr.optimizer_bytes;
  r.sweep_seconds_behind = tr.optimizer_seconds_behind;
  for (auto& st : s.steps) r.losses.push_back(st.lm_loss), r.updates += !st.skipped, r.weight_l2.push_back(st.weight_l2);
  r.params = t.gather_params();
  r.mem = t.memory_report();
  r.comm_bytes = t.comm_bytes_per_step();
  r.gathers = t.zero().gathers();
  r.numel = t.model().layout().numel();
  for (int b : t.model().held_blocks()) r.held_numel += t.model().layout().blocks()[static_cast<size_t>(b)].numel;
  if (t.device_store()) {
    r.store_bytes = t.device_store()->device_bytes();
    r.resident_bytes = t.device_store()->resident_bytes();
    r.to_device = t.device_store()->bytes_to_device();
    r.to_host = t.device_store()->bytes_to_host();
    r.uploads_in_step = t.device_store()->uploads_in_step();
    r.pinned_bytes = t.device_store()->pinned_bytes();
    r.steps_behind = t.device_store()->step_behind().steps();
    r.uses_behind = t.device_store()->step_behind().uses_behind();
    r.regather_order = t.device_store()->step_behind().regather_order();
  }
  for (const auto& b : t.model().layout().blocks()) r.blocks.push_back(b.numel);
  if (staged) {
    r.transfers = staged->transfers(), r.freed_under_transfer = staged->freed_under_transfer();
    r.changed_under_upload = staged->changed_under_upload();
  }
  if (half) r.stale_copies = count_stale_copies(t, c);
  return r;
}

inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, (double)std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace hpct::test::zero_runs
