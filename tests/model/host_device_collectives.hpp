// A test transport behind comm::DeviceCollectives: MPI on the buffers themselves (host memory, as
// staged_cpu_ops.hpp's "device" memory is), where a run has NCCL on GPU memory. With it the model
// takes its device-collective path on this machine: which buffers, offsets, counts, element types
// and reductions each collective gets, bitwise against the CPU backend's run (16-bit sums with
// NCCL's rule: each pair added in fp32 and rounded). It cannot check NCCL
// itself or the stream order on a GPU. fail_at: the call (1-based) that fails, as a dead peer would.
// queued: start_* keep the collective and run it only when join() reaches it or finish() (or a
// blocking call, which on NCCL's stream would come after it) is called, as NCCL runs it behind the
// caller's queue: a caller that reads the result before joining it, or changes or reuses the input
// before, gets other numbers.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>

#include "hpct/comm/gpu.hpp"
#include "hpct/comm/mpi.hpp"
#include "hpct/kernels/half.hpp"

namespace hpct::test {

class HostDeviceCollectives final : public comm::DeviceCollectives {
 public:
  explicit HostDeviceCollectives(const comm::Communicator& c, int fail_at = 0, bool queued = false)
      : c_(c), fail_at_(fail_at), queued_(queued) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  int calls() const { return calls_; }
  /// The most started reductions, and all-gathers, held at once (queued).
  size_t held_peak() const { return held_peak_; }
  size_t gather_peak() const { return gather_peak_; }

  bool queues() const override { return queued_; }
  bool start_reduce_scatter_blocks(const void* full, void* slice, size_t block, Elem e, void* q, double d, Ticket* t,
                                   std::string* why) override {
    if (!queued_) return DeviceCollectives::start_reduce_scatter_blocks(full, slice, block, e, q, d, t, why);
    if (failed(why)) return false;
    return hold([=, this] { MPI_Reduce_scatter_block(full, slice, static_cast<int>(block), type(e), sum(e), c_.raw()); }, t);
  }
  bool start_allreduce(void* buf, size_t n, Elem e, void* q, double d, Ticket* t, std::string* why) override {
    if (!queued_) return DeviceCollectives::start_allreduce(buf, n, e, q, d, t, why);
    if (failed(why)) return false;
    return hold([=, this] {  // the blocking call's sums
      if (e == Elem::f32) c_.allreduce_sum(static_cast<float*>(buf), n);
      else if (e == Elem::f64) c_.allreduce_sum(static_cast<double*>(buf), n);
      else MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_UINT16_T, sum(e), c_.raw());
    }, t);
  }
  bool start_allgather_blocks(void* buf, size_t block, Elem e, void* q, double d, Ticket* t, std::string* why) override {
    if (!queued_) return DeviceCollectives::start_allgather_blocks(buf, block, e, q, d, t, why);
    if (failed(why)) return false;
    ++gathers_;
    return hold([=, this] {
      --gathers_;
      const MPI_Datatype ty = type(e);
      MPI_Allgather(MPI_IN_PLACE, 0, ty, buf, static_cast<int>(block), ty, c_.raw());
    }, t);
  }
  void join(Ticket t, void*) override {
    while (!held_.empty() && held_.front().first <= t) run_front();
  }
  bool finish(double, std::string*) override {
    flush();
    return true;
  }

  bool allreduce(void* buf, size_t n, Elem e, bool max, double, std::string* why) override {
    flush();
    if (failed(why)) return false;
    if (e == Elem::bf16 || e == Elem::f16) {
      if (max) return *why = "no 16-bit maximum here", false;
      MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_UINT16_T, sum(e), c_.raw());
    } else if (e == Elem::f64) {
      if (max) return *why = "no double maximum here", false;
      c_.allreduce_sum(static_cast<double*>(buf), n);
    } else if (max) {
      c_.allreduce_max(static_cast<float*>(buf), n);
    } else {
      c_.allreduce_sum(static_cast<float*>(buf), n);
    }
    return true;
  }
  bool allgather_blocks(void* buf, size_t block, Elem e, double, std::string* why) override {
    flush();
    if (failed(why)) return false;
    const MPI_Datatype t = type(e);
    MPI_Allgather(MPI_IN_PLACE, 0, t, buf, static_cast<int>(block), t, c_.raw());
    return true;
  }
  bool reduce_scatter_blocks(const void* full, void* slice, size_t block, Elem e, double, std::string* why) override {
    flush();
    if (failed(why)) return false;
    MPI_Reduce_scatter_block(full, slice, static_cast<int>(block), type(e), sum(e), c_.raw());
    return true;
  }
  ~HostDeviceCollectives() override {
    for (MPI_Op* op : {&sum_bf16_, &sum_f16_})
      if (*op != MPI_OP_NULL) MPI_Op_free(op);
  }

 private:
  static MPI_Datatype type(Elem e) {
    return e == Elem::f64 ? MPI_DOUBLE : e == Elem::f32 ? MPI_FLOAT : MPI_UINT16_T;
  }
  // 16-bit sums as NCCL's and the host engine's: each pair added in fp32 and rounded.
  template <kernels::Precision P>
  static void add16(void* in, void* inout, int* len, MPI_Datatype*) {
    kernels::add_half(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), static_cast<size_t>(*len), P);
  }
  MPI_Op sum(Elem e) {
    if (e == Elem::f32 || e == Elem::f64) return MPI_SUM;
    MPI_Op& op = e == Elem::bf16 ? sum_bf16_ : sum_f16_;
    if (op == MPI_OP_NULL)
      MPI_Op_create(e == Elem::bf16 ? &add16<kernels::Precision::bf16> : &add16<kernels::Precision::fp16>, 1, &op);
    return op;
  }
  bool hold(std::function<void()> op, Ticket* t) {
    *t = ++tickets_;
    held_.emplace_back(*t, std::move(op));
    held_peak_ = std::max(held_peak_, held_.size() - gathers_);
    gather_peak_ = std::max(gather_peak_, gathers_);
    return true;
  }
  void run_front() {
    auto op = std::move(held_.front().second);
    held_.pop_front();
    op();
  }
  void flush() {
    while (!held_.empty()) run_front();
  }
  bool failed(std::string* why) {
    if (++calls_ != fail_at_) return false;
    *why = "timeout: a peer did not answer";
    return true;
  }
  const comm::Communicator& c_;
  int fail_at_ = 0, calls_ = 0;
  bool queued_ = false;
  std::deque<std::pair<Ticket, std::function<void()>>> held_;
  Ticket tickets_ = 0;
  size_t held_peak_ = 0, gather_peak_ = 0, gathers_ = 0;
  MPI_Op sum_bf16_ = MPI_OP_NULL, sum_f16_ = MPI_OP_NULL;
};

}  // namespace hpct::test
