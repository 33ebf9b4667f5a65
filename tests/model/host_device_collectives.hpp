// A test transport behind comm::DeviceCollectives: MPI on the buffers themselves (host memory, as
// staged_cpu_ops.hpp's "device" memory is), where a run has NCCL on GPU memory. With it the model
// takes its device-collective path on this machine: which buffers, offsets, counts, element types
// and reductions each collective gets, bitwise against the CPU backend's run. It cannot check NCCL
// itself or the stream order on a GPU. fail_at: the call (1-based) that fails, as a dead peer would.
#pragma once
#include <string>

#include "hpct/comm/gpu.hpp"
#include "hpct/comm/mpi.hpp"

namespace hpct::test {

class HostDeviceCollectives final : public comm::DeviceCollectives {
 public:
  explicit HostDeviceCollectives(const comm::Communicator& c, int fail_at = 0) : c_(c), fail_at_(fail_at) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  int calls() const { return calls_; }

  bool allreduce(void* buf, size_t n, Elem e, bool max, double, std::string* why) override {
    if (failed(why)) return false;
    if (e == Elem::f64) {
      if (max) return *why = "no double maximum here", false;
      c_.allreduce_sum(static_cast<double*>(buf), n);
    } else if (max) {
      c_.allreduce_max(static_cast<float*>(buf), n);
    } else {
      c_.allreduce_sum(static_cast<float*>(buf), n);
    }
    return true;
  }
  bool allgather_blocks(float* buf, size_t block, double, std::string* why) override {
    if (failed(why)) return false;
    c_.allgather_blocks(buf, block);
    return true;
  }
  bool reduce_scatter_blocks(const float* full, float* slice, size_t block, double, std::string* why) override {
    if (failed(why)) return false;
    c_.reduce_scatter_blocks(full, slice, block);
    return true;
  }

 private:
  bool failed(std::string* why) {
    if (++calls_ != fail_at_) return false;
    *why = "timeout: a peer did not answer";
    return true;
  }
  const comm::Communicator& c_;
  int fail_at_ = 0, calls_ = 0;
};

}  // namespace hpct::test
