// hpct/kernels/optim.hpp — the optimizer step over a list of state runs, and the reductions the
// step needs (gradient sum of squares, 16-bit copies), on the host.
//
// What it is: the one definition of what an AdamW step does to a run of (fp32 master, gradient,
// exp_avg, exp_avg_sq[, 16-bit copy]) that every ZeRO engine calls, host or device: the host engine
// calls these functions, OpsBackend::adamw() forwards to them on the CPU backend, and the CUDA
// backend's multi-tensor kernel computes the same formulas on device memory. A 16-bit gradient is
// widened tile by tile (kOptimTile elements), so no fp32 copy of a whole gradient is made.
// What it is not: a scheduler: the caller decides which runs (its shard, per-tensor weight decay).
#pragma once
#include <cstddef>
#include <cstdint>

#include "hpct/kernels/precision.hpp"

namespace hpct::kernels {

/// Elements of a widened 16-bit tile in the host update and sums (the partial sums of a 16-bit
/// gradient's sum of squares are taken per tile and added in order).
inline constexpr size_t kOptimTile = 1 << 16;

/// One run of optimizer state: n elements. Exactly one of grad (fp32) and grad16 (16-bit, the
/// step's precision) is set (an empty run may set none). param16, if set, receives the updated master rounded to 16 bits (the
/// copy the model computes with). norms: add this run's p, m and v sums of squares to the step's
/// state norms (tensor-parallel replicas are counted on one rank only).
struct AdamwRun {
  float* param = nullptr;
  const float* grad = nullptr;
  const uint16_t* grad16 = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  uint16_t* param16 = nullptr;
  size_t n = 0;
  float weight_decay = 0;
  bool norms = false;
};

/// The step's scalars: decoupled-weight-decay AdamW (ops.hpp adamw_update), g = grad * grad_scale.
struct AdamwArgs {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  int step = 1;                      // 1-based
  float grad_scale = 1;
  Precision precision = Precision::fp32;  // of grad16 and param16 (bf16 or fp16 where used)
};

/// AdamW on every run, threaded over optimizer_threads() (bitwise the same for any number: the
/// update is element-wise). sums (3 doubles: weights, exp_avg, exp_avg_sq) is added to when given,
/// for runs with norms, in run order. Host memory; needs a BackendScope (ops.hpp).
void adamw_runs(const AdamwRun* runs, size_t count, const AdamwArgs& a, double* sums);

/// Threads of the host optimizer step: n >= 1, or 0 for the default (OMP_NUM_THREADS, else Slurm's
/// SLURM_CPUS_PER_TASK, else the CPUs this process may run on). Process-wide (the trainer sets it
/// from --optimizer-threads).
void set_optimizer_threads(int n);
int optimizer_threads();
/// On the calling thread only: optimizer_threads() is at most n (n >= 1; 0: no cap). For a thread
/// that runs the step beside another that needs a core (parallel::DeviceStore's worker).
void set_optimizer_threads_here(int n);
/// The instruction set the update's loop runs with on this CPU ("AVX-512", "AVX2", "baseline").
const char* optimizer_isa();
/// sum(x^2) of 16-bit values widened to fp32, tile by tile (kOptimTile), accumulated in double.
double sum_of_squares_half(const uint16_t* x, size_t n, Precision p);
/// How many of n values are zero (+0 or -0), as Megatron's --log-num-zeros-in-grad counts: fp32, and
/// 16-bit (bf16 and fp16 alike: every bit but the sign clear).
double count_zeros(const float* x, size_t n);
double count_zeros_half(const uint16_t* x, size_t n);

}  // namespace hpct::kernels
